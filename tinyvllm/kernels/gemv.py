"""The matrix product for a few rows of X (decode): a matrix-vector product, memory-bound.

    Y[M, N] = X[M, K] @ W[N, K]^T        (M <= MAX_ROWS; X, W bf16; float32 sums)
    Y[M, N] = rmsnorm(X) @ W^T           (`norm`: the RMSNorm before the product, below)
    Y[M, N] += X @ W^T                   (`accumulate`: a sublayer's output into the residual)

With M this small each weight is used only M times after it is read, so the kernel runs
at the speed W streams out of device memory: every byte of W is read once, in 16-byte
loads, with enough of them in flight to cover the ~1 us latency of device memory.

Each block of T threads owns R consecutive rows of W at a time (a row group). Thread t
takes the 8-element chunks t, t + T, t + 2T, ... along K, `depth` of them at a time: it
issues every load of those chunks (one 16-byte load per row of W and per row of X,
`chunk_fetcher`) before its first multiply, so it waits for device memory once per
`depth` chunks, with depth x (R + M) loads in flight. No kernel writes W, so under
programmatic dependent launch (`device/pdl.py`) a block issues its first weight loads even before
the kernel ahead of it, which writes X, has finished; in a decode step's graph the weights
of one product start streaming while the kernel before it drains. Rows past N read the
last row again instead of branching, and their sums are not stored.

At M = 1 the grid holds at most BLOCKS_PER_SM blocks per SM; past that, block b takes
row groups b, b + grid, b + 2 grid, ..., and issues the first loads of its next group
before it reduces the current one, so its loads never stop for the reduction's barriers,
and no second wave of blocks starts part empty.

The launch shape (threads, rows of W per block, chunks in flight, blocks) is `gemv_shape.py`'s.

X is read from global memory, not staged in shared memory: it is M x K x 2 bytes, every
block reads the same bytes, so after the first blocks they come from L1/L2 and cost no
device-memory bandwidth, and no barrier is needed before the loop starts.

Each thread ends with R x M partial dot products. They are summed across the block in
one shared-memory tree for all of them at once: log2(T) barriers in total, where
`reduce.block_sum` would take two barriers per sum (and the simulator pays dearly for
every barrier). Then the kernel's *epilogue* stores what the block owns: in the plain
product (`store_sums`) thread v writes sum v.

RMSNorm in the product. A Llama block normalises the residual stream before its q|k|v and
its gate|up products, and the final norm comes before the LM head:

    rmsnorm(x) @ W^T = r * (x * g) @ W^T,        r = 1 / sqrt(mean_k(x[k]^2) + eps)

so the kernel reads the residual row x itself, multiplies each chunk by the gain g as it
multiplies, and adds the chunk's squares to one more running sum per row of X. That sum
goes through the block's reduction with the others, and the thread that finishes the
reduction scales the block's sums by r before the epilogue reads them. No barrier comes
before the loop and no normalised row is stored: the norm's own kernel and its round trip
through memory drop out of the step. Its sums differ from the unfused path's only in that
the normalised row is never rounded to bf16. The residual add that comes before the norm
goes into the store of the product before it (`accumulate`): each block loads the
residual elements its sums go to when it starts a row group, and stores their sum in place.

Two products take the operator after them into their store: SwiGLU (`gemv_silu.py`) and
RoPE with the KV write (`gemv_rope.py`).

M is a compile-time constant (one kernel per M, built on first use), so the accumulators
stay in registers; past M = 8 they and the loaded chunks would no longer fit, which is why
MAX_ROWS is 8.
"""

import functools
import math

import numpy as np
from numba import cuda, float32, uint32

from tinyvllm.kernels.device.bf16 import bf16_to_f32
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.multiprocessors import multiprocessor_count
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.simulator import launch_bounds
from tinyvllm.kernels.device.vector_io import VECTOR, high_half, load_words, low_half
from tinyvllm.kernels.gemm import check_linear
from tinyvllm.kernels.gemm_copies import read_chunk_ragged, rows_of_eight
from tinyvllm.kernels.gemm_stores import STORES
from tinyvllm.kernels.gemv_shape import BLOCKS_PER_SM, MAX_ROWS, MIN_THREADS, WORDS, launch_shape
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.kernels.rmsnorm import check_norm


@cuda.jit(device=True, inline=True)
def read_chunk_whole(array, row, col):
    """Chunk (row, col:col+8) in one 16-byte load; the caller keeps row and col inside."""
    return load_words(array[row], col)


# --8<-- [start:kernel]
@cuda.jit(device=True, inline=True)
def consecutive_rows(n0, r):
    """Row r of the group that starts at row n0: the rows of W in order."""
    return n0 + r


@functools.cache
def store_sums(store, m_rows: int, rows_per_block: int):
    """The plain epilogue: thread v stores sum v (W row n0 + v // M, X row v % M) to `out`."""
    sums = rows_per_block * m_rows

    @cuda.jit(device=True, inline=True)
    def epilogue(partials, tid, n0, out):
        row = n0 + tid // m_rows
        if tid < sums and row < out.shape[1]:
            store(out, tid % m_rows, row, partials[tid, 0])

    return epilogue


@functools.cache
def gemv_kernel(
    m_rows: int,
    read_chunk,
    epilogue,
    threads: int,
    rows_per_block: int,
    depth: int,
    weight_row=consecutive_rows,
    normalize: bool = False,
    accumulate: bool = False,
):
    """The kernel for exactly m_rows rows of X and one chunk reader, for blocks of `threads`
    threads (a power of two) that load `depth` chunks a thread before using any:
    gemv(x, weight, out), or with `normalize` gemv(x, gain, eps, weight, out), the product
    of rmsnorm(x) * gain (the gain a [1, K] matrix). With `accumulate` (for `store_sums`
    only), thread v's sum v starts from the element of out that it is stored to.

    A block's group of rows_per_block rows starts at n0 (a multiple of rows_per_block); its
    row r is W's row weight_row(n0, r). After the block's reduction, partials[r * M + m, 0]
    holds the sum of that row with X row m, and `epilogue(partials, tid, n0, out)` stores
    what the block owns: sums as they are (`store_sums`), silu(gate) * up (`gemv_silu.py`),
    or rotated q and k heads and the KV cache rows (`gemv_rope.py`).
    """
    sums = rows_per_block * m_rows
    # The partial sums a thread adds to the reduction: the products, then (normalizing)
    # each X row's sum of squares.
    totals = sums + m_rows if normalize else sums

    def chunk_fetcher(rows, row_of):
        @cuda.jit(device=True, inline=True)
        def fetch(array, first_row, chunk, num_chunks, words_out):
            """Issue the loads of `rows` rows of array from first_row, for chunk slots
            0..depth-1 from `chunk`. Rows past the end read the last row again, slots past
            the last chunk the last chunk: their sums are never stored."""
            last_row = array.shape[0] - 1
            for d in range(depth):
                col = min(chunk + d * threads, num_chunks - 1) * VECTOR
                for r in range(rows):
                    words = read_chunk(array, min(row_of(first_row, r), last_row), col)
                    for i in range(WORDS):
                        words_out[d, r, i] = words[i]

        return fetch

    fetch_weight = chunk_fetcher(rows_per_block, weight_row)
    fetch_x = chunk_fetcher(m_rows, consecutive_rows)
    fetch_gain = chunk_fetcher(1, consecutive_rows)

    @cuda.jit(device=True, inline=True)
    def multiply_add(d, w_words, x_words, g_words, acc, squares):
        """acc[r, m] += W row r . X row m over chunk slot d's eight columns; normalizing, X
        row m times the gain, and squares[m] += the squares of X row m's eight."""
        for m in range(m_rows):
            for i in range(WORDS):
                low, high = low_half(x_words[d, m, i]), high_half(x_words[d, m, i])
                if normalize:
                    squares[m] += low * low + high * high
                    low *= low_half(g_words[d, 0, i])
                    high *= high_half(g_words[d, 0, i])
                for r in range(rows_per_block):
                    acc[r, m] += low_half(w_words[d, r, i]) * low
                    acc[r, m] += high_half(w_words[d, r, i]) * high

    @cuda.jit(device=True, inline=True)
    def reduce(acc, squares, partials, tid, eps, k):
        """Sum every thread's acc (and squares) across the block: partials[r * M + m, 0]
        holds the totals, normalizing already scaled by X row m's 1 / rms."""
        for r in range(rows_per_block):
            for m in range(m_rows):
                partials[r * m_rows + m, tid] = acc[r, m]
        if normalize:
            for m in range(m_rows):
                partials[sums + m, tid] = squares[m]
        cuda.syncthreads()
        stride = threads // 2
        while stride > 0:
            if tid < stride:
                for v in range(totals):
                    partials[v, tid] += partials[v, tid + stride]
            if normalize and stride == 1 and tid == 0:
                for m in range(m_rows):
                    scale = float32(1.0) / math.sqrt(partials[sums + m, 0] / k + eps)
                    for r in range(rows_per_block):
                        partials[r * m_rows + m, 0] *= scale
            cuda.syncthreads()
            stride //= 2

    @cuda.jit(device=True, inline=True)
    def run(x, gain, eps, weight, out):
        partials = cuda.shared.array((totals, threads), float32)
        acc = cuda.local.array((rows_per_block, m_rows), float32)
        squares = cuda.local.array(m_rows, float32)
        w_words = cuda.local.array((depth, rows_per_block, WORDS), uint32)
        x_words = cuda.local.array((depth, m_rows, WORDS), uint32)
        g_words = cuda.local.array((depth, 1, WORDS), uint32)
        k = float32(x.shape[1])
        tid = np.uint32(cuda.threadIdx.x)
        num_chunks = np.uint32((x.shape[1] + VECTOR - 1) // VECTOR)
        group_stride = np.uint32(cuda.gridDim.x) * rows_per_block
        n0 = np.uint32(cuda.blockIdx.x) * rows_per_block
        # A thread's loads all go out before its first multiply, so it waits for device
        # memory once per `depth` chunks. No kernel writes W: its first loads go out even
        # before the kernel ahead (which writes X) has finished (`pdl`). The gain is a
        # weight too; a thread whose chunks all fit in one pass keeps its chunks of the
        # gain for every row group.
        one_pass = num_chunks <= depth * threads
        allow_dependent_launch()
        if tid < num_chunks:
            fetch_weight(weight, n0, tid, num_chunks, w_words)
            if normalize:
                fetch_gain(gain, 0, tid, num_chunks, g_words)
        wait_for_prior_grid()
        while n0 < weight.shape[0]:
            # What the sum adds to is loaded now, so that the store does not wait for it.
            prior = float32(0.0)
            if accumulate and tid < sums and n0 + tid // m_rows < out.shape[1]:
                prior = bf16_to_f32(out[tid % m_rows, n0 + tid // m_rows])
            for m in range(m_rows):
                squares[m] = float32(0.0)
                for r in range(rows_per_block):
                    acc[r, m] = float32(0.0)
            chunk = tid
            while chunk < num_chunks:
                fetch_x(x, 0, chunk, num_chunks, x_words)
                if normalize and not (one_pass and chunk == tid):
                    fetch_gain(gain, 0, chunk, num_chunks, g_words)
                for d in range(depth):
                    if chunk + d * threads < num_chunks:
                        multiply_add(d, w_words, x_words, g_words, acc, squares)
                chunk += depth * threads
                if chunk < num_chunks:
                    fetch_weight(weight, n0, chunk, num_chunks, w_words)
            # The block's next rows start streaming under this group's reduction.
            next_n0 = n0 + group_stride
            if next_n0 < weight.shape[0] and tid < num_chunks:
                fetch_weight(weight, next_n0, tid, num_chunks, w_words)
            reduce(acc, squares, partials, tid, eps, k)
            if accumulate and tid < sums:
                partials[tid, 0] += prior  # read back by this thread alone (`store_sums`)
            epilogue(partials, tid, n0, out)
            n0 = next_n0
            if n0 < weight.shape[0]:
                cuda.syncthreads()  # before the next group writes partials again

    # At M = 1 a thread gets at most 128 registers (those of an SM over BLOCKS_PER_SM x
    # MIN_THREADS threads), so that the capped grid runs as one wave: at 136 an SM would
    # hold seven blocks, and the grid's last eighth would wait for a second wave.
    resident = BLOCKS_PER_SM * MIN_THREADS // threads
    bounds = launch_bounds(threads, resident) if m_rows == 1 else {}

    if normalize:

        @cuda.jit(**bounds)
        def gemv_normalized(x, gain, eps, weight, out):
            run(x, gain, eps, weight, out)

        return gemv_normalized

    @cuda.jit(**bounds)
    def gemv(x, weight, out):
        run(x, x, float32(0.0), weight, out)  # only a normalizing kernel reads the gain

    return gemv


# --8<-- [end:kernel]


def gemv(x, weight, out, *, norm: RMSNorm | None = None, accumulate: bool = False, stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T for M <= MAX_ROWS, one pass over weight; of
    rmsnorm(x) * norm.weight with `norm`, and added to out (bf16) with `accumulate`."""
    check_linear(x, weight, out, accumulate=accumulate)
    launch(
        x,
        weight,
        out,
        functools.partial(store_sums, STORES[np.dtype(out.dtype)]),
        norm=norm,
        accumulate=accumulate,
        stream=stream,
    )


def launch(
    x,
    weight,
    out,
    make_epilogue,
    weight_row=consecutive_rows,
    *,
    norm: RMSNorm | None = None,
    accumulate: bool = False,
    stream=0,
) -> None:
    """The kernel for x's row count over all of weight's rows (x, weight and out already
    checked; the norm is checked here); make_epilogue(M, rows_per_block) gives its
    epilogue for the launch shape chosen."""
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"x: gemv takes at most {MAX_ROWS} rows, got {m}")
    normalize = norm is not None
    if normalize:
        check_norm(x, norm)
        gain = norm.weight.reshape(1, k)
    # The gain needs no test of its own: check_norm has found its rows whole and aligned.
    read_chunk = read_chunk_whole if rows_of_eight(x, weight) else read_chunk_ragged
    threads, rows_per_block, depth, blocks = launch_shape(k, weight.shape[0], m, multiprocessor_count(), normalize)
    kernel = gemv_kernel(
        m,
        read_chunk,
        make_epilogue(m, rows_per_block),
        threads,
        rows_per_block,
        depth,
        weight_row,
        normalize,
        accumulate,
    )
    if normalize:
        launch_kernel(kernel, blocks, threads, stream, x, gain, np.float32(norm.eps), weight, out)
    else:
        launch_kernel(kernel, blocks, threads, stream, x, weight, out)
