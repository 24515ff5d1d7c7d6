"""Cascade decode attention: a prefix that every sequence shares is scored once for all of them.

When the prefix cache hands many decode sequences the same leading KV blocks (a shared
system prompt), plain decode has each sequence's blocks stream and score that prefix on
their own. Softmax over a key set splits into softmax states over any partition of it
(`attention_common`), so each sequence's keys are cut in two, [0, shared_len) and
[shared_len, context_len), and each part is computed where it is cheapest:

    shared part   one kernel stages each K and V tile of the prefix in shared memory once
                  and scores all S sequences' queries against it, G = Hq / Hkv heads of a
                  KV head at once: S * G query rows, the flash prefill kernel's shape
                  (`attention_prefill.py`) without its causal mask. A thread keeps
                  ROWS_PER_THREAD query rows, so every float read from shared memory feeds
                  that many multiply-adds: like prefill, the kernel is arithmetic-bound, and
                  the prefix crosses the bus once per block of sequences, not per sequence.
    own part      the decode kernel in split mode (`attention_decode.py`), each context's
                  range starting at shared_len.

Both write unnormalised states (output slice, max, sum, base 2) in split-K's workspace row
layout, and one merge combines them into the bf16 output with split-K's rule
(`attention_split.merge_states`). The workspace holds the decode kernel's S * Hq *
num_partitions rows first, as split-K lays them out, then S * Hq * shared_partitions rows of
the shared kernel, (sequence, head) major.

Work split of the shared kernel: one block per (KV head, tile of `rows` sequences, part of
the prefix). A CUDA graph replays the call with other lengths, so the grid depends on shapes
only; each block cuts the prefix from the length it finds on the device into gridDim.z parts
of whole tiles, and a part past its end returns at once. With S = 256, Hkv = 8 and 32 rows
a block, 64 blocks a part: `cascade_shared_partitions` cuts the prefix into enough parts to
fill the GPU.
"""

import functools
import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels import attention_prefill
from tinyvllm.kernels.attention_common import block_shift
from tinyvllm.kernels.attention_decode import WORKSPACE_EXTRA, check_decode, launch_decode, partition_tokens
from tinyvllm.kernels.attention_prefill import (
    DIMS_PER_THREAD,
    KEYS_PER_STEP,
    ROWS_PER_THREAD,
    prefill_layout,
    tile_attention,
)
from tinyvllm.kernels.attention_split import MAX_PARTITIONS, MERGE_BATCH, MERGE_THREADS, merge_states
from tinyvllm.kernels.device.bf16 import f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid


def _shared_layout(head_dim: int, group: int) -> tuple[int, int, int, int, int]:
    """(dims per lane, lanes per row, threads, sequences per block, keys per tile) of the shared kernel."""
    layout = prefill_layout(head_dim, group, attention_prefill.PREFILL_THREADS, ROWS_PER_THREAD, DIMS_PER_THREAD)
    return *layout, max(KEYS_PER_STEP, attention_prefill.TILE_FLOATS // head_dim)


@functools.cache
def _shared_prefix_kernel(head_dim, group, threads, rows_per_thread, dims_per_thread, keys):
    dims, lanes, threads, rows = prefill_layout(head_dim, group, threads, rows_per_thread, dims_per_thread)
    row_sets = rows // rows_per_thread
    start_row, fold_tiles = tile_attention(head_dim, group, threads, rows_per_thread, dims_per_thread, keys)

    @cuda.jit
    def shared_prefix(q, k_flat, v_flat, block_tables, shared_len, log2_block_size, first_slot, workspace):
        allow_dependent_launch()
        # Every block waits, even one with nothing to do: the merge, which waits for this
        # grid alone, then also sees the decode kernel's states (launched before it).
        wait_for_prior_grid()
        kv_head = cuda.blockIdx.x
        row0 = cuda.blockIdx.y * rows
        partition = cuda.blockIdx.z
        num_seqs = q.shape[0]
        prefix = shared_len[0]
        length = partition_tokens(prefix, cuda.gridDim.z, keys)
        start = partition * length
        end = min(prefix, start + length)
        if start >= end:
            return  # a part past the prefix's end: the merge reads only parts with keys

        lane = cuda.threadIdx.x % lanes
        g = (cuda.threadIdx.x // lanes) % group
        row_set = cuda.threadIdx.x // (lanes * group)
        head = kv_head * group + g
        query = cuda.local.array((rows_per_thread, dims), float32)
        acc = cuda.local.array((rows_per_thread, dims), float32)
        running_max = cuda.local.array(rows_per_thread, float32)
        running_sum = cuda.local.array(rows_per_thread, float32)
        for i in range(rows_per_thread):
            seq = min(row0 + row_set + i * row_sets, num_seqs - 1)
            start_row(q[seq, head], lane, i, query, acc, running_max, running_sum)
        last_key = cuda.local.array(rows_per_thread, np.int64)
        for i in range(rows_per_thread):
            last_key[i] = end - 1  # every row sees the whole part: no causal mask
        # The prefix's blocks are the same in every table: the first one names them.
        fold_tiles(k_flat, v_flat, block_tables[0], kv_head, start, end, np.uint32(log2_block_size), last_key,
                   query, acc, running_max, running_sum, lane)  # fmt: skip

        for i in range(rows_per_thread):
            seq = row0 + row_set + i * row_sets
            if seq < num_seqs:
                slot = first_slot + (seq * cuda.gridDim.x * group + head) * cuda.gridDim.z + partition
                for d in range(dims):
                    workspace[slot, lane * dims + d] = acc[i, d]
                if lane == 0:
                    workspace[slot, head_dim] = running_max[i]
                    workspace[slot, head_dim + 1] = running_sum[i]

    return shared_prefix


@cuda.jit
def _merge_cascade_kernel(workspace, context_lens, shared_len, num_partitions, step, shared_partitions, tile, out):
    """One block per (query head, sequence), one thread per output element: the filled
    partition states of the sequence's own range, then those of the shared prefix, merged.
    Which are filled follows from the lengths, cut as the two kernels cut them: a part past
    a range's end writes nothing (rather than an empty state), so its block returns at once,
    and split-K's merge keeps the same rule."""
    allow_dependent_launch()
    head = cuda.blockIdx.x
    seq = cuda.blockIdx.y
    num_seqs, num_heads, head_dim = out.shape
    pair = seq * num_heads + head
    # The lengths come from the host: read before the wait for the attention kernels (`pdl`).
    prefix = shared_len[0]
    own = context_lens[seq] - min(prefix, context_lens[seq])
    own_filled = 0
    if own > 0:
        own_length = partition_tokens(own, num_partitions, step)
        own_filled = (own + own_length - 1) // own_length
    shared_filled = 0
    if prefix > 0:
        shared_length = partition_tokens(prefix, shared_partitions, tile)
        shared_filled = (prefix + shared_length - 1) // shared_length
    own_first = pair * num_partitions
    shared_first = num_seqs * num_heads * num_partitions + pair * shared_partitions
    wait_for_prior_grid()
    maxes = cuda.local.array(MERGE_BATCH, float32)
    sums = cuda.local.array(MERGE_BATCH, float32)
    values = cuda.local.array(MERGE_BATCH, float32)
    for d in range(cuda.threadIdx.x, head_dim, cuda.blockDim.x):
        peak, weight_sum, total = float32(-math.inf), float32(0.0), float32(0.0)
        for first, filled in ((own_first, own_filled), (shared_first, shared_filled)):
            peak, weight_sum, total = merge_states(
                workspace, first, filled, head_dim, d, peak, weight_sum, total, maxes, sums, values
            )
        out[seq, head, d] = f32_to_bf16(total / weight_sum)


def cascade_workspace_rows(num_seqs: int, num_heads: int, num_partitions: int, shared_partitions: int) -> int:
    """Rows of the float32 [rows, D + WORKSPACE_EXTRA] workspace of `cascade_decode_attention`."""
    return num_seqs * num_heads * (num_partitions + shared_partitions)


def cascade_shared_partitions(num_seqs: int, num_kv_heads: int, group: int, head_dim: int, max_grid: int) -> int:
    """Parts to cut the shared prefix into, so that the shared kernel's blocks fill the GPU:
    as many as keep its grid within max_grid blocks (the decode blocks the GPU holds at once,
    as in backends/variants.py `decode_partitions`), 1 to MAX_PARTITIONS."""
    rows = _shared_layout(head_dim, group)[3]
    blocks = -(-num_seqs // rows) * num_kv_heads
    return max(1, min(MAX_PARTITIONS, max_grid // max(1, blocks)))


def cascade_decode_attention(
    q,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    shared_len,
    out,
    workspace,
    num_partitions: int,
    shared_partitions: int,
    *,
    stream=0,
) -> None:
    """Decode attention whose first shared_len[0] tokens are the same blocks in every table.

    shared_len: int32[1] on the device (a graph replays the call with other values), a
    multiple of the block size with block_tables[s, :shared_len // block_size] the same for
    every real sequence s; the prefix is read through block_tables[0], so sequence 0 is a
    real one whenever shared_len > 0. 0 gives plain split decode. A context no longer than
    the prefix (a padding row) attends to the prefix alone. num_partitions: parts of each
    sequence's own range [shared_len, context_len); shared_partitions: parts of the prefix
    (`cascade_shared_partitions`). workspace: float32[rows, D + 2] with rows at least
    `cascade_workspace_rows`. Other arguments as in `paged_decode_attention`.
    """
    num_seqs, num_heads, num_kv_heads, head_dim, block_size, _ = check_decode(
        q, k_cache, v_cache, block_tables, context_lens, out
    )
    check_array("shared_len", shared_len, np.int32, (1,))
    rows, _ = check_array("workspace", workspace, np.float32, (None, head_dim + WORKSPACE_EXTRA))
    for name, value in (("num_partitions", num_partitions), ("shared_partitions", shared_partitions)):
        if not 1 <= value <= MAX_PARTITIONS:
            raise ValueError(f"{name} must be 1 to {MAX_PARTITIONS}, got {value}")
    needed = cascade_workspace_rows(num_seqs, num_heads, num_partitions, shared_partitions)
    if rows < needed:
        raise ValueError(f"workspace: {rows} rows, needs S * Hq * (num_partitions + shared_partitions) = {needed}")
    if num_seqs == 0:
        return
    # The decode kernel first: every shared block waits for it before it writes (see the kernel).
    step = launch_decode(
        q, k_cache, v_cache, block_tables, context_lens, workspace, num_partitions, True, stream, shared_len
    )
    group = num_heads // num_kv_heads
    *_, threads, seqs_per_block, keys = _shared_layout(head_dim, group)
    kernel = _shared_prefix_kernel(
        head_dim, group, attention_prefill.PREFILL_THREADS, ROWS_PER_THREAD, DIMS_PER_THREAD, keys
    )
    grid = (num_kv_heads, -(-num_seqs // seqs_per_block), shared_partitions)
    k_flat, v_flat = k_cache.reshape(-1), v_cache.reshape(-1)
    first_slot = num_seqs * num_heads * num_partitions
    shift = block_shift(block_size)
    kernel[grid, threads, stream](q, k_flat, v_flat, block_tables, shared_len, shift, first_slot, workspace)
    merge_args = (workspace, context_lens, shared_len, num_partitions, step, shared_partitions, keys, out)
    _merge_cascade_kernel[(num_heads, num_seqs), min(MERGE_THREADS, head_dim), stream](*merge_args)
