"""Flash attention's P V in one float16 pass: `flash_tiles(..., p_precision="fp16")`.

The default fold (`attention_tiles.py`) multiplies P V twice, P's bf16 rounding and then its
remainder, so that P loses nothing: 1.5x the tensor-core work of FlashAttention-2. P lies in
[0, 1], where float16 is finer than bf16 (10 mantissa bits to 7): one pass of P rounded to
float16 (`f16x2`) against V in float16 (`mma_f16_16816`) moves a probability by at most 2^-11
of itself (or 2^-25 below float16's normal range, 2^-14), against 2^-8 for one bf16 pass.

V arrives as bf16 and its float16 copy is made in shared memory. bf16 has float16's mantissa
and more, so the copy is exact from 2^-14 up to 65280 (bf16's largest below 2^16), rounds to
within 2^-25 below that, and overflows from 2^16 on: there, and for infinity and NaN, the tile
cannot be held in float16. Each thread converts the chunks its own `cp.async` copies brought
(`cp.async.wait_group` makes a thread's own copies visible to it, so no barrier is needed
first) into a third, single tile `v_half`, and notes whether any of them is out of range; the
barrier that publishes the tile to the block is `syncthreads_or` of that note. A tile with such
a value falls back to the two bf16 passes over the bf16 copy, so results are never wrong, only
slower. The extra tile costs keys x (D + 8) x 2 bytes of shared memory: 4.5 KB at D = 64, 8.5 KB
at D = 128.

`v_half` holds float16 bits in a uint16 array: `ldmatrix` moves 16-bit elements whatever they
are, and the mma's type decides how they are read.
"""

from operator import attrgetter
from types import SimpleNamespace

import numpy as np
from numba import cuda

from tinyvllm.kernels.device.mma import (
    MMA_K,
    MMA_N,
    bf16x2_to_f16x2,
    f16x2,
    ldmatrix_x4_trans,
    mma_f16_16816,
)
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT
from tinyvllm.kernels.device.vector_io import load_words, store_words

BF16_F16_OVERFLOW = 0x4780
"""2^16 as bf16 bits (sign dropped): this magnitude and up (infinity and NaN among them) has no float16."""


@cuda.jit(device=True, inline=True)
def out_of_f16_range(word):
    """Whether either bf16 of a word has magnitude 2^16 or more, or is infinite or NaN."""
    limit = np.uint32(BF16_F16_OVERFLOW)
    return ((word & np.uint32(0x7FFF)) >= limit) | (((word >> np.uint32(16)) & np.uint32(0x7FFF)) >= limit)


def fp16_step(parts: SimpleNamespace):
    """`attention_tiles.tile_walk`'s step with P V in one float16 pass (`parts`: `attention_tiles.tile_parts`)."""
    tile_scores, softmax_tile, pv_bf16x2, chunk_at = attrgetter("tile_scores", "softmax_tile", "pv_bf16x2", "chunk_at")(
        parts
    )
    stride, tile_elements, chunks_per_thread, key_steps, dim_tiles = attrgetter(
        "stride", "tile_elements", "chunks_per_thread", "key_steps", "dim_tiles"
    )(parts)

    @cuda.jit(device=True, inline=True)
    def convert_own_chunks(v_tiles, base, v_half):
        """v_half = float16 of the thread's chunks of the bf16 tile at `base`; 1 if any is out of range."""
        wide = False
        for c in range(chunks_per_thread):
            inside, key, column = chunk_at(c)
            if inside:
                at = key * stride + column
                w0, w1, w2, w3 = load_words(v_tiles, base + at)
                wide |= out_of_f16_range(w0) | out_of_f16_range(w1) | out_of_f16_range(w2) | out_of_f16_range(w3)
                words = (bf16x2_to_f16x2(w0), bf16x2_to_f16x2(w1), bf16x2_to_f16x2(w2), bf16x2_to_f16x2(w3))
                store_words(v_half, at, words)
        return np.int32(1) if wide else np.int32(0)

    @cuda.jit(device=True, inline=True)
    def mma_f16_into(acc, n, a0, a1, a2, a3, b0, b1):
        d0, d1, d2, d3 = mma_f16_16816(a0, a1, a2, a3, b0, b1, acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3])
        acc[n, 0], acc[n, 1], acc[n, 2], acc[n, 3] = d0, d1, d2, d3

    @cuda.jit(device=True, inline=True)
    def pv_fp16(v_half, v_at, scores, out):
        """O += P V for the float16 V tile whose lane row starts at v_at, P rounded to float16."""
        for s in range(key_steps):
            a0 = f16x2(scores[2 * s, 0], scores[2 * s, 1])
            a1 = f16x2(scores[2 * s, 2], scores[2 * s, 3])
            a2 = f16x2(scores[2 * s + 1, 0], scores[2 * s + 1, 1])
            a3 = f16x2(scores[2 * s + 1, 2], scores[2 * s + 1, 3])
            for n in range(0, dim_tiles, 2):
                b00, b01, b10, b11 = ldmatrix_x4_trans(v_half, v_at + MMA_K * s * stride + MMA_N * n)
                mma_f16_into(out, n, a0, a1, a2, a3, b00, b01)
                mma_f16_into(out, n + 1, a0, a1, a2, a3, b10, b11)

    @cuda.jit(device=True, inline=True)
    def step(k_tiles, v_tiles, base, k_lane, v_lane, tile_start, last0, last1, query, scores, out, maxes, sums):
        v_half = cuda.shared.array(tile_elements, np.uint16, alignment=SHARED_ALIGNMENT)
        # no barrier before the conversion: a thread's own copies are visible to it after the
        # wait; v_half is free, the previous tile's closing barrier saw every warp done with it
        wide = cuda.syncthreads_or(convert_own_chunks(v_tiles, base, v_half))
        tile_scores(k_tiles, base + k_lane, query, scores)
        softmax_tile(scores, tile_start, last0, last1, out, maxes, sums)
        if wide:  # the same for the whole block, so every warp takes the same path
            pv_bf16x2(v_tiles, base + v_lane, scores, out)
        else:
            pv_fp16(v_half, v_lane, scores, out)

    return step
