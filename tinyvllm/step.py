"""One engine step's metadata: built on the host with NumPy, uploaded into persistent
device buffers.

For a batch whose decode sequences come first, `build_step` makes the flat arrays the
kernels read: token ids and positions of every computed token, the cache slot each
token's K/V goes to, each sequence's block table and context length, the prefill query
offsets, which rows sample, and the sampling parameters of those rows. `StepBuffers`
holds a device buffer of each, sized for the largest step, so a step allocates nothing
and a captured CUDA graph finds its inputs where it left them.
"""

from dataclasses import dataclass

import numpy as np

from tinyvllm.model import StepInputs
from tinyvllm.scheduler import ScheduledBatch


@dataclass(frozen=True)
class RunnerLimits:
    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int

    @property
    def max_blocks_per_seq(self) -> int:
        return -(-self.max_model_len // self.block_size)


@dataclass
class HostStep:
    """One step's metadata on the host; `StepInputs` holds the same on the device."""

    token_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    block_tables: np.ndarray
    context_lens: np.ndarray
    prefill_cu_seqlens: np.ndarray
    sample_rows: np.ndarray
    temperature: np.ndarray
    top_k: np.ndarray
    top_p: np.ndarray
    seeds: np.ndarray
    sample_positions: np.ndarray
    num_decode: int


# --8<-- [start:build-step]
def build_step(batch: ScheduledBatch, block_size: int, max_blocks_per_seq: int) -> HostStep:
    """NumPy metadata for a batch whose decode sequences come first.

    Each scheduled sequence computes tokens [start, start + n) of its token list, where
    start = num_computed_tokens; the last of them samples if the batch says so.
    """
    seqs, counts = batch.seqs, batch.num_scheduled_tokens.astype(np.int64)
    starts = np.array([seq.num_computed_tokens for seq in seqs], dtype=np.int64)
    ends = starts + counts
    row_ends = np.cumsum(counts)
    positions = np.arange(int(row_ends[-1]), dtype=np.int64) - np.repeat(row_ends - counts - starts, counts)
    token_ids = np.concatenate([seq.token_ids[start:end] for seq, start, end in zip(seqs, starts, ends)])
    block_tables = np.zeros((len(seqs), max_blocks_per_seq), dtype=np.int32)
    for row, seq in enumerate(seqs):
        block_tables[row, : len(seq.block_table)] = seq.block_table
    seq_of_row = np.repeat(np.arange(len(seqs)), counts)
    slot_mapping = block_tables[seq_of_row, positions // block_size] * block_size + positions % block_size
    sampling = [seq for seq, samples in zip(seqs, batch.samples) if samples]
    params = [seq.sampling_params for seq in sampling]
    return HostStep(
        token_ids=np.asarray(token_ids, dtype=np.int32),
        positions=positions.astype(np.int32),
        slot_mapping=slot_mapping.astype(np.int32),
        block_tables=block_tables,
        context_lens=ends.astype(np.int32),
        prefill_cu_seqlens=np.concatenate([[0], np.cumsum(counts[batch.num_decodes :])]).astype(np.int32),
        sample_rows=(row_ends - 1)[batch.samples].astype(np.int32),
        temperature=np.array([0.0 if p.greedy else p.temperature for p in params], dtype=np.float32),
        top_k=np.array([p.top_k for p in params], dtype=np.int32),
        top_p=np.array([p.top_p for p in params], dtype=np.float32),
        seeds=np.array([seq.seed for seq in sampling], dtype=np.uint64),
        sample_positions=np.array([seq.num_tokens for seq in sampling], dtype=np.int64),
        num_decode=batch.num_decodes,
    )
# --8<-- [end:build-step]


class StepBuffers:
    """Persistent device buffers for the step metadata, sized for the largest step."""

    def __init__(self, backend, limits: RunnerLimits):
        tokens, seqs = limits.max_num_batched_tokens, limits.max_num_seqs
        self.backend = backend
        self.arrays = {
            "token_ids": backend.empty((tokens,), np.int32),
            "positions": backend.empty((tokens,), np.int32),
            "slot_mapping": backend.empty((tokens,), np.int32),
            "block_tables": backend.empty((seqs, limits.max_blocks_per_seq), np.int32),
            "context_lens": backend.empty((seqs,), np.int32),
            "prefill_cu_seqlens": backend.empty((seqs + 1,), np.int32),
            "sample_rows": backend.empty((seqs,), np.int32),
            "temperature": backend.empty((seqs,), np.float32),
            "top_k": backend.empty((seqs,), np.int32),
            "top_p": backend.empty((seqs,), np.float32),
            "seeds": backend.empty((seqs,), np.uint64),
            "sample_positions": backend.empty((seqs,), np.int64),
        }
        self.sampled = backend.empty((seqs,), np.int32)

    def upload(self, step: HostStep) -> StepInputs:
        """Copy the step's metadata into the leading part of each buffer; return the views."""
        views = {}
        for name, buffer in self.arrays.items():
            host = getattr(step, name)
            views[name] = buffer[: host.shape[0]]
            self.backend.upload(host, views[name])
        return StepInputs(
            **views,
            num_tokens=step.token_ids.shape[0],
            num_decode=step.num_decode,
            num_prefill_seqs=step.context_lens.shape[0] - step.num_decode,
        )
