"""How a warp of the tiled GEMM multiplies out of shared memory (kernels/gemm.py).

A warp's piece of Y is TILES_M x tiles_n mma tiles of 16 x 8, their float32 accumulators in
`acc[mi, ni, 0:4]` (`mma_into`). Per 16 of K it loads its fragments of the slice with
ldmatrix_x4 (one per mma row of X, one per two n8 tiles of W) and issues the mmas: over a
whole slice with no branch among them (`slice_multiplier`, the branch-free path), or 16 of
K at a time, skipping the mma tiles past the edge of Y (`k16_multiplier`, the checked path).
"""

import functools

import numpy as np
from numba import cuda

from tinyvllm.kernels.device.mma import MMA_K, MMA_M, MMA_N, ldmatrix_x4, mma_bf16_16816
from tinyvllm.kernels.device.vector_io import VECTOR
from tinyvllm.kernels.gemm_tiles import TILES_M, GemmShape


@cuda.jit(device=True, inline=True)
def mma_into(acc, mi, ni, a, b0, b1):
    """acc[mi, ni] += the 16 x 16 A fragment a @ the 16 x 8 B fragment (b0, b1)."""
    d0, d1, d2, d3 = mma_bf16_16816(
        a[0], a[1], a[2], a[3], b0, b1, acc[mi, ni, 0], acc[mi, ni, 1], acc[mi, ni, 2], acc[mi, ni, 3]
    )
    acc[mi, ni, 0] = d0
    acc[mi, ni, 1] = d1
    acc[mi, ni, 2] = d2
    acc[mi, ni, 3] = d3


@functools.cache
def slice_multiplier(shape: GemmShape):
    """multiply_slice for one shape: a whole slice into acc, every mma tile inside Y
    (`uniform`), its fragments loaded 16 of K ahead where `double_buffer`."""
    row_stride, tiles_n, k16s = shape.row_stride, shape.tiles_n, shape.block_k // MMA_K
    a_tile, b_pair = MMA_M * row_stride, 2 * MMA_N * row_stride
    double_buffer = shape.double_buffer

    @cuda.jit(device=True, inline=True)
    def load_k16(a_frag, b_frag, buffer, a_tiles, b_tiles, a_offset, b_offset):
        for p in range(tiles_n // 2):
            b0, b1, b2, b3 = ldmatrix_x4(b_tiles, b_offset + p * b_pair)
            b_frag[buffer, 2 * p, 0], b_frag[buffer, 2 * p, 1] = b0, b1
            b_frag[buffer, 2 * p + 1, 0], b_frag[buffer, 2 * p + 1, 1] = b2, b3
        for mi in range(TILES_M):
            a0, a1, a2, a3 = ldmatrix_x4(a_tiles, a_offset + mi * a_tile)
            a_frag[buffer, mi, 0], a_frag[buffer, mi, 1], a_frag[buffer, mi, 2], a_frag[buffer, mi, 3] = a0, a1, a2, a3

    @cuda.jit(device=True, inline=True)
    def mma_k16(acc, a_frag, b_frag, buffer):
        for mi in range(TILES_M):
            for ni in range(tiles_n):
                a = (a_frag[buffer, mi, 0], a_frag[buffer, mi, 1], a_frag[buffer, mi, 2], a_frag[buffer, mi, 3])
                mma_into(acc, mi, ni, a, b_frag[buffer, ni, 0], b_frag[buffer, ni, 1])

    @cuda.jit(device=True, inline=True)
    def multiply_slice(acc, a_frag, b_frag, a_tiles, b_tiles, a_base, b_base, a_chunk, b_chunk):
        """acc += the warp's X[64, block_k] @ W[warp_n, block_k]^T, no branch among the loads
        and mmas: 16 of K kk is chunk 2 kk + the lane's own, stored at slot (2 kk) ^ a_chunk."""
        if double_buffer:
            load_k16(a_frag, b_frag, 0, a_tiles, b_tiles, a_base + VECTOR * a_chunk, b_base + VECTOR * b_chunk)
        for kk in range(k16s):
            buffer = kk % 2 if double_buffer else 0
            if double_buffer and kk + 1 < k16s:
                a_next, b_next = VECTOR * ((2 * kk + 2) ^ a_chunk), VECTOR * ((2 * kk + 2) ^ b_chunk)
                load_k16(a_frag, b_frag, 1 - buffer, a_tiles, b_tiles, a_base + a_next, b_base + b_next)
            if not double_buffer:
                a_this, b_this = VECTOR * ((2 * kk) ^ a_chunk), VECTOR * ((2 * kk) ^ b_chunk)
                load_k16(a_frag, b_frag, 0, a_tiles, b_tiles, a_base + a_this, b_base + b_this)
            mma_k16(acc, a_frag, b_frag, buffer)

    return multiply_slice


@functools.cache
def k16_multiplier(shape: GemmShape):
    """The checked 16 of K for one shape (the branch-free slice: `slice_multiplier`)."""
    row_stride, tiles_n = shape.row_stride, shape.tiles_n
    a_tile, b_pair = MMA_M * row_stride, 2 * MMA_N * row_stride

    # --8<-- [start:k16]
    @cuda.jit(device=True, inline=True)
    def multiply_k16(acc, a_tiles, b_tiles, a_offset, b_offset, live_m, live_n):
        """acc += the warp's X[64, 16] @ W[warp_n, 16]^T out of shared memory: an ldmatrix_x4
        per two n8 tiles of W and per mma row of X, then the mmas; fewer past the edge of Y
        (live_m rows, live_n columns of mma tiles hold outputs)."""
        b = cuda.local.array((tiles_n, 2), np.uint32)
        for p in range(tiles_n // 2):
            b[2 * p, 0], b[2 * p, 1], b[2 * p + 1, 0], b[2 * p + 1, 1] = ldmatrix_x4(b_tiles, b_offset + p * b_pair)
        for mi in range(TILES_M):
            if mi < live_m:
                a = ldmatrix_x4(a_tiles, a_offset + mi * a_tile)
                for ni in range(tiles_n):
                    if ni < live_n:
                        mma_into(acc, mi, ni, a, b[ni, 0], b[ni, 1])

    # --8<-- [end:k16]

    return multiply_k16
