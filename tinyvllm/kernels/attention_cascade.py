"""Cascade decode attention: a prefix that every sequence shares is scored once for all of them.

When the prefix cache hands many decode sequences the same leading KV blocks (a shared
system prompt), plain decode has each sequence's blocks stream and score that prefix on
their own. Softmax over a key set splits into softmax states over any partition of it
(`attention_common`), so each sequence's keys are cut in two, [0, shared_len) and
[shared_len, context_len), and each part is computed where it is cheapest:

    shared part   one kernel stages each K and V tile of the prefix in shared memory once
                  and scores all S sequences' queries against it, G = Hq / Hkv heads of a
                  KV head at once: S * G query rows, the flash prefill kernel's tiles on
                  tensor cores (`attention_tiles.py`) without its causal mask. The matrix
                  products that plain decode does one query row at a time on the FP32
                  units become mma tiles, and the prefix crosses the bus once per block of
                  sequences, not per sequence.
    own part      the decode kernel in split mode (`attention_decode.py`), each context's
                  range starting at shared_len.

Both write unnormalised states (output slice, max, sum, base 2) in split-K's workspace row
layout, and one merge combines them into the bf16 output with split-K's rule
(`attention_split.merge_states`). The workspace holds the decode kernel's S * Hq *
num_partitions rows first, as split-K lays them out, then S * Hq * shared_partitions rows of
the shared kernel, (sequence, head) major.

Work split of the shared kernel: one block per (KV head, tile of ROWS / G sequences, part of
the prefix). A CUDA graph replays the call with other lengths, so the grid depends on shapes
only; each block cuts the prefix from the length it finds on the device into gridDim.z parts
of whole tiles, and a part past its end returns at once. With S = 256, Hkv = 8 and 32
sequences a block (eight warps, G = 4), 64 blocks a part: `cascade_shared_partitions` cuts the prefix into
enough parts to fill the GPU.
"""

import functools
import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.attention_common import block_shift
from tinyvllm.kernels.attention_decode import WORKSPACE_EXTRA, check_decode, launch_decode, partition_tokens
from tinyvllm.kernels.attention_split import MAX_PARTITIONS, MERGE_BATCH, MERGE_THREADS, merge_states
from tinyvllm.kernels.attention_tiles import (
    block_rows,
    check_head_dim,
    check_p_precision,
    empty_state,
    flash_bounds,
    flash_tiles,
    lane_rows,
    tile_shape,
)
from tinyvllm.kernels.device.bf16 import f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.mma import MMA_K, MMA_N
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid


@cuda.jit(device=True, inline=True)
def store_state(workspace, slot, head_dim, n_tiles, acc, c0, peak, total):
    """A lane's columns of one row's state (accumulators c0, c0 + 1), and its max and sum."""
    t2 = 2 * (cuda.threadIdx.x % 4)
    for n in range(n_tiles):
        workspace[slot, MMA_N * n + t2] = acc[n, c0]
        workspace[slot, MMA_N * n + t2 + 1] = acc[n, c0 + 1]
    if t2 == 0:
        workspace[slot, head_dim] = peak
        workspace[slot, head_dim + 1] = total


@functools.cache
def _shared_prefix_kernel(head_dim, group, threads, keys, rows, p_precision):
    units = rows // group
    dim_tiles = head_dim // MMA_N
    query_words = (head_dim // MMA_K, 4)
    load_query, fold, finish = flash_tiles(head_dim, threads, keys, p_precision)

    @cuda.jit(**flash_bounds(head_dim, threads))
    def shared_prefix(q, k_flat, v_flat, block_tables, shared_len, log2_block_size, first_slot, workspace):
        allow_dependent_launch()
        # Every block waits, even one with nothing to do: the merge, which waits for this
        # grid alone, then also sees the decode kernel's states (launched before it).
        wait_for_prior_grid()
        kv_head = cuda.blockIdx.x
        seq0 = cuda.blockIdx.y * units
        partition = cuda.blockIdx.z
        num_seqs = q.shape[0]
        prefix = shared_len[0]
        length = partition_tokens(prefix, cuda.gridDim.z, keys)
        start = partition * length
        end = min(prefix, start + length)
        if start >= end:
            return  # a part past the prefix's end: the merge reads only parts with keys

        row, seq_a, head_a, seq_b, head_b = lane_rows(seq0, kv_head, group)
        query = cuda.local.array(query_words, np.uint32)
        acc = cuda.local.array((dim_tiles, 4), float32)
        maxes = cuda.local.array(2, float32)
        sums = cuda.local.array(2, float32)
        empty_state(acc, maxes, sums)
        load_query(q[min(seq_a, num_seqs - 1), head_a], q[min(seq_b, num_seqs - 1), head_b], query)
        # The prefix's blocks are the same in every table: the first one names them. No
        # causal mask: every row sees the whole part.
        fold(k_flat, v_flat, block_tables[0], kv_head, start, end, np.uint32(log2_block_size), end - 1, end - 1,
             query, acc, maxes, sums)  # fmt: skip
        sum_a, sum_b = finish(sums)
        num_heads = cuda.gridDim.x * group
        if row < units * group and seq_a < num_seqs:
            slot = first_slot + (seq_a * num_heads + head_a) * cuda.gridDim.z + partition
            store_state(workspace, slot, head_dim, dim_tiles, acc, 0, maxes[0], sum_a)
        if row + 8 < units * group and seq_b < num_seqs:
            slot = first_slot + (seq_b * num_heads + head_b) * cuda.gridDim.z + partition
            store_state(workspace, slot, head_dim, dim_tiles, acc, 2, maxes[1], sum_b)

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
    blocks = -(-num_seqs // (block_rows() // group)) * num_kv_heads
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
    p_precision: str = "bf16x2",
) -> None:
    """Decode attention whose first shared_len[0] tokens are the same blocks in every table.

    shared_len: int32[1] on the device (a graph replays the call with other values), a
    multiple of the block size with block_tables[s, :shared_len // block_size] the same for
    every real sequence s; the prefix is read through block_tables[0], so sequence 0 is a
    real one whenever shared_len > 0. 0 gives plain split decode. A context no longer than
    the prefix (a padding row) attends to the prefix alone. num_partitions: parts of each
    sequence's own range [shared_len, context_len); shared_partitions: parts of the prefix
    (`cascade_shared_partitions`). workspace: float32[rows, D + 2] with rows at least
    `cascade_workspace_rows`. p_precision: how the shared kernel's P V takes the probabilities
    (`prefill_attention`'s). Other arguments as in `paged_decode_attention`.
    """
    num_seqs, num_heads, num_kv_heads, head_dim, block_size, _ = check_decode(
        q, k_cache, v_cache, block_tables, context_lens, out
    )
    check_array("shared_len", shared_len, np.int32, (1,))
    check_head_dim(head_dim)
    check_p_precision(p_precision)
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
    threads, keys = tile_shape(head_dim, p_precision)
    rows = block_rows()
    kernel = _shared_prefix_kernel(head_dim, group, threads, keys, rows, p_precision)
    grid = (num_kv_heads, -(-num_seqs // (rows // group)), shared_partitions)
    k_flat, v_flat = k_cache.reshape(-1), v_cache.reshape(-1)
    first_slot = num_seqs * num_heads * num_partitions
    shift = block_shift(block_size)
    kernel_args = (q, k_flat, v_flat, block_tables, shared_len, shift, first_slot, workspace)
    launch_kernel(kernel, grid, threads, stream, *kernel_args)
    merge_args = (workspace, context_lens, shared_len, num_partitions, step, shared_partitions, keys, out)
    launch_kernel(_merge_cascade_kernel, (num_heads, num_seqs), min(MERGE_THREADS, head_dim), stream, *merge_args)
