"""Flash-style prefill attention over the paged KV cache (varlen, causal, GQA).

    out[t, h] = softmax(q[t, h] . K_s^T / sqrt(D) + causal mask) V_s

Sequence s owns query rows cu_seqlens_q[s] : cu_seqlens_q[s + 1], its n_s newest tokens.
Their keys and values are already in the cache with the earlier ones, so query row i sits
at position context_lens[s] - n_s + i and sees keys 0 .. that position: plain prefill,
chunked prefill and prefix caching are all the same kernel.

The scores are never stored (FlashAttention): a block walks the keys in tiles, stages
each K and V tile in shared memory as float32, and every thread folds the tile into an
online softmax per query row (`attention_common`). The next tile's loads are issued
before the current tile is used, so they arrive while the block computes.

Work split. A block serves one KV head and one query tile of one sequence, for all G =
Hq / Hkv query heads of that KV head, so a staged tile serves G heads. A thread keeps
ROWS_PER_THREAD query rows of one head, and for each a DIMS_PER_THREAD-wide slice of the
query and of the output accumulator, in registers; the D / DIMS_PER_THREAD lanes holding
the slices of the same rows add their partial dots with shuffles (`lane_group_sum`).
Several rows per thread are what make the kernel arithmetic-bound: each float read from
shared memory feeds ROWS_PER_THREAD multiply-adds (shared memory delivers 32 floats a
cycle per SM, the FP32 units consume 128).

The grid needs no host-side look at cu_seqlens_q. Sequence s gets query tiles
cu_seqlens_q[s] // ROWS + s onwards, which never overlap the next sequence's, so a
block finds its sequence by binary search and T // ROWS + S tiles cover any batch (a few
blocks find no rows and exit). Tiles run last-first: the longest (causal) ones start first.
"""

import functools
import math
from collections.abc import Callable

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.attention_common import (
    LOG2_E,
    block_shift,
    check_paged_cache,
    check_sequences,
    rescale,
)
from tinyvllm.kernels.device.bf16 import f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import LANE_GROUP_WARP, group_scratch_shape, lane_group_sum
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT
from tinyvllm.kernels.device.vector_io import VECTOR, high_half, load_words, low_half

PREFILL_THREADS = 128
ROWS_PER_THREAD = 4
DIMS_PER_THREAD = 16
KEYS_PER_STEP = 2
"""Keys scored together: ROWS_PER_THREAD * KEYS_PER_STEP independent dot products."""
TILE_FLOATS = 2048
"""One staged K (or V) tile: TILE_FLOATS / D keys (32 at D = 64)."""
PAD = 4
"""Floats between lane slices in a tile row, so the lanes' 16-byte reads hit distinct banks."""


def prefill_layout(head_dim: int, group: int, threads: int, rows_per_thread: int, dims_per_thread: int):
    """(dims per lane, lanes per row, threads, query rows per block) for this shape.

    On the GPU the block is whole warps (a shuffle names all 32 lanes), so a group like
    G = 3 gets 96 threads rather than 120.
    """
    dims = min(dims_per_thread, head_dim)
    lanes = head_dim // dims
    step = LANE_GROUP_WARP // math.gcd(LANE_GROUP_WARP, lanes * group)
    row_sets = max(step, threads // (lanes * group) // step * step)
    return dims, lanes, row_sets * lanes * group, row_sets * rows_per_thread


@functools.cache
def tile_io(head_dim: int, threads: int, dims: int, keys: int) -> tuple[tuple[int, int], Callable, Callable]:
    """(fetched_shape, fetch, store): how a block of `threads` stages a K or V tile of `keys`
    keys, split into lane slices of `dims`, in shared memory (the cascade kernel's too)."""
    chunks_per_key = np.uint32(head_dim // VECTOR)
    chunks = keys * (head_dim // VECTOR)
    chunks_per_thread = -(-chunks // threads)
    fetched_shape = (chunks_per_thread, VECTOR // 2)
    # Unsigned index arithmetic: Python's floor division and negative-index wraparound
    # would otherwise cost a dozen 64-bit instructions per cache access.
    vector = np.uint32(VECTOR)
    dims_u = np.uint32(dims)
    head_dim_u = np.uint32(head_dim)

    @cuda.jit(device=True, inline=True)
    def fetch(cache, table, kv_head, tile_start, kv_end, shift, words):
        """words[c] = this thread's c-th 8-value chunk of the tile at tile_start (zeros past kv_end)."""
        row_mask = (np.uint32(1) << shift) - np.uint32(1)
        row_stride = np.uint32(cuda.gridDim.x) * head_dim_u
        block_stride = np.uint64(row_stride) << np.uint64(shift)
        for c in range(chunks_per_thread):
            chunk = np.uint32(cuda.threadIdx.x + c * threads)
            key = chunk // chunks_per_key
            column = chunk % chunks_per_key * vector
            position = np.uint32(tile_start) + key
            if chunk < chunks and position < kv_end:
                offset = np.uint64(table[position >> shift]) * block_stride + np.uint64(
                    (position & row_mask) * row_stride + np.uint32(kv_head) * head_dim_u + column
                )
                loaded = load_words(cache, offset)
                for w in range(VECTOR // 2):
                    words[c, w] = loaded[w]
            else:
                for w in range(VECTOR // 2):
                    words[c, w] = np.uint32(0)

    @cuda.jit(device=True, inline=True)
    def store(words, tile):
        """The fetched chunks, widened to float32, into their places in the shared tile."""
        for c in range(chunks_per_thread):
            chunk = np.uint32(cuda.threadIdx.x + c * threads)
            if chunk < chunks:
                key = chunk // chunks_per_key
                column = chunk % chunks_per_key * vector
                lane = column // dims_u
                first = column % dims_u
                for w in range(VECTOR // 2):
                    tile[key, lane, first + np.uint32(2 * w)] = low_half(words[c, w])
                    tile[key, lane, first + np.uint32(2 * w + 1)] = high_half(words[c, w])

    return fetched_shape, fetch, store


@functools.cache
def tile_attention(head_dim: int, group: int, threads: int, rows_per_thread: int, dims_per_thread: int, keys: int):
    """Flash attention for a block laid out by `prefill_layout`, as two inline device
    functions (the prefill kernel's, and the cascade kernel's over a shared prefix):

        start_row(q_row, lane, i, query, acc, running_max, running_sum)
        fold_tiles(k_flat, v_flat, table, kv_head, start, end, shift, last_key,
                   query, acc, running_max, running_sum, lane)

    start_row loads the thread's query row i and empties its state; fold_tiles folds keys
    [start, end) of the sequence whose block table is `table` into each of the thread's
    query rows' online-softmax states, row i seeing keys up to last_key[i] (the causal
    mask; past it a score is -inf)."""
    dims, lanes, threads, _ = prefill_layout(head_dim, group, threads, rows_per_thread, dims_per_thread)
    chunks_per_lane = dims // VECTOR
    scale = float32(LOG2_E / math.sqrt(head_dim))
    tile_shape = (keys, lanes, dims + PAD)
    fetched_shape, fetch, store = tile_io(head_dim, threads, dims, keys)
    step_scores = rows_per_thread * KEYS_PER_STEP
    scratch_shape = group_scratch_shape(threads, step_scores)

    @cuda.jit(device=True, inline=True)
    def start_row(q_row, lane, i, query, acc, running_max, running_sum):
        """Query row i of the thread: its lane's slice of q_row, scaled, and an empty softmax state."""
        for c in range(chunks_per_lane):
            words = load_words(q_row, lane * dims + c * VECTOR)
            for w in range(VECTOR // 2):
                query[i, c * VECTOR + 2 * w] = low_half(words[w]) * scale
                query[i, c * VECTOR + 2 * w + 1] = high_half(words[w]) * scale
        for d in range(dims):
            acc[i, d] = float32(0.0)
        running_max[i] = -math.inf
        running_sum[i] = float32(0.0)

    @cuda.jit(device=True, inline=True)
    def fold_tiles(
        k_flat, v_flat, table, kv_head, start, end, shift, last_key, query, acc, running_max, running_sum, lane
    ):
        k_tile = cuda.shared.array(tile_shape, float32, alignment=SHARED_ALIGNMENT)
        v_tile = cuda.shared.array(tile_shape, float32, alignment=SHARED_ALIGNMENT)
        scratch = cuda.shared.array(scratch_shape, float32)
        scores = cuda.local.array(step_scores, float32)
        k_words = cuda.local.array(fetched_shape, np.uint32)
        v_words = cuda.local.array(fetched_shape, np.uint32)
        fetch(k_flat, table, kv_head, start, end, shift, k_words)
        fetch(v_flat, table, kv_head, start, end, shift, v_words)
        # --8<-- [start:tile-loop]
        for tile_start in range(start, end, keys):
            cuda.syncthreads()
            store(k_words, k_tile)
            store(v_words, v_tile)
            cuda.syncthreads()
            if tile_start + keys < end:
                fetch(k_flat, table, kv_head, tile_start + keys, end, shift, k_words)
                fetch(v_flat, table, kv_head, tile_start + keys, end, shift, v_words)
            for key in range(0, min(keys, end - tile_start), KEYS_PER_STEP):
                for i in range(rows_per_thread):
                    for j in range(KEYS_PER_STEP):
                        dot = float32(0.0)
                        for d in range(dims):
                            dot += query[i, d] * k_tile[key + j, lane, d]
                        scores[i * KEYS_PER_STEP + j] = dot
                lane_group_sum(scores, lanes, scratch)
                for i in range(rows_per_thread):
                    step_max = running_max[i]
                    for j in range(KEYS_PER_STEP):
                        if tile_start + key + j > last_key[i]:
                            scores[i * KEYS_PER_STEP + j] = -math.inf
                        step_max = max(step_max, scores[i * KEYS_PER_STEP + j])
                    if step_max > running_max[i]:
                        factor = rescale(running_max[i], step_max)
                        running_sum[i] *= factor
                        for d in range(dims):
                            acc[i, d] *= factor
                        running_max[i] = step_max
                    for j in range(KEYS_PER_STEP):
                        weight = math.exp2(scores[i * KEYS_PER_STEP + j] - running_max[i])
                        running_sum[i] += weight
                        for d in range(dims):
                            acc[i, d] += weight * v_tile[key + j, lane, d]
        # --8<-- [end:tile-loop]

    return start_row, fold_tiles


@functools.cache
def _prefill_kernel(head_dim, group, threads, rows_per_thread, dims_per_thread, keys):
    dims, lanes, threads, rows = prefill_layout(head_dim, group, threads, rows_per_thread, dims_per_thread)
    row_sets = rows // rows_per_thread
    start_row, fold_tiles = tile_attention(head_dim, group, threads, rows_per_thread, dims_per_thread, keys)

    @cuda.jit
    def prefill(q, k_flat, v_flat, block_tables, cu_seqlens_q, context_lens, log2_block_size, out):
        allow_dependent_launch()
        wait_for_prior_grid()
        kv_head = cuda.blockIdx.x
        shift = np.uint32(log2_block_size)
        tile_index = cuda.gridDim.y - 1 - cuda.blockIdx.y
        lo = 0
        hi = context_lens.shape[0] - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if cu_seqlens_q[mid] // rows + mid <= tile_index:
                lo = mid
            else:
                hi = mid - 1
        seq = lo
        first_row = cu_seqlens_q[seq]
        num_rows = cu_seqlens_q[seq + 1] - first_row
        row0 = (tile_index - first_row // rows - seq) * rows
        if row0 >= num_rows:
            return
        context = context_lens[seq]
        past = context - num_rows
        kv_end = past + min(row0 + rows, num_rows)

        lane = cuda.threadIdx.x % lanes
        g = (cuda.threadIdx.x // lanes) % group
        row_set = cuda.threadIdx.x // (lanes * group)
        head = kv_head * group + g
        query = cuda.local.array((rows_per_thread, dims), float32)
        acc = cuda.local.array((rows_per_thread, dims), float32)
        running_max = cuda.local.array(rows_per_thread, float32)
        running_sum = cuda.local.array(rows_per_thread, float32)
        position = cuda.local.array(rows_per_thread, np.int64)
        for i in range(rows_per_thread):
            row = min(row0 + row_set + i * row_sets, num_rows - 1)
            position[i] = past + row0 + row_set + i * row_sets
            start_row(q[first_row + row, head], lane, i, query, acc, running_max, running_sum)

        fold_tiles(k_flat, v_flat, block_tables[seq], kv_head, 0, kv_end, shift, position, query, acc, running_max,
                   running_sum, lane)  # fmt: skip

        for i in range(rows_per_thread):
            row = row0 + row_set + i * row_sets
            if row < num_rows:
                inverse = float32(1.0) / running_sum[i]
                for d in range(dims):
                    out[first_row + row, head, lane * dims + d] = f32_to_bf16(acc[i, d] * inverse)

    return prefill


def prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, *, stream=0) -> None:
    """Causal attention of the packed new tokens q over their sequences' cached context.

    q, out: uint16[T, Hq, D]; k_cache, v_cache: uint16[num_blocks, block_size, Hkv, D];
    block_tables: int32[S, max_blocks]; cu_seqlens_q: int32[S + 1], cu[0] = 0, cu[S] <= T;
    context_lens: int32[S] with n_s <= context_lens[s] <= max_blocks * block_size.
    Rows past cu[S] are left as they are.
    """
    num_tokens, num_heads, num_kv_heads, head_dim, block_size = check_paged_cache(q, k_cache, v_cache, out)
    num_seqs, _ = check_sequences(block_tables, context_lens, None)
    check_array("cu_seqlens_q", cu_seqlens_q, np.int32, (num_seqs + 1,))
    layout = (ROWS_PER_THREAD, DIMS_PER_THREAD)
    dims, lanes, threads, rows = prefill_layout(head_dim, num_heads // num_kv_heads, PREFILL_THREADS, *layout)
    if dims * lanes != head_dim or lanes & (lanes - 1) or lanes > 32:
        raise ValueError(f"head_dim {head_dim}: prefill needs D / {dims} to be a power of two up to 32")
    if num_seqs == 0 or num_tokens == 0:
        return
    group = num_heads // num_kv_heads
    keys = max(KEYS_PER_STEP, TILE_FLOATS // head_dim)
    kernel = _prefill_kernel(head_dim, group, PREFILL_THREADS, *layout, keys)
    grid = (num_kv_heads, num_tokens // rows + num_seqs)
    k_flat, v_flat = k_cache.reshape(-1), v_cache.reshape(-1)
    shift = block_shift(block_size)
    kernel[grid, threads, stream](q, k_flat, v_flat, block_tables, cu_seqlens_q, context_lens, shift, out)
