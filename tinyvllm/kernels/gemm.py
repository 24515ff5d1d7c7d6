"""The matrix product of a linear layer on the tensor cores, tiled for large M (prefill).

    Y[M, N] = X[M, K] @ W[N, K]^T        (X, W bf16; accumulate in float32; Y bf16 or float32)
    Y[M, N] += X[M, K] @ W[N, K]^T       (`accumulate`: Y bf16, the sum rounded once)

W keeps HF's [out_features, in_features] orientation, so both operands are read along K,
which is the layout `mma.sync ... .row.col` takes: X row-major (A), W^T column-major (B).
The instructions and their fragment layouts are in `device/mma.py`.

Each block of THREADS = 256 threads (8 warps) computes one 128 x 128 tile of Y, the warps
2 x 4 over it, each a 64 x 32 piece: 4 x 4 mma tiles of 16 x 8. A lane holds the float32
accumulators of all 16 (64 registers, rows g and g + 8, columns 2t and 2t + 1 of each
tile, g = lane // 4, t = lane % 4), in a local array indexed only by unrolled loop
counters so that it never leaves the registers. The epilogue stores them from there.

K is walked BLOCK_K = 32 at a time. A step's slices X[128, 32] and W[128, 32] sit in
shared memory as rows of ROW_STRIDE = 40 elements: 32 used, 8 of padding, so that the 8
rows one ldmatrix reads (80 bytes apart) start in 8 different 16-byte bank groups, where
a 64-byte stride would put rows 0, 2, 4, 6 on the same banks. Per 16 of K a warp loads
its fragments with ldmatrix_x4 (4 for X: the 16 x 16 A tile of each mma row; 2 for W:
b0, b1 of two n8 tiles each) and issues 16 mmas.

The slices come in by cp.async, global to shared with no register in between, into one
of two stages. At the top of step s the block waits for its copies of slice s and meets
at a barrier, which also tells it that every warp is done reading the other stage (slice
s - 1); it then starts the copies of slice s + 1 into that stage and multiplies slice s
while they fly. One barrier a step. Two stages of 2 x 10 KB are 40 KB; a third would pass
the 48 KB of static shared memory a block may have.

Ragged edges: a chunk (8 elements of a row) past M, N or K is stored as zeros, and the
epilogue writes only elements inside Y. When K is a multiple of 8 and both operands start
on a 16-byte boundary (`rows_of_eight`) a chunk is all in or all out, and `cp.async`
zero-fills the outside ones itself (source size 0). Otherwise (any K, any alignment) each
thread gathers its chunks element by element and stores them into shared memory itself:
the same kernel, a different staging function. A warp skips the mma tiles that lie wholly
outside Y, and the block the 16 of K past K: a small product (and the simulator, where each
lane is a Python thread) does not multiply zeros.
"""

import functools

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.device.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.mma import (
    MMA_K,
    MMA_M,
    MMA_N,
    WARP,
    cp_async_16_zfill,
    cp_async_commit,
    cp_async_wait,
    ldmatrix_x4,
    mma_bf16_16816,
)
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT, launch_bounds
from tinyvllm.kernels.device.vector_io import ALIGNMENT_BYTES, VECTOR, data_address

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 32
WARP_M = 64
WARP_N = 32
WARPS_N = BLOCK_N // WARP_N
THREADS = WARP * (BLOCK_M // WARP_M) * WARPS_N
TILES_M = WARP_M // MMA_M
TILES_N = WARP_N // MMA_N
"""A warp's piece of Y in mma tiles: TILES_M x TILES_N of 16 x 8."""
ROW_STRIDE = BLOCK_K + VECTOR
"""Shared elements a row of a slice: BLOCK_K used, 8 of padding (see above)."""
STAGE = BLOCK_M * ROW_STRIDE
"""Shared elements of one operand's slice."""
STAGES = 2
SHARED_ELEMENTS = STAGES * STAGE
CHUNKS_PER_ROW = BLOCK_K // VECTOR
ROWS_PER_PASS = THREADS // CHUNKS_PER_ROW
assert BLOCK_M == BLOCK_N and BLOCK_M % ROWS_PER_PASS == 0, "the copy covers both slices in whole passes"

_OCCUPANCY = launch_bounds(THREADS, 2)
"""Two blocks per SM (2 x 40 KB of shared memory), so at most 128 registers a thread."""

OUTPUT_DTYPES = (np.dtype(np.uint16), np.dtype(np.float32))


def check_linear(x, weight, out, out_name: str = "out", accumulate: bool = False) -> tuple[int, int, int]:
    """Validate Y = X W^T's operands for every backend (Y named out_name in errors; bf16 if
    the product is added to it); return (M, N, K)."""
    m, k = check_array("x", x, np.uint16, (None, None))
    n, _ = check_array("weight", weight, np.uint16, (None, k))
    out_dtype = np.dtype(getattr(out, "dtype", np.uint16))
    if out_dtype not in OUTPUT_DTYPES:
        raise ValueError(f"{out_name}: expected dtype uint16 (bf16) or float32, got {out_dtype}")
    if accumulate and out_dtype != np.uint16:
        raise ValueError(f"{out_name}: accumulating into it needs dtype uint16 (bf16), got {out_dtype}")
    check_array(out_name, out, out_dtype, (m, n))
    if min(m, n, k) == 0:
        raise ValueError(f"linear: empty operand (M={m}, N={n}, K={k})")
    return m, n, k


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


def store_for(out, accumulate: bool):
    """The epilogue's store into out (checked by `check_linear`): add_bf16 to accumulate."""
    return add_bf16 if accumulate else STORES[np.dtype(out.dtype)]


@cuda.jit(device=True, inline=True)
def _element(array, row, col):
    if row < array.shape[0] and col < array.shape[1]:
        return np.uint32(array[row, col])
    return np.uint32(0)


@cuda.jit(device=True, inline=True)
def _pair(array, row, col):
    return _element(array, row, col) | np.uint32(_element(array, row, col + 1) << np.uint32(16))


@cuda.jit(device=True, inline=True)
def read_chunk_ragged(array, row, col):
    """Chunk (row, col:col+8) element by element, for any K and alignment; zeros past the edge."""
    return _pair(array, row, col), _pair(array, row, col + 2), _pair(array, row, col + 4), _pair(array, row, col + 6)


def rows_of_eight(*arrays) -> bool:
    """Whether every row of these bf16 matrices can be read in 16-byte chunks."""
    return all(a.shape[1] % VECTOR == 0 and data_address(a) % ALIGNMENT_BYTES == 0 for a in arrays)


@cuda.jit(device=True, inline=True)
def stage_chunk_async(tiles, offset, array, row, col):
    """Chunk (row, col:col+8) into tiles[offset:offset+8] by cp.async, zeros past the edge
    (rows of eight: all in or all out)."""
    inside = row < array.shape[0] and col < array.shape[1]
    source = array[min(row, array.shape[0] - 1)]  # a real row even when none of it is read
    cp_async_16_zfill(tiles, offset, source, col if inside else 0, inside)


@cuda.jit(device=True, inline=True)
def stage_chunk_ragged(tiles, offset, array, row, col):
    """The same chunk gathered element by element (any K and alignment) and stored by the thread."""
    for i in range(VECTOR):
        tiles[offset + i] = np.uint16(_element(array, row, col + i))


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


# --8<-- [start:k16]
@cuda.jit(device=True, inline=True)
def _multiply_k16(acc, a_tiles, b_tiles, a_offset, b_offset, live_m, live_n):
    """acc += the warp's X[64, 16] @ W[32, 16]^T out of shared memory: 6 ldmatrix, 16 mma,
    fewer past the edge of Y (live_m rows, live_n columns of mma tiles hold outputs)."""
    b00, b01, b10, b11 = ldmatrix_x4(b_tiles, b_offset)
    b20, b21, b30, b31 = ldmatrix_x4(b_tiles, b_offset + 2 * MMA_N * ROW_STRIDE)
    for mi in range(TILES_M):
        if mi < live_m:
            a = ldmatrix_x4(a_tiles, a_offset + mi * MMA_M * ROW_STRIDE)
            mma_into(acc, mi, 0, a, b00, b01)
            if live_n > 1:
                mma_into(acc, mi, 1, a, b10, b11)
            if live_n > 2:
                mma_into(acc, mi, 2, a, b20, b21)
            if live_n > 3:
                mma_into(acc, mi, 3, a, b30, b31)


# --8<-- [end:k16]


# --8<-- [start:kernel]
@functools.cache
def gemm_kernel(stage_chunk, store):
    """The tiled kernel for one staging function and one output store (compiled per pair)."""

    @cuda.jit(device=True, inline=True)
    def stage_slices(a_tiles, b_tiles, stage, x, weight, m0, n0, k0, copy_row, copy_col):
        """Start this thread's copies of X[m0:, k0:k0+32] and W[n0:, k0:k0+32] into `stage`."""
        for p in range(BLOCK_M // ROWS_PER_PASS):
            row = copy_row + p * ROWS_PER_PASS
            offset = stage * STAGE + row * ROW_STRIDE + copy_col
            stage_chunk(a_tiles, offset, x, m0 + row, k0 + copy_col)
            stage_chunk(b_tiles, offset, weight, n0 + row, k0 + copy_col)
        cp_async_commit()

    @cuda.jit(**_OCCUPANCY)
    def gemm(x, weight, out):
        allow_dependent_launch()
        wait_for_prior_grid()
        a_tiles = cuda.shared.array(SHARED_ELEMENTS, np.uint16, alignment=SHARED_ALIGNMENT)
        b_tiles = cuda.shared.array(SHARED_ELEMENTS, np.uint16, alignment=SHARED_ALIGNMENT)
        acc = cuda.local.array((TILES_M, TILES_N, 4), float32)
        for mi in range(TILES_M):
            for ni in range(TILES_N):
                for r in range(4):
                    acc[mi, ni, r] = float32(0.0)

        # Unsigned indices: Numba adds wraparound code for negative signed ones.
        tid = np.uint32(cuda.threadIdx.x)
        warp, lane = tid // WARP, tid % WARP
        m0 = np.uint32(cuda.blockIdx.y) * BLOCK_M
        n0 = np.uint32(cuda.blockIdx.x) * BLOCK_N
        warp_m = (warp // WARPS_N) * WARP_M
        warp_n = (warp % WARPS_N) * WARP_N
        copy_row, copy_col = tid // CHUNKS_PER_ROW, (tid % CHUNKS_PER_ROW) * VECTOR
        # ldmatrix: lanes 8j .. 8j + 7 name rows 0..7 of 8x8 matrix j; for A the matrices
        # are the quarters (rows 8 (j % 2), k 8 (j // 2)), for W (n 8 (j // 2), k 8 (j % 2))
        matrix, matrix_row = lane // 8, lane % 8
        a_offset = (warp_m + matrix_row + 8 * (matrix % 2)) * ROW_STRIDE + 8 * (matrix // 2)
        b_offset = (warp_n + matrix_row + 8 * (matrix // 2)) * ROW_STRIDE + 8 * (matrix % 2)

        # mma tiles wholly past the edge of Y are skipped: the count is the same for all
        # lanes of a warp, so the warp-collective instructions stay convergent
        live_m = min(max(np.int64(out.shape[0]) - (m0 + warp_m) + MMA_M - 1, 0) // MMA_M, TILES_M)
        live_n = min(max(np.int64(out.shape[1]) - (n0 + warp_n) + MMA_N - 1, 0) // MMA_N, TILES_N)
        num_steps = (x.shape[1] + BLOCK_K - 1) // BLOCK_K
        stage_slices(a_tiles, b_tiles, 0, x, weight, m0, n0, 0, copy_row, copy_col)
        for step in range(num_steps):
            cp_async_wait(0)
            cuda.syncthreads()  # slice `step` is in, and no warp still reads the other stage
            if step + 1 < num_steps:
                k0 = (step + 1) * BLOCK_K
                stage_slices(a_tiles, b_tiles, (step + 1) % STAGES, x, weight, m0, n0, k0, copy_row, copy_col)
            stage = (step % STAGES) * STAGE
            for k in range(0, BLOCK_K, MMA_K):
                if live_m > 0 and live_n > 0 and step * BLOCK_K + k < x.shape[1]:
                    _multiply_k16(acc, a_tiles, b_tiles, stage + a_offset + k, stage + b_offset + k, live_m, live_n)

        g, t = lane // 4, lane % 4
        for mi in range(TILES_M):
            for half in range(2):
                row = m0 + warp_m + mi * MMA_M + 8 * half + g
                if row < out.shape[0]:
                    for ni in range(TILES_N):
                        col = n0 + warp_n + ni * MMA_N + 2 * t
                        if col < out.shape[1]:
                            store(out, row, col, acc[mi, ni, 2 * half])
                        if col + 1 < out.shape[1]:
                            store(out, row, col + 1, acc[mi, ni, 2 * half + 1])

    return gemm


# --8<-- [end:kernel]


def gemm(x, weight, out, *, accumulate: bool = False, stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T with the tiled kernel (any shape; best for large M);
    with `accumulate`, out += the product."""
    m, n, _ = check_linear(x, weight, out, accumulate=accumulate)
    stage_chunk = stage_chunk_async if rows_of_eight(x, weight) else stage_chunk_ragged
    kernel = gemm_kernel(stage_chunk, store_for(out, accumulate))
    grid = ((n + BLOCK_N - 1) // BLOCK_N, (m + BLOCK_M - 1) // BLOCK_M)
    kernel[grid, THREADS, stream](x, weight, out)
