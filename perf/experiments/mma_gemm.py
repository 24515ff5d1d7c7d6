"""A tensor-core GEMM prototype: C[M, N] = A[M, K] @ B[N, K]^T, bf16 in, float32 out.

Not a library kernel: a first step to see what `tinyvllm/kernels/device/mma.py` gives a
GEMM before it is measured. B is stored [N, K] as the weights are (y = x @ W.T), which is
exactly the column-major B that `mma.sync ... .row.col` wants.

One block of 128 threads (4 warps) computes a 64x64 tile of C. The K loop steps 16 at a
time: every thread copies one 16-byte chunk of the A tile [64, 16] and one of the B tile
[64, 16] into shared memory with `cp.async`, the block waits, and each warp computes its
32x32 quarter (warps 2x2 over the tile) as 2 x 4 mma tiles of 16x8:

    ldmatrix_x4 twice for A   (rows 16 mi .. 16 mi + 15, k 0..15: registers a0..a3)
    ldmatrix_x4 twice for B   (n 16 nj .. 16 nj + 15, k 0..15: b0, b1 of two n8 tiles)
    8 x mma_bf16_16816         (each adds A[16, 16] @ B^T[16, 8] to 4 accumulators a lane)

A lane holds 2 x 4 x 4 = 32 float32 accumulators, in the C layout of mma.py (rows g and
g + 8, columns 2t and 2t + 1 of each 16x8 tile), and writes them to C at the end.

Shared rows are padded from 16 to 24 elements (48 bytes): ldmatrix reads 8 rows of 16 bytes
at once, and at a 32-byte stride rows 0 and 4 would fall in the same banks; at 48 bytes
the 8 rows land in 8 different 16-byte bank groups. Single-buffered: the copy of step k + 1
does not overlap the mmas of step k (a second buffer and `cp_async_wait(1)` would).

Shapes: M and N multiples of 64, K a multiple of 16, all arrays C-contiguous. The tests
are tests/test_mma_gemm.py (simulator); perf/experiments/mma_sass.py compiles it for sm_90.
"""

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.mma import cp_async_16, cp_async_commit, cp_async_wait, ldmatrix_x4
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT
from tinyvllm.kernels.device.vector_io import check_rows_of_eight
from tinyvllm.kernels.gemm_multiply import mma_into

TILE = 64
K_STEP = 16
ROW_STRIDE = 24
"""Shared elements a tile row: 16 used, 8 of padding (see above)."""
SHARED_TILE = TILE * ROW_STRIDE
THREADS = 128
WARP_TILE = 32


# --8<-- [start:kernel]
@cuda.jit
def mma_gemm_kernel(a, b, c):
    tid = cuda.threadIdx.x
    warp, lane = tid // 32, tid % 32
    block_m, block_n = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    warp_m, warp_n = WARP_TILE * (warp // 2), WARP_TILE * (warp % 2)
    a_tile = cuda.shared.array(SHARED_TILE, np.uint16, alignment=SHARED_ALIGNMENT)
    b_tile = cuda.shared.array(SHARED_TILE, np.uint16, alignment=SHARED_ALIGNMENT)
    accumulators = cuda.local.array((2, 4, 4), float32)
    for mi in range(2):
        for ni in range(4):
            for k in range(4):
                accumulators[mi, ni, k] = float32(0.0)
    # the copy: thread tid moves row tid // 2, columns 8 (tid % 2) .. + 8 of each tile
    copy_row, copy_column = tid // 2, 8 * (tid % 2)
    # ldmatrix: lanes 8j .. 8j + 7 name rows 0..7 of 8x8 matrix j
    matrix, matrix_row = lane // 8, lane % 8
    a_offset = (warp_m + matrix_row + 8 * (matrix % 2)) * ROW_STRIDE + 8 * (matrix // 2)
    b_offset = (warp_n + matrix_row + 8 * (matrix // 2)) * ROW_STRIDE + 8 * (matrix % 2)
    for k0 in range(0, a.shape[1], K_STEP):
        shared_offset = copy_row * ROW_STRIDE + copy_column
        cp_async_16(a_tile, shared_offset, a[block_m + copy_row], k0 + copy_column)
        cp_async_16(b_tile, shared_offset, b[block_n + copy_row], k0 + copy_column)
        cp_async_commit()
        cp_async_wait(0)
        cuda.syncthreads()
        a_top = ldmatrix_x4(a_tile, a_offset)
        a_bottom = ldmatrix_x4(a_tile, a_offset + 16 * ROW_STRIDE)
        b00, b01, b10, b11 = ldmatrix_x4(b_tile, b_offset)
        b20, b21, b30, b31 = ldmatrix_x4(b_tile, b_offset + 16 * ROW_STRIDE)
        for mi in range(2):
            fragment = a_top if mi == 0 else a_bottom
            mma_into(accumulators, mi, 0, fragment, b00, b01)
            mma_into(accumulators, mi, 1, fragment, b10, b11)
            mma_into(accumulators, mi, 2, fragment, b20, b21)
            mma_into(accumulators, mi, 3, fragment, b30, b31)
        cuda.syncthreads()  # the tiles are overwritten by the next step's copy
    g, t = lane // 4, lane % 4
    for mi in range(2):
        for ni in range(4):
            row = block_m + warp_m + 16 * mi + g
            column = block_n + warp_n + 8 * ni + 2 * t
            c[row, column] = accumulators[mi, ni, 0]
            c[row, column + 1] = accumulators[mi, ni, 1]
            c[row + 8, column] = accumulators[mi, ni, 2]
            c[row + 8, column + 1] = accumulators[mi, ni, 3]


# --8<-- [end:kernel]


def mma_gemm(a, b, c) -> None:
    """c[M, N] = a[M, K] @ b[N, K]^T on the tensor cores (device or host arrays of bf16 bits; c float32)."""
    m, k = check_rows_of_eight("a", a, (None, None))  # cp.async moves aligned 16 bytes
    n, _ = check_rows_of_eight("b", b, (None, k))
    check_array("c", c, np.float32, (m, n))
    if m % TILE or n % TILE or k % K_STEP:
        raise ValueError(f"mma_gemm: M={m}, N={n} must be multiples of {TILE}, K={k} of {K_STEP}")
    mma_gemm_kernel[(n // TILE, m // TILE), THREADS](a, b, c)


def main() -> None:
    """Time the prototype against cuBLAS (CuPy) at 4096^3 and print TFLOP/s (GPU only)."""
    import cupy

    from perf.timing import median_ms, random_bf16

    m = n = k = 4096
    a, b = random_bf16(m, k), random_bf16(n, k)
    c = cuda.device_array((m, n), np.float32)
    flops = 2 * m * n * k
    tiled = median_ms(lambda: mma_gemm(a, b, c), repeats=20)
    a16 = cupy.asarray(a).view(cupy.float16)  # cuBLAS on the same bits as fp16: the same FLOPs
    b16 = cupy.asarray(b).view(cupy.float16)
    cublas = median_ms(lambda: cupy.matmul(a16, b16.T), repeats=20)
    print(
        f"4096^3: mma prototype {tiled:.3f} ms = {flops / tiled / 1e9:.0f} TFLOP/s; "
        f"cuBLAS fp16 {cublas:.3f} ms = {flops / cublas / 1e9:.0f} TFLOP/s"
    )


if __name__ == "__main__":
    main()
