"""One engine step's metadata: built on the host with NumPy, uploaded into persistent
device buffers.

For a batch whose decode sequences come first, `build_step` makes the flat arrays the
kernels read: token ids and positions of every computed token, the cache slot each
token's K/V goes to, each sequence's block table and context length, the prefill query
offsets, which rows sample, and the sampling parameters of those rows. `StepBuffers`
holds a device buffer of each, sized for the largest step, so a step allocates nothing
and a captured CUDA graph finds its inputs where it left them.

The engine runs a step ahead: it builds and launches step n before step n-1's sampled
tokens are back on the host. A sequence sampled in step n-1 then has a placeholder
(`PENDING_TOKEN`) as its last token, and its decode row in step n names where the GPU
keeps the real one instead: `token_sources[t]`, the row of step n-1's sampled tokens
(the runner copies it in on the device before the embedding, `feed_sampled_tokens`).
"""

from collections.abc import Callable
from itertools import chain

import numpy as np

from tinyvllm.backends.base import Backend
from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.sequence import PENDING_TOKEN, TOKEN_BYTES, Sequence
from tinyvllm.model.step_fields import STEP_FIELDS, StepInputs, step_class

_PENALTY_FIELDS = ("presence_penalty", "frequency_penalty", "repetition_penalty", "penalty_slots", "mask_stop_tokens")

HostStep = step_class(
    "HostStep",
    __name__,
    """One step's metadata on the host: a NumPy array per `STEP_FIELDS` entry, and how many
    of its sequences decode. `StepInputs` holds the same on the device.""",
    np.ndarray,
    ("num_decode",),
)


def empty_step(max_blocks_per_seq: int) -> HostStep:
    """A step of no sequences. Padded up to a graph bucket, every row of it is a padding
    row: the template the decode graphs are captured from."""
    return HostStep(*[np.zeros(field.extent.shape(0, 0, max_blocks_per_seq), field.dtype) for field in STEP_FIELDS], 0)


# --8<-- [start:build-step]
def build_step(
    batch: ScheduledBatch,
    block_size: int,
    max_blocks_per_seq: int,
    penalty_slots: np.ndarray | None = None,
    reads_shared_prefix: Callable[[int, int], bool] | None = None,
) -> HostStep:
    """NumPy metadata for a batch whose decode sequences come first.

    penalty_slots: the token-state slot of each sampling sequence (`token_slots.py`, -1:
    none); None: no sequence reads one, and the penalty fields hold their neutral pads.
    reads_shared_prefix(num_decode, shared_tokens): whether decode attention should read
    the decode sequences' shared prefix once for all of them (the backend's
    `decode_reads_shared_prefix`, never yes to fewer shared tokens where it is no to more);
    None: never, and `shared_prefix_len` is 0.

    Each scheduled sequence computes tokens [start, start + n) of its token list, where
    start = num_computed_tokens; the last of them samples if the batch says so. A decode
    token still pending on the GPU comes from row `pending_sample_row` of the previous
    step's sampled tokens.
    """
    seqs, counts = batch.seqs, batch.num_scheduled_tokens.astype(np.int64)
    starts = np.fromiter((seq.num_computed_tokens for seq in seqs), np.int64, len(seqs))
    ends = starts + counts
    row_ends = np.cumsum(counts)
    positions = np.arange(int(row_ends[-1]), dtype=np.int64) - np.repeat(row_ends - counts - starts, counts)
    token_ids = _scheduled_token_ids(seqs, batch.num_decodes, starts.tolist(), ends.tolist())
    token_sources = np.full(token_ids.shape[0], -1, dtype=np.int32)
    decoding = seqs[: batch.num_decodes]
    token_sources[: batch.num_decodes] = np.fromiter(
        (seq.pending_sample_row if seq.token_ids[-1] == PENDING_TOKEN else -1 for seq in decoding),
        np.int32,
        len(decoding),
    )
    table_lens = np.fromiter((len(seq.block_table) for seq in seqs), np.int64, len(seqs))
    flat_tables = np.fromiter(chain.from_iterable(seq.block_table for seq in seqs), np.int32, int(table_lens.sum()))
    table_rows = np.repeat(np.arange(len(seqs)), table_lens)
    table_cols = np.arange(flat_tables.shape[0]) - np.repeat(np.cumsum(table_lens) - table_lens, table_lens)
    block_tables = np.zeros((len(seqs), max_blocks_per_seq), dtype=np.int32)
    block_tables[table_rows, table_cols] = flat_tables
    seq_of_row = np.repeat(np.arange(len(seqs)), counts)
    slot_mapping = block_tables[seq_of_row, positions // block_size] * block_size + positions % block_size
    shared = 0
    decodes = slice(0, batch.num_decodes)
    # asked first with the most the decodes could share: a batch too small for cascade
    # attention at any length skips the test of its block tables
    if (
        reads_shared_prefix is not None
        and batch.num_decodes > 1
        and reads_shared_prefix(batch.num_decodes, int(ends[decodes].min()) - 1)
    ):
        shared = shared_prefix_tokens(block_tables[decodes], ends[decodes], block_size)
        if shared and not reads_shared_prefix(batch.num_decodes, shared):
            shared = 0
    sampling = batch.sampling_seqs
    params = [seq.sampling_params for seq in sampling]
    return HostStep(
        token_ids=token_ids,
        token_sources=token_sources,
        positions=positions.astype(np.int32),
        slot_mapping=slot_mapping.astype(np.int32),
        block_tables=block_tables,
        context_lens=ends.astype(np.int32),
        prefill_cu_seqlens=np.concatenate([[0], np.cumsum(counts[batch.num_decodes :])]).astype(np.int32),
        shared_prefix_len=np.array([shared], dtype=np.int32),
        sample_rows=(row_ends - 1)[batch.samples].astype(np.int32),
        temperature=np.array([0.0 if p.greedy else p.temperature for p in params], dtype=np.float32),
        top_k=np.array([p.top_k for p in params], dtype=np.int32),
        top_p=np.array([p.top_p for p in params], dtype=np.float32),
        min_p=np.array([p.min_p for p in params], dtype=np.float32),
        num_logprobs=np.array([-1 if p.logprobs is None else p.logprobs for p in params], dtype=np.int32),
        seeds=np.array([seq.seed for seq in sampling], dtype=np.uint64),
        sample_positions=np.array([seq.num_tokens for seq in sampling], dtype=np.int64),
        **_penalty_fields(sampling, penalty_slots),
        num_decode=batch.num_decodes,
    )


# --8<-- [end:build-step]


def shared_prefix_tokens(block_tables: np.ndarray, context_lens: np.ndarray, block_size: int) -> int:
    """The leading tokens that every row of block_tables holds in the same KV blocks (the
    prefix cache gave them the same blocks): whole blocks, all before each row's last token,
    whose block is the row's own."""
    blocks = int(context_lens.min() - 1) // block_size
    if blocks == 0 or not (block_tables[1:, 0] == block_tables[0, 0]).all():
        return 0  # most steps share nothing, and the first column says so at a fraction of the cost
    same = (block_tables[1:, :blocks] == block_tables[0, :blocks]).all(axis=0)
    return (blocks if same.all() else int(np.argmin(same))) * block_size


_PENALTY_PADS = {field.name: (field.pad, field.dtype) for field in STEP_FIELDS if field.name in _PENALTY_FIELDS}


def _penalty_fields(sampling: list, penalty_slots: np.ndarray | None) -> dict[str, np.ndarray]:
    """The penalty fields of the sampled rows: each field's neutral pad, except in the rows
    that read a token-state slot. Most steps have none, and a per-row loop over a large
    batch would cost them host time for nothing."""
    fields = {name: np.full(len(sampling), pad, dtype) for name, (pad, dtype) in _PENALTY_PADS.items()}
    if penalty_slots is not None:
        fields["penalty_slots"] = penalty_slots
        for row in np.flatnonzero(penalty_slots >= 0).tolist():
            seq = sampling[row]
            params = seq.sampling_params
            fields["presence_penalty"][row] = params.presence_penalty
            fields["frequency_penalty"][row] = params.frequency_penalty
            fields["repetition_penalty"][row] = params.repetition_penalty
            fields["mask_stop_tokens"][row] = seq.num_completion_tokens < params.min_tokens
    return fields


class StepBuffers:
    """Persistent buffers for the step metadata, sized for the largest step.

    Every field lives at a fixed offset of a pinned host staging area and of one device
    area with the same layout, so a step's metadata crosses to the GPU in a single copy
    (a copy per field would cost tens of microseconds of Python for each of the `STEP_FIELDS`).
    `block_tables` comes last, and only the rows a step uses are copied. There are two
    staging areas, used in turn: the copy of step n may still be queued behind step n-1
    while the host fills in step n+1. The sampled tokens come back the same way, into
    two pinned areas used in turn, each with the event that marks its copy done.
    """

    ALIGNMENT = 256

    def __init__(self, backend: Backend, limits: ResolvedEngineConfig):
        self.backend = backend
        shapes = {
            field.name: (
                field.extent.shape(limits.max_num_batched_tokens, limits.max_num_seqs, limits.max_blocks_per_seq),
                field.dtype,
            )
            for field in STEP_FIELDS
        }
        offsets, end = {}, 0
        for name in sorted(shapes, key=lambda name: name == "block_tables"):
            offsets[name] = end
            end += -(-_nbytes(*shapes[name]) // self.ALIGNMENT) * self.ALIGNMENT
        self.staging = [backend.pinned_empty((end,), np.uint8) for _ in range(2)]
        self.device = backend.empty((end,), np.uint8)
        # (name, view) pairs in table order: `views` passes them to StepInputs by position.
        self.host_fields = [
            tuple((name, _field(staging, offsets[name], dtype, shape)) for name, (shape, dtype) in shapes.items())
            for staging in self.staging
        ]
        self.device_fields = tuple(
            (name, _field(self.device, offsets[name], dtype, shape)) for name, (shape, dtype) in shapes.items()
        )
        self.block_tables_offset = offsets["block_tables"]
        seqs = limits.max_num_seqs
        self.sampled = backend.empty((seqs,), np.int32)
        self.sampled_host = [backend.pinned_empty((seqs,), np.int32) for _ in range(2)]
        self.sampled_ready = [backend.new_event() for _ in range(2)]
        self.turn = 0

    def stage(self, step: HostStep) -> None:
        """Copy the step's metadata into the leading part of each field, on the device,
        through the staging area whose turn it is."""
        self.turn ^= 1
        for name, host in self.host_fields[self.turn]:
            value = getattr(step, name)
            host[: value.shape[0]] = value
        used = self.block_tables_offset + step.block_tables.nbytes
        self.backend.upload_bytes(self.staging[self.turn], self.device, used)

    def views(self, step: HostStep) -> StepInputs:
        """Device views of the leading part of each field that `step` uses."""
        prefix = self.backend.prefix
        return StepInputs(
            *[prefix(device, getattr(step, name).shape[0]) for name, device in self.device_fields],
            step.token_ids.shape[0],
            step.num_decode,
            step.context_lens.shape[0] - step.num_decode,
            int(step.shared_prefix_len[0]),
        )

    def upload(self, step: HostStep) -> StepInputs:
        """`stage`, then `views`."""
        self.stage(step)
        return self.views(step)


def _nbytes(shape: tuple[int, ...], dtype) -> int:
    return int(np.prod(shape)) * np.dtype(dtype).itemsize


def _field(buffer, offset: int, dtype, shape: tuple[int, ...]):
    """A typed view of bytes [offset, ...) of a uint8 array (NumPy and Numba slice alike)."""
    return buffer[offset : offset + _nbytes(shape, dtype)].view(dtype).reshape(shape)


def _scheduled_token_ids(seqs: list[Sequence], num_decodes: int, starts: list[int], ends: list[int]) -> np.ndarray:
    """The ids of each sequence's tokens start to end, in batch order, as int32: a decode's one
    id by index, a prefill's as a view of its int64 array: iterating an array makes an int
    object per id, which cost a long prompt milliseconds (perf/LOG.md, 2026-12-06)."""
    decodes = zip(seqs, starts[:num_decodes])
    decode_ids = np.fromiter((seq.token_ids[start] for seq, start in decodes), np.int64, num_decodes)
    prefill_ids = [
        np.frombuffer(seq.token_ids, np.int64, end - start, start * TOKEN_BYTES)
        for seq, start, end in zip(seqs[num_decodes:], starts[num_decodes:], ends[num_decodes:])
    ]
    # concatenate copies, so no view outlives this call (an array cannot grow while one does)
    return np.concatenate([decode_ids, *prefill_ids]).astype(np.int32)
