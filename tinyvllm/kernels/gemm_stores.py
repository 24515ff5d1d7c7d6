"""The matrix products' epilogues: how float32 sums go into Y.

The one-element stores (bf16, float32, or added to bf16 Y, the residual stream's join) serve
the GEMV (kernels/gemv.py) and the tiled GEMM (kernels/gemm.py). In the tiled GEMM a lane
holds its accumulators as pairs of neighbouring columns (2t, 2t + 1 of each mma tile), so
each store takes a pair: one element at a time (`pair_store` around a one-element store), or
both as one 32-bit word of two bf16 (`store_bf16x2`, for a `packed` shape where Y's rows
allow it).
"""

import functools

import numpy as np
from numba import cuda

from tinyvllm.kernels.device.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.device.mma import bf16x2


@cuda.jit(device=True, inline=True)
def store_bf16(out, row, col, value):
    out[row, col] = f32_to_bf16(value)


@cuda.jit(device=True, inline=True)
def store_f32(out, row, col, value):
    out[row, col] = value


@cuda.jit(device=True, inline=True)
def add_bf16(out, row, col, value):
    """out += value, rounded once: how a sublayer's output joins the residual stream."""
    out[row, col] = f32_to_bf16(bf16_to_f32(out[row, col]) + value)


STORES = {np.dtype(np.uint16): store_bf16, np.dtype(np.float32): store_f32}


@cuda.jit(device=True, inline=True)
def store_bf16x2(out, row, col, width, low, high):
    """Y[row, col:col+2] as one 32-bit word of out (Y's bf16 rows viewed as uint32, N even)."""
    if col < width:
        out[row, col >> 1] = bf16x2(low, high)


@functools.cache
def pair_store(store):
    """The epilogue's store of Y[row, col] and Y[row, col + 1], each only inside Y (width wide)."""
    if store is store_bf16x2:
        return store

    @cuda.jit(device=True, inline=True)
    def pair(out, row, col, width, low, high):
        if col < width:
            store(out, row, col, low)
        if col + 1 < width:
            store(out, row, col + 1, high)

    return pair


def store_for(out, accumulate: bool):
    """The epilogue's store into out (checked by `check_linear`): add_bf16 to accumulate."""
    return add_bf16 if accumulate else STORES[np.dtype(out.dtype)]
