"""The matrix product for a few rows of X (decode): a matrix-vector product, memory-bound.

    Y[M, N] = X[M, K] @ W[N, K]^T        (M <= MAX_ROWS; X, W bf16; float32 sums)

With M this small each weight is used only M times after it is read, so the kernel runs
at the speed W streams out of device memory: every byte of W is read once, in 16-byte
loads, with enough of them in flight to cover the ~1 us latency of device memory.

Each block of T threads owns ROWS_PER_BLOCK consecutive rows of W. Thread t takes the
8-element chunks t, t + T, t + 2T, ... along K. For each chunk it issues
all of its loads together (`fetch`: one 16-byte load per row of W and per row of X), and
it fetches the next chunk before doing the arithmetic on the current one, so a thread
always has ROWS_PER_BLOCK + M loads in flight. (Written as one loop with the loads next
to their use, the compiler interleaves the loads with the arithmetic and a thread waits
for device memory once per row instead of once per chunk.) That overlap needs two chunks
a thread at least, so T is the largest power of two that leaves each thread two chunks,
within [MIN_THREADS, MAX_THREADS] (`threads_for`): at K = 2048, 128 threads stream the
2048 -> 8192 product at 3.21 TB/s where 256 threads (one chunk each) reach 2.93 (H200,
`python -m perf.bench_gemm --sweep`). Rows past N read the last row again
instead of branching, and their sums are not stored.

X is read from global memory, not staged in shared memory: it is M x K x 2 bytes, every
block reads the same bytes, so after the first blocks they come from L1/L2 and cost no
device-memory bandwidth, and no barrier is needed before the loop starts.

Each thread ends with ROWS_PER_BLOCK x M partial dot products. They are summed across the
block in one shared-memory tree for all of them at once: log2(T) barriers in
total, where `reduce.block_sum` would take two barriers per sum (and the simulator pays
dearly for every barrier). Thread v then writes sum v.

M is a compile-time constant (one kernel per M, built on first use), so the accumulators
stay in registers: M = 8 already takes ~170 registers a thread, which is why MAX_ROWS
is 8.

SwiGLU in the store (`gemv_silu_mul`). The MLP's gate|up weight interleaves its rows
(gate row j, then up row j: `activation.py`), so a block's ROWS_PER_BLOCK rows are whole
(gate, up) pairs, and after the reduction the block holds both factors of each output it
owns. It stores silu(gate) * up instead of the two sums: the activation's own kernel,
and the round trip of the 2I-wide product through device memory, drop out of the step.
The sums are rounded to bf16 first, as the unfused path stores them, so that both paths
give the same bits.
"""

import functools

import numpy as np
from numba import cuda, float32, uint32

from tinyvllm.kernels.activation import silu_times
from tinyvllm.kernels.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.checks import check_array
from tinyvllm.kernels.gemm import STORES, check_linear, read_chunk_ragged, rows_of_eight, store_bf16
from tinyvllm.kernels.vector_io import VECTOR, high_half, load_words, low_half

MIN_THREADS = 64
MAX_THREADS = 256
WORDS = VECTOR // 2
ROWS_PER_BLOCK = 4
MAX_ROWS = 8


@cuda.jit(device=True, inline=True)
def read_chunk_whole(array, row, col):
    """Chunk (row, col:col+8) in one 16-byte load; the caller keeps row and col inside."""
    return load_words(array[row], col)


# --8<-- [start:kernel]
@functools.cache
def gemv_kernel(
    m_rows: int, read_chunk, store, threads: int, rows_per_block: int = ROWS_PER_BLOCK, gated: bool = False
):
    """The kernel for exactly m_rows rows of X, one chunk reader and one output store,
    for blocks of `threads` threads (a power of two); `gated` stores silu(gate) * up of
    each pair of rows (rows_per_block even) instead of both sums."""
    sums = rows_per_block * m_rows

    @cuda.jit(device=True, inline=True)
    def fetch(weight, x, n0, col, w_words, x_words):
        """Issue every load of one chunk step: rows_per_block rows of W, m_rows rows of X."""
        last_row = weight.shape[0] - 1
        for r in range(rows_per_block):
            words = read_chunk(weight, min(n0 + r, last_row), col)
            for i in range(WORDS):
                w_words[r, i] = words[i]
        for m in range(m_rows):
            words = read_chunk(x, m, col)
            for i in range(WORDS):
                x_words[m, i] = words[i]

    @cuda.jit
    def gemv(x, weight, out):
        partials = cuda.shared.array((sums, threads), float32)
        acc = cuda.local.array((rows_per_block, m_rows), float32)
        w_words = cuda.local.array((rows_per_block, WORDS), uint32)
        x_words = cuda.local.array((m_rows, WORDS), uint32)
        w_values = cuda.local.array((rows_per_block, VECTOR), float32)
        x_values = cuda.local.array((m_rows, VECTOR), float32)
        tid = np.uint32(cuda.threadIdx.x)
        n0 = np.uint32(cuda.blockIdx.x) * rows_per_block

        for r in range(rows_per_block):
            for m in range(m_rows):
                acc[r, m] = float32(0.0)

        num_chunks = (x.shape[1] + VECTOR - 1) // VECTOR
        chunk = tid
        if chunk < num_chunks:
            fetch(weight, x, n0, chunk * VECTOR, w_words, x_words)
        while chunk < num_chunks:
            for r in range(rows_per_block):
                for i in range(WORDS):
                    w_values[r, 2 * i] = low_half(w_words[r, i])
                    w_values[r, 2 * i + 1] = high_half(w_words[r, i])
            for m in range(m_rows):
                for i in range(WORDS):
                    x_values[m, 2 * i] = low_half(x_words[m, i])
                    x_values[m, 2 * i + 1] = high_half(x_words[m, i])
            chunk += threads
            if chunk < num_chunks:
                fetch(weight, x, n0, chunk * VECTOR, w_words, x_words)
            for m in range(m_rows):
                for r in range(rows_per_block):
                    total = acc[r, m]
                    for i in range(VECTOR):
                        total += w_values[r, i] * x_values[m, i]
                    acc[r, m] = total

        for r in range(rows_per_block):
            for m in range(m_rows):
                partials[r * m_rows + m, tid] = acc[r, m]
        cuda.syncthreads()
        stride = threads // 2
        while stride > 0:
            if tid < stride:
                for v in range(sums):
                    partials[v, tid] += partials[v, tid + stride]
            cuda.syncthreads()
            stride //= 2
        if gated:
            pair = tid // m_rows
            m = tid % m_rows
            row = n0 // 2 + pair
            if tid < sums // 2 and row < out.shape[1]:
                gate = bf16_to_f32(f32_to_bf16(partials[2 * pair * m_rows + m, 0]))
                up = bf16_to_f32(f32_to_bf16(partials[(2 * pair + 1) * m_rows + m, 0]))
                store(out, m, row, silu_times(gate, up))
        else:
            row = n0 + tid // m_rows
            if tid < sums and row < out.shape[1]:
                store(out, tid % m_rows, row, partials[tid, 0])

    return gemv
# --8<-- [end:kernel]


def gemv(x, weight, out, *, stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T for M <= MAX_ROWS, one pass over weight."""
    check_linear(x, weight, out)
    _launch(x, weight, out, STORES[np.dtype(out.dtype)], False, stream)


def _launch(x, weight, out, store, gated: bool, stream) -> None:
    """The kernel for x's row count over all of weight's rows (operands already checked)."""
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"x: gemv takes at most {MAX_ROWS} rows, got {m}")
    read_chunk = read_chunk_whole if rows_of_eight(x, weight) else read_chunk_ragged
    threads = threads_for(k)
    kernel = gemv_kernel(m, read_chunk, store, threads, gated=gated)
    kernel[-(-weight.shape[0] // ROWS_PER_BLOCK), threads, stream](x, weight, out)


def threads_for(k: int) -> int:
    """The block size for rows of length k: two chunks a thread or more (see above)."""
    half_the_chunks = -(-k // VECTOR) // 2
    return min(MAX_THREADS, max(MIN_THREADS, 1 << max(0, half_the_chunks.bit_length() - 1)))


def gemv_silu_mul(x, weight, out, *, stream=0) -> None:
    """out[M, I] = silu(gate) * up of x[M, K] @ weight[2I, K]^T, whose rows interleave gate and up.

    One pass over weight, as `gemv`; out is bf16.
    """
    m, k = check_array("x", x, np.uint16, (None, None))
    _, intermediate = check_array("out", out, np.uint16, (m, None))
    check_array("weight", weight, np.uint16, (2 * intermediate, k))
    if min(m, intermediate, k) == 0:
        raise ValueError(f"linear: empty operand (M={m}, I={intermediate}, K={k})")
    _launch(x, weight, out, store_bf16, True, stream)
