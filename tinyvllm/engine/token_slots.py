"""Which row of the device's token state each penalized sequence owns.

A sequence that uses a penalty or min_tokens reads a slot of `token_state[max_num_seqs, V]`
(the packed words of `kernels/token_state.py`). It takes a free slot the first time it
samples, and the host writes the slot's row from the tokens it has: at that first sample,
and again whenever the sequence samples at the end of a prefill (admitted again after a
preemption, when its output so far is recomputed). After that the step's
`count_sampled_tokens` keeps the counts current on the device, so decode steps (replayed
CUDA graphs) need nothing from here but the slot number in their inputs.

A slot is given back once its sequence is no longer running. The step that was in flight
when the host learnt it may still add a count to the slot; the next owner's row is written
behind that step on the same stream, so the stale count never reaches it.
"""

import numpy as np

from tinyvllm.backends.base import Backend
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.sequence import Sequence, SequenceStatus
from tinyvllm.kernels.token_state import token_state_row


class TokenSlots:
    def __init__(self, backend: Backend, max_num_seqs: int, vocab: int, eos_token_ids: tuple[int, ...]):
        self.backend = backend
        self.vocab = vocab
        self.eos_token_ids = list(eos_token_ids)
        self.state = backend.zeros((max_num_seqs, vocab), np.int32)
        self.free = list(range(max_num_seqs - 1, -1, -1))
        self.owners: dict[Sequence, int] = {}

    def assign(self, batch: ScheduledBatch) -> np.ndarray | None:
        """The slot of each sampling sequence of the batch (-1: it reads none), every slot's
        row written where the sequence samples for the first time since its admission;
        None when no sequence of the batch reads one."""
        self._release_stopped()
        if not any(seq.sampling_params.uses_token_state for seq in batch.seqs):
            return None
        slots = []
        for index, (seq, samples) in enumerate(zip(batch.seqs, batch.samples)):
            if not samples:
                continue
            if not seq.sampling_params.uses_token_state:
                slots.append(-1)
                continue
            slot = self.owners.get(seq)
            if slot is None:
                slot = self.owners[seq] = self.free.pop()
                self._write(seq, slot)
            elif index >= batch.num_decodes:
                self._write(seq, slot)
            slots.append(slot)
        return np.array(slots, dtype=np.int32)

    def _write(self, seq: Sequence, slot: int) -> None:
        params = seq.sampling_params
        stop_ids = params.stop_token_ids + ([] if params.ignore_eos else self.eos_token_ids)
        tokens = seq.known_token_ids
        row = token_state_row(self.vocab, tokens[: seq.num_prompt_tokens], tokens[seq.num_prompt_tokens :], stop_ids)
        self.backend.upload_row(row, self.state, slot)

    def _release_stopped(self) -> None:
        for seq in [seq for seq in self.owners if seq.status is not SequenceStatus.RUNNING]:
            self.free.append(self.owners.pop(seq))
