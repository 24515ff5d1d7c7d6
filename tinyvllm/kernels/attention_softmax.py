"""Flash attention's online softmax over one tile of scores (`attention_tiles.py`'s fold).

A lane holds rows g and g + 8 of the tile's S = Q K^T accumulators, columns 2t and 2t + 1 of
each n8 tile (`device/mma.py`). Per tile:

    mask        only on a tile that reaches past a row's last key (the causal diagonal, or
                the range's end): a masked score is -inf before the max; tiles wholly below
                the diagonal skip it
    max         over the unscaled scores (the scale is positive and rounding monotonic, so
                max(s) * scale is max(s * scale) bit for bit), then one multiply a row
    weights     exp2(s * scale - m) as one FFMA into `exp2_ftz` (`device/fast_exp.py`); a row
                with no key seen yet (m = -inf) keeps weight 0
    rescale     the row's sum and O accumulators by exp2(m_old - m), only when the row's max moved

The running max `maxes` is in the scaled base-2 units of `attention_common` (cascade's shared
kernel stores it for the merge). Positions are int32: Numba's default int64 doubles every compare.
"""

import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.attention_common import rescale
from tinyvllm.kernels.device.fast_exp import exp2_ftz
from tinyvllm.kernels.device.mma import MMA_N, quad_max


def tile_softmax(keys: int, dim_tiles: int, scale: float):
    """`softmax_tile(scores, tile_start, last0, last1, out, maxes, sums)` for tiles of `keys`
    keys and O of `dim_tiles` n8 tiles: row g sees keys up to position last0, row g + 8 up to
    last1; leaves the tile's unnormalised probabilities in `scores` (float32[keys / 8, 4])."""
    key_tiles = keys // MMA_N
    last_in_tile = np.int32(keys - 1)
    scale = float32(scale)

    @cuda.jit(device=True, inline=True)
    def mask_past(scores, tile_start, last0, last1):
        """-inf for each score whose key is past its row's last key."""
        t2 = np.int32(2 * (cuda.threadIdx.x % 4))
        for j in range(key_tiles):
            key = np.int32(tile_start + np.int32(MMA_N * j) + t2)
            for c in range(4):
                if np.int32(key + np.int32(c % 2)) > np.int32(last0 if c < 2 else last1):
                    scores[j, c] = float32(-math.inf)

    @cuda.jit(device=True, inline=True)
    def rescale_row(out, sums, row, c0, factor):
        sums[row] *= factor
        for n in range(dim_tiles):
            out[n, c0] *= factor
            out[n, c0 + 1] *= factor

    @cuda.jit(device=True, inline=True)
    def softmax_tile(scores, tile_start, last0, last1, out, maxes, sums):
        if np.int32(tile_start + last_in_tile) > min(np.int32(last0), np.int32(last1)):
            mask_past(scores, tile_start, last0, last1)
        tile_max0, tile_max1 = float32(-math.inf), float32(-math.inf)
        for j in range(key_tiles):
            tile_max0 = max(tile_max0, max(scores[j, 0], scores[j, 1]))
            tile_max1 = max(tile_max1, max(scores[j, 2], scores[j, 3]))
        old0, old1 = maxes[0], maxes[1]
        new0 = max(old0, quad_max(tile_max0) * scale)
        new1 = max(old1, quad_max(tile_max1) * scale)
        maxes[0], maxes[1] = new0, new1
        if new0 != old0:
            rescale_row(out, sums, 0, 0, rescale(old0, new0))
        if new1 != old1:
            rescale_row(out, sums, 1, 2, rescale(old1, new1))
        # a row with no key seen yet keeps weight 0 rather than exp2(-inf + inf)
        shift0 = -new0 if new0 != -math.inf else float32(0.0)
        shift1 = -new1 if new1 != -math.inf else float32(0.0)
        sum0, sum1 = sums[0], sums[1]
        for j in range(key_tiles):
            for c in range(4):
                weight = exp2_ftz(cuda.fma(scores[j, c], scale, shift0 if c < 2 else shift1))
                scores[j, c] = weight
                if c < 2:
                    sum0 += weight
                else:
                    sum1 += weight
        sums[0], sums[1] = sum0, sum1

    return softmax_tile
