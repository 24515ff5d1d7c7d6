"""Logprobs of generated tokens: the device buffers a step writes them to, and the host's
`Logprob` dicts made from what comes back.

A step whose rows ask for logprobs (`SamplingParams.logprobs`) runs `compute_logprobs` after
the draw, on the raw logits: before the penalties and min-p change them, the runner copies
the logits to `raw_logits` when the step also runs those kernels. Each sampled row gets the
sampled token's logprob and rank and up to `MAX_LOGPROBS` top ids and logprobs, in buffers
sized for the largest step, so a graph captures the kernel like any other; only a step with
logprobs copies them back to the host, into the pinned area of its turn (two, used in turn
as the sampled tokens' are).
"""

from dataclasses import dataclass

import numpy as np

from tinyvllm.backends.base import Backend
from tinyvllm.engine.sequence import PENDING_TOKEN, Logprob, Sequence
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.sampling_params import MAX_LOGPROBS


@dataclass
class StepLogprobs:
    """What a step's logprobs kernel wrote, on the host: one row per sampled row."""

    sampled_logprobs: np.ndarray  # float32[rows]
    sampled_ranks: np.ndarray  # int32[rows]
    top_ids: np.ndarray  # int32[rows, MAX_LOGPROBS]
    top_logprobs: np.ndarray  # float32[rows, MAX_LOGPROBS]

    def arrays(self) -> tuple[np.ndarray, ...]:
        """The four arrays, in field order."""
        return self.sampled_logprobs, self.sampled_ranks, self.top_ids, self.top_logprobs


class LogprobBuffers:
    """The logprobs kernel's outputs for up to max_rows rows, on the device and twice in
    pinned host memory, and the raw-logits copy of `vocab` columns."""

    def __init__(self, backend: Backend, max_rows: int, vocab: int):
        self.backend = backend
        self.raw_logits = backend.empty((max_rows, vocab), np.float32)
        self.device = self._arrays(backend.empty, max_rows)
        self.host = [self._arrays(backend.pinned_empty, max_rows) for _ in range(2)]

    @staticmethod
    def _arrays(allocate, rows: int) -> StepLogprobs:
        return StepLogprobs(
            allocate((rows,), np.float32),
            allocate((rows,), np.int32),
            allocate((rows, MAX_LOGPROBS), np.int32),
            allocate((rows, MAX_LOGPROBS), np.float32),
        )

    def download(self, turn: int, rows: int) -> StepLogprobs:
        """Queue the copies of the first `rows` rows into the host area of `turn`; the
        arrays returned hold them once the step's event is reached."""
        host, device, download = self.host[turn], self.device, self.backend.download_async
        download(device.sampled_logprobs, host.sampled_logprobs, rows)
        download(device.sampled_ranks, host.sampled_ranks, rows)
        download(device.top_ids.reshape(-1), host.top_ids.reshape(-1), rows * MAX_LOGPROBS)
        download(device.top_logprobs.reshape(-1), host.top_logprobs.reshape(-1), rows * MAX_LOGPROBS)
        return StepLogprobs(
            host.sampled_logprobs[:rows], host.sampled_ranks[:rows], host.top_ids[:rows], host.top_logprobs[:rows]
        )


def logprob_entry(tokenizer: Tokenizer, values: StepLogprobs, row: int, token: int, count: int) -> dict[int, Logprob]:
    """vLLM's dict for one generated token: the sampled token and the `count` most likely
    ones (ranks 1..count, in that order), the sampled one last when it is not among them."""
    top_ids, top_logprobs = values.top_ids[row, :count].tolist(), values.top_logprobs[row, :count].tolist()
    entry = {
        top_id: Logprob(logprob, rank, tokenizer.decode([top_id]))
        for rank, (top_id, logprob) in enumerate(zip(top_ids, top_logprobs), start=1)
    }
    if token not in entry:
        sampled = float(values.sampled_logprobs[row])
        entry[token] = Logprob(sampled, int(values.sampled_ranks[row]), tokenizer.decode([token]))
    return entry


def record_logprobs(
    tokenizer: Tokenizer, sampling: list[Sequence], pending_indices: list[int], values: StepLogprobs
) -> None:
    """Append each sampling sequence's entry for the token the step gave it, once: a
    sequence that got no token (finished or aborted while the step ran) gets none, and the
    length check keeps a token's entry from being added twice."""
    for row, (seq, index) in enumerate(zip(sampling, pending_indices)):
        count = seq.sampling_params.logprobs
        if count is None or index >= len(seq.token_ids) or seq.token_ids[index] == PENDING_TOKEN:
            continue
        if index - seq.num_prompt_tokens != len(seq.output_logprobs):
            continue
        seq.output_logprobs.append(logprob_entry(tokenizer, values, row, seq.token_ids[index], count))
