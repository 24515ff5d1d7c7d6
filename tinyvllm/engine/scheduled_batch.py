"""What the scheduler hands the runner for one step: which sequences compute how many tokens."""

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from tinyvllm.engine.sequence import Sequence


@dataclass
class ScheduledBatch:
    """One step's work. Sequence i computes the tokens at positions
    seqs[i].num_computed_tokens .. + num_scheduled_tokens[i] - 1 (its block table already
    covers them) and, when samples[i], samples the next token from the last one's logits.
    The first num_decodes entries are decodes (one token, sampled), the rest prefills or
    prefill chunks, each group in scheduling order."""

    seqs: list[Sequence]
    num_scheduled_tokens: np.ndarray  # int32 [len(seqs)]
    samples: np.ndarray  # bool [len(seqs)]
    num_decodes: int
    pending_indices: list[int] = field(default_factory=list)
    """Set by `launched`: where in its token_ids each sampling sequence holds the placeholder."""

    @property
    def num_tokens(self) -> int:
        return int(self.num_scheduled_tokens.sum())

    @property
    def num_samples(self) -> int:
        return int(self.samples.sum())

    @cached_property
    def sampling_seqs(self) -> list[Sequence]:
        """The sequences that sample, in batch order: the j-th owns row j of the step's samples."""
        return [seq for seq, samples in zip(self.seqs, self.samples.tolist()) if samples]
