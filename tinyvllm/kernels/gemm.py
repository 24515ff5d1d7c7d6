"""The matrix product of a linear layer, tiled for large M (prefill).

    Y[M, N] = X[M, K] @ W[N, K]^T        (X, W bf16; accumulate in float32; Y bf16 or float32)
    Y[M, N] += X[M, K] @ W[N, K]^T       (`accumulate`: Y bf16, the sum rounded once)

W keeps HF's [out_features, in_features] orientation, so both operands are read along K.

Each block of THREADS threads computes one BLOCK_M x BLOCK_N tile of Y. It walks K in
steps of BLOCK_K: every thread fetches one 16-byte chunk (8 bf16) of X and one of W,
widens them to float32 and stores them *transposed* in shared memory (k-major:
`a_tile[k, m]`), so that for a fixed k a thread's 4 consecutive rows are 4 adjacent
floats, read as one 16-byte shared load. Each thread then owns an 8 x 8 micro-tile of Y
held in registers: rows `tm + {0..3}` and `64 + tm + {0..3}`, columns likewise. Per k it
reads 8 floats of X and 8 of W and does 64 fused multiply-adds, which is what makes the
kernel arithmetic-bound rather than shared-memory-bound.

Two shared-memory buffers alternate: while the block multiplies tile t out of one, the
chunks of tile t+1 are already on their way from global memory into registers, and are
stored into the other buffer afterwards, so one barrier per step suffices.

Ragged edges: chunks of rows past M or N, or columns past K, read as zeros, and the
epilogue writes only elements inside Y. When K is a multiple of 8 and both operands
start on a 16-byte boundary, chunks are single 16-byte loads; otherwise (any K) they are
gathered element by element: same kernel, a different chunk reader.

The micro-tile split in two strips 64 apart keeps the shared reads of a warp within one
or two 128-byte wavefronts, and the loaders' store pattern (32 consecutive rows per
warp) hits 32 different banks.
"""

import functools

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.device.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT, launch_bounds
from tinyvllm.kernels.device.vector_io import (
    ALIGNMENT_BYTES,
    VECTOR,
    data_address,
    high_half,
    load_words,
    low_half,
)

BLOCK_M = 128
BLOCK_N = 128
BLOCK_K = 16
THREADS = 256
STRIP = 4
"""A thread's micro-tile is 2 x 2 strips of 4 x 4, the second strip HALF rows (columns) on."""
MICRO = 2 * STRIP
HALF = BLOCK_M // 2
THREADS_N = BLOCK_N // MICRO
assert THREADS == (BLOCK_M // MICRO) * (BLOCK_N // MICRO), "one 8 x 8 micro-tile per thread"
assert BLOCK_M == BLOCK_N and THREADS * VECTOR == BLOCK_M * BLOCK_K, "one chunk of X and one of W per thread"

_OCCUPANCY = launch_bounds(THREADS, 2)
"""Two blocks per SM, so at most 128 registers a thread."""

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
def read_chunk_aligned(array, row, col):
    """Chunk (row, col:col+8) in one 16-byte load, zeros past the edge (K % 8 == 0: all in or all out)."""
    if row < array.shape[0] and col < array.shape[1]:
        return load_words(array[row], col)
    zero = np.uint32(0)
    return zero, zero, zero, zero


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
def _stage(tiles, buffer, k, row, words):
    """Store a chunk widened to float32, transposed: 8 consecutive k of one row."""
    for i in range(VECTOR // 2):
        tiles[buffer, k + 2 * i, row] = low_half(words[i])
        tiles[buffer, k + 2 * i + 1, row] = high_half(words[i])


# --8<-- [start:rank-one]
@cuda.jit(device=True, inline=True)
def _rank_one_update(acc, a_frag, b_frag, a_tiles, b_tiles, buffer, k, tm, tn):
    """acc += (column k of the X tile) outer (column k of the W tile), this thread's 8 x 8 part."""
    for i in range(STRIP):
        a_frag[i] = a_tiles[buffer, k, tm + i]
        a_frag[STRIP + i] = a_tiles[buffer, k, HALF + tm + i]
        b_frag[i] = b_tiles[buffer, k, tn + i]
        b_frag[STRIP + i] = b_tiles[buffer, k, HALF + tn + i]
    for i in range(MICRO):
        for j in range(MICRO):
            acc[i, j] += a_frag[i] * b_frag[j]


# --8<-- [end:rank-one]


# --8<-- [start:kernel]
@functools.cache
def gemm_kernel(read_chunk, store):
    """The tiled kernel for one chunk reader and one output store (compiled per pair)."""

    @cuda.jit(**_OCCUPANCY)
    def gemm(x, weight, out):
        allow_dependent_launch()
        wait_for_prior_grid()
        a_tiles = cuda.shared.array((2, BLOCK_K, BLOCK_M), float32, SHARED_ALIGNMENT)
        b_tiles = cuda.shared.array((2, BLOCK_K, BLOCK_N), float32, SHARED_ALIGNMENT)
        acc = cuda.local.array((MICRO, MICRO), float32)
        a_frag = cuda.local.array(MICRO, float32)
        b_frag = cuda.local.array(MICRO, float32)

        # Unsigned indices: Numba adds wraparound code for negative signed ones.
        tid = np.uint32(cuda.threadIdx.x)
        m0 = np.uint32(cuda.blockIdx.y) * BLOCK_M
        n0 = np.uint32(cuda.blockIdx.x) * BLOCK_N
        load_row = tid % BLOCK_M
        load_k = (tid // BLOCK_M) * VECTOR
        tm = (tid // THREADS_N) * STRIP
        tn = (tid % THREADS_N) * STRIP

        for i in range(MICRO):
            for j in range(MICRO):
                acc[i, j] = float32(0.0)

        num_steps = (x.shape[1] + BLOCK_K - 1) // BLOCK_K
        x_words = read_chunk(x, m0 + load_row, load_k)
        w_words = read_chunk(weight, n0 + load_row, load_k)
        _stage(a_tiles, 0, load_k, load_row, x_words)
        _stage(b_tiles, 0, load_k, load_row, w_words)
        cuda.syncthreads()

        for step in range(num_steps):
            buffer = np.uint32(step % 2)
            has_next = step + 1 < num_steps
            if has_next:
                next_k = (step + 1) * BLOCK_K + load_k
                x_words = read_chunk(x, m0 + load_row, next_k)
                w_words = read_chunk(weight, n0 + load_row, next_k)
            # Four k per trip, written out: NVVM leaves this loop rolled, and the loop
            # overhead would be a fifth of the instructions. k is unsigned so that Numba
            # emits no negative-index wraparound code for the shared-memory reads.
            for k in range(np.uint64(0), np.uint64(BLOCK_K), np.uint64(4)):
                _rank_one_update(acc, a_frag, b_frag, a_tiles, b_tiles, buffer, k, tm, tn)
                _rank_one_update(acc, a_frag, b_frag, a_tiles, b_tiles, buffer, k + np.uint64(1), tm, tn)
                _rank_one_update(acc, a_frag, b_frag, a_tiles, b_tiles, buffer, k + np.uint64(2), tm, tn)
                _rank_one_update(acc, a_frag, b_frag, a_tiles, b_tiles, buffer, k + np.uint64(3), tm, tn)
            if has_next:
                _stage(a_tiles, 1 - buffer, load_k, load_row, x_words)
                _stage(b_tiles, 1 - buffer, load_k, load_row, w_words)
            cuda.syncthreads()

        for i in range(MICRO):
            row = m0 + tm + (i // STRIP) * HALF + i % STRIP
            if row < out.shape[0]:
                for j in range(MICRO):
                    col = n0 + tn + (j // STRIP) * HALF + j % STRIP
                    if col < out.shape[1]:
                        store(out, row, col, acc[i, j])

    return gemm


# --8<-- [end:kernel]


def gemm(x, weight, out, *, accumulate: bool = False, stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T with the tiled kernel (any shape; best for large M);
    with `accumulate`, out += the product."""
    m, n, _ = check_linear(x, weight, out, accumulate=accumulate)
    read_chunk = read_chunk_aligned if rows_of_eight(x, weight) else read_chunk_ragged
    kernel = gemm_kernel(read_chunk, store_for(out, accumulate))
    grid = ((n + BLOCK_N - 1) // BLOCK_N, (m + BLOCK_M - 1) // BLOCK_M)
    kernel[grid, THREADS, stream](x, weight, out)
