"""Flash prefill attention over the paged KV cache (varlen, causal, GQA), on tensor cores.

    out[t, h] = softmax(q[t, h] . K_s^T / sqrt(D) + causal mask) V_s

Sequence s owns query rows cu_seqlens_q[s] : cu_seqlens_q[s + 1], its n_s newest tokens.
Their keys and values are already in the cache with the earlier ones, so query row i sits
at position context_lens[s] - n_s + i and sees keys 0 .. that position: plain prefill,
chunked prefill and prefix caching are all the same kernel.

The scores are never stored (FlashAttention): a block walks the keys in tiles and folds
each into an online softmax per query row, with Q K^T and P V as `mma.sync` tiles
(`attention_tiles.py`). A block serves one KV head and one tile of ROWS / G tokens of one
sequence, each token's G = Hq / Hkv query heads in adjacent rows, so that a staged K and
V tile serves all G heads. It walks only the keys up to its last token: causal tiles past
the diagonal are never loaded.

The grid needs no host-side look at cu_seqlens_q. Sequence s gets token tiles
cu_seqlens_q[s] // units + s onwards (units = tokens a tile), which never overlap the next
sequence's, so a block finds its sequence by binary search and T // units + S tiles cover
any batch (a few blocks find no rows and exit). Tiles run last-first: the longest
(causal) ones start first.
"""

import functools

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.attention_common import block_shift, check_paged_cache, check_sequences
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
def store_row(out, token, head, n_tiles, acc, c0, inverse):
    """A lane's two columns 2t, 2t + 1 of each n8 tile of one row (accumulators c0, c0 + 1), normalised."""
    t2 = 2 * (cuda.threadIdx.x % 4)
    for n in range(n_tiles):
        out[token, head, MMA_N * n + t2] = f32_to_bf16(acc[n, c0] * inverse)
        out[token, head, MMA_N * n + t2 + 1] = f32_to_bf16(acc[n, c0 + 1] * inverse)


@functools.cache
def _prefill_kernel(head_dim, group, threads, keys, rows, p_precision):
    units = rows // group
    dim_tiles = head_dim // MMA_N
    query_words = (head_dim // MMA_K, 4)
    load_query, fold, finish = flash_tiles(head_dim, threads, keys, p_precision)

    @cuda.jit(**flash_bounds(head_dim, threads))
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
            if cu_seqlens_q[mid] // units + mid <= tile_index:
                lo = mid
            else:
                hi = mid - 1
        seq = lo
        first_row = cu_seqlens_q[seq]
        num_rows = cu_seqlens_q[seq + 1] - first_row
        token0 = (tile_index - first_row // units - seq) * units
        if token0 >= num_rows:
            return
        past = context_lens[seq] - num_rows
        kv_end = past + min(token0 + units, num_rows)

        row, token_a, head_a, token_b, head_b = lane_rows(token0, kv_head, group)
        last_a = past + min(token_a, num_rows - 1)
        last_b = past + min(token_b, num_rows - 1)
        query = cuda.local.array(query_words, np.uint32)
        acc = cuda.local.array((dim_tiles, 4), float32)
        maxes = cuda.local.array(2, float32)
        sums = cuda.local.array(2, float32)
        empty_state(acc, maxes, sums)
        load_query(q[first_row + last_a - past, head_a], q[first_row + last_b - past, head_b], query)
        fold(k_flat, v_flat, block_tables[seq], kv_head, 0, kv_end, shift, min(last_a, kv_end - 1),
             min(last_b, kv_end - 1), query, acc, maxes, sums)  # fmt: skip
        sum_a, sum_b = finish(sums)
        if row < units * group and token_a < num_rows:
            store_row(out, first_row + token_a, head_a, dim_tiles, acc, 0, float32(1.0) / sum_a)
        if row + 8 < units * group and token_b < num_rows:
            store_row(out, first_row + token_b, head_b, dim_tiles, acc, 2, float32(1.0) / sum_b)

    return prefill


def prefill_attention(
    q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, *, stream=0, p_precision: str = "bf16x2"
) -> None:
    """Causal attention of the packed new tokens q over their sequences' cached context.

    q, out: uint16[T, Hq, D]; k_cache, v_cache: uint16[num_blocks, block_size, Hkv, D];
    block_tables: int32[S, max_blocks]; cu_seqlens_q: int32[S + 1], cu[0] = 0, cu[S] <= T;
    context_lens: int32[S] with n_s <= context_lens[s] <= max_blocks * block_size.
    Rows past cu[S] are left as they are. p_precision: how P V takes the probabilities,
    "bf16x2" (two bf16 passes) or "fp16" (one float16 pass, `attention_fp16.py`); each is its
    own kernel.
    """
    num_tokens, num_heads, num_kv_heads, head_dim, block_size = check_paged_cache(q, k_cache, v_cache, out)
    num_seqs, _ = check_sequences(block_tables, context_lens, None)
    check_array("cu_seqlens_q", cu_seqlens_q, np.int32, (num_seqs + 1,))
    check_head_dim(head_dim)
    check_p_precision(p_precision)
    if num_seqs == 0 or num_tokens == 0:
        return
    group = num_heads // num_kv_heads
    rows = block_rows()
    if group > rows:
        raise ValueError(f"prefill: {group} query heads a KV head, at most {rows}")
    threads, keys = tile_shape(head_dim, p_precision)
    kernel = _prefill_kernel(head_dim, group, threads, keys, rows, p_precision)
    grid = (num_kv_heads, num_tokens // (rows // group) + num_seqs)
    k_flat, v_flat = k_cache.reshape(-1), v_cache.reshape(-1)
    shift = block_shift(block_size)
    launch_kernel(kernel, grid, threads, stream,
                  q, k_flat, v_flat, block_tables, cu_seqlens_q, context_lens, shift, out)  # fmt: skip
