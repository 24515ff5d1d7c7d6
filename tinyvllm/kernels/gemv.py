"""The matrix product for a few rows of X (decode): a matrix-vector product, memory-bound.

    Y[M, N] = X[M, K] @ W[N, K]^T        (M <= MAX_ROWS; X, W bf16; float32 sums)

With M this small each weight is used only M times after it is read, so the kernel runs
at the speed W streams out of device memory: every byte of W is read once, in 16-byte
loads, with enough of them in flight to cover the ~1 us latency of device memory.

Each block of T threads owns R consecutive rows of W at a time (a row group). Thread t
takes the 8-element chunks t, t + T, t + 2T, ... along K, `depth` of them at a time: it
issues every load of those chunks (one 16-byte load per row of W and per row of X,
`chunk_fetcher`) before its first multiply, so it waits for device memory once per
`depth` chunks, with depth x (R + M) loads in flight. No kernel writes W, so under
programmatic dependent launch (`pdl.py`) a block issues its first weight loads even before
the kernel ahead of it, which writes X, has finished; in a decode step's graph the weights
of one product start streaming while the kernel before it drains. Rows past N read the
last row again instead of branching, and their sums are not stored.

At M = 1 the grid holds at most BLOCKS_PER_SM blocks per SM; past that, block b takes
row groups b, b + grid, b + 2 grid, ..., and issues the first loads of its next group
before it reduces the current one, so its loads never stop for the reduction's barriers,
and no second wave of blocks starts part empty.

The launch shape (`launch_shape`) was measured on the H200 (`python -m perf.bench_gemm
--sweep`, weights streamed through a graph with PDL): T is the largest power of two that
leaves each thread CHUNKS_PER_THREAD chunks, within [MIN_THREADS, MAX_THREADS]; R is 4 for
rows longer than LONG_ROW or (at M = 1) products at least WIDE_OUTPUT wide, else 2; depth
is all of a thread's chunks, as far as WORD_BUDGET registers hold them and NVVM still
unrolls the products (UNROLLED_PRODUCTS, below). On gate|up
(K = 2048, N = 8192) that is 64 threads x 4 rows x 4 chunks and 1,056 blocks looping over
2,048 row groups: 3.78 to 3.80 TB/s, where one block per row group streamed 3.29 (and the
former 64 x 2, 3.33); the fused gate|up with SiLU of a decode step 3.98. At K = 8192 (the
down projection, N = 2048) 128 x 4 x 4 streams 3.72, one block per group (512 of them fit
at once). The o projection (N = 2048) keeps two rows a block: four streamed 2.5 where two
stream 2.76. Past M = 1 the grid is one block per row group and wide products keep two
rows a block: four rows and the capped grid were measured only at M = 1, and with four
rows of W and four of X the register budget holds only three chunks at once (the gate|up
product at M = 4 took 2.6 times as long).

A thread's loaded chunks stay in registers only while NVVM unrolls the loops over them
completely: every index into the chunk arrays must be a constant. It does so up to about
36 (chunk slot, row of W, row of X) products a thread; past that the chunk-slot loop stays
a loop, and its arrays are indexed at run time and live in local memory, which is device
memory. Compiled for sm_90 (`python -m perf.kernel_registers --batch 4`), the down
projection (four rows a block) kept a 288- to 384-byte stack frame at M = 4 to 8, where
three or two chunk slots made 40 to 64 products. So depth is also capped at
UNROLLED_PRODUCTS / (R x M).

X is read from global memory, not staged in shared memory: it is M x K x 2 bytes, every
block reads the same bytes, so after the first blocks they come from L1/L2 and cost no
device-memory bandwidth, and no barrier is needed before the loop starts.

Each thread ends with R x M partial dot products. They are summed across the block in
one shared-memory tree for all of them at once: log2(T) barriers in total, where
`reduce.block_sum` would take two barriers per sum (and the simulator pays dearly for
every barrier). Then the kernel's *epilogue* stores what the block owns: in the plain
product (`store_sums`) thread v writes sum v.

M is a compile-time constant (one kernel per M, built on first use), so the accumulators
stay in registers; past M = 8 they and the loaded chunks would no longer fit, which is why
MAX_ROWS is 8.

SwiGLU in the store (`gemv_silu_mul`). The MLP's gate|up weight interleaves its rows
(gate row j, then up row j: `activation.py`), so a block's R rows are whole (gate, up)
pairs, and after the reduction the block holds both factors of each output it owns. It
stores silu(gate) * up instead of the two sums: the activation's own kernel, and the
round trip of the 2I-wide product through device memory, drop out of the step. The sums
are rounded to bf16 first, as the unfused path stores them, so that both paths give the
same bits. RoPE and the KV write go into the q|k|v product's store the same way
(`gemv_rope.py`), with the rows of W taken in RoPE's pairs (the kernel's `weight_row`).
"""

import functools

import numpy as np
from numba import cuda, float32, uint32

from tinyvllm.kernels.activation import silu_times
from tinyvllm.kernels.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.checks import check_array
from tinyvllm.kernels.gemm import STORES, check_linear, read_chunk_ragged, rows_of_eight, store_bf16
from tinyvllm.kernels.multiprocessors import multiprocessor_count
from tinyvllm.kernels.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.vector_io import VECTOR, high_half, load_words, low_half

MIN_THREADS = 64
MAX_THREADS = 256
WORDS = VECTOR // 2
CHUNKS_PER_THREAD = 8
LONG_ROW = 4096
WIDE_OUTPUT = 3072
"""Rows of W longer than LONG_ROW go four to a block, as do those of a product at least
WIDE_OUTPUT wide at M = 1; others two."""
BLOCKS_PER_SM = 8
"""At M = 1, the grid's size per SM past which blocks loop over row groups."""
MAX_ROWS = 8
WORD_BUDGET = 96
"""32-bit registers a thread may hold loaded chunks in (W rows and X rows, `depth` deep)."""
UNROLLED_PRODUCTS = 32
"""Chunk slots x rows of W x rows of X a thread may multiply: the loops NVVM unrolls
completely, so that the chunks stay in registers (see above)."""


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
def gemv_kernel(m_rows: int, read_chunk, epilogue, threads: int, rows_per_block: int, depth: int,
                weight_row=consecutive_rows):
    """The kernel for exactly m_rows rows of X and one chunk reader, for blocks of `threads`
    threads (a power of two) that load `depth` chunks a thread before using any.

    A block's group of rows_per_block rows starts at n0 (a multiple of rows_per_block); its
    row r is W's row weight_row(n0, r). After the block's reduction, partials[r * M + m, 0]
    holds the sum of that row with X row m, and `epilogue(partials, tid, n0, out)` stores
    what the block owns: sums as they are (`store_sums`), silu(gate) * up (`gemv_silu_mul`),
    or rotated q and k heads and the KV cache rows (`gemv_rope.py`).
    """
    sums = rows_per_block * m_rows

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

    @cuda.jit(device=True, inline=True)
    def accumulate(d, w_words, x_words, acc):
        """acc[r, m] += W row r . X row m over chunk slot d's eight columns."""
        for m in range(m_rows):
            for r in range(rows_per_block):
                total = acc[r, m]
                for i in range(WORDS):
                    total += low_half(w_words[d, r, i]) * low_half(x_words[d, m, i])
                    total += high_half(w_words[d, r, i]) * high_half(x_words[d, m, i])
                acc[r, m] = total

    @cuda.jit(device=True, inline=True)
    def reduce(acc, partials, tid):
        """Sum every thread's acc across the block: partials[r * M + m, 0] holds the totals."""
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

    @cuda.jit
    def gemv(x, weight, out):
        partials = cuda.shared.array((sums, threads), float32)
        acc = cuda.local.array((rows_per_block, m_rows), float32)
        w_words = cuda.local.array((depth, rows_per_block, WORDS), uint32)
        x_words = cuda.local.array((depth, m_rows, WORDS), uint32)
        tid = np.uint32(cuda.threadIdx.x)
        num_chunks = np.uint32((x.shape[1] + VECTOR - 1) // VECTOR)
        group_stride = np.uint32(cuda.gridDim.x) * rows_per_block
        n0 = np.uint32(cuda.blockIdx.x) * rows_per_block
        # A thread's loads all go out before its first multiply, so it waits for device
        # memory once per `depth` chunks. No kernel writes W: its first loads go out even
        # before the kernel ahead (which writes X) has finished (`pdl`).
        allow_dependent_launch()
        if tid < num_chunks:
            fetch_weight(weight, n0, tid, num_chunks, w_words)
        wait_for_prior_grid()
        while n0 < weight.shape[0]:
            for r in range(rows_per_block):
                for m in range(m_rows):
                    acc[r, m] = float32(0.0)
            chunk = tid
            while chunk < num_chunks:
                fetch_x(x, 0, chunk, num_chunks, x_words)
                for d in range(depth):
                    if chunk + d * threads < num_chunks:
                        accumulate(d, w_words, x_words, acc)
                chunk += depth * threads
                if chunk < num_chunks:
                    fetch_weight(weight, n0, chunk, num_chunks, w_words)
            # The block's next rows start streaming under this group's reduction.
            next_n0 = n0 + group_stride
            if next_n0 < weight.shape[0] and tid < num_chunks:
                fetch_weight(weight, next_n0, tid, num_chunks, w_words)
            reduce(acc, partials, tid)
            epilogue(partials, tid, n0, out)
            n0 = next_n0
            if n0 < weight.shape[0]:
                cuda.syncthreads()  # before the next group writes partials again

    return gemv
# --8<-- [end:kernel]


def gemv(x, weight, out, *, stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T for M <= MAX_ROWS, one pass over weight."""
    check_linear(x, weight, out)
    launch(x, weight, out, functools.partial(store_sums, STORES[np.dtype(out.dtype)]), stream=stream)


def launch(x, weight, out, make_epilogue, weight_row=consecutive_rows, *, stream=0) -> None:
    """The kernel for x's row count over all of weight's rows (operands already checked);
    make_epilogue(M, rows_per_block) gives its epilogue for the launch shape chosen."""
    m, k = x.shape
    if m > MAX_ROWS:
        raise ValueError(f"x: gemv takes at most {MAX_ROWS} rows, got {m}")
    read_chunk = read_chunk_whole if rows_of_eight(x, weight) else read_chunk_ragged
    threads, rows_per_block, depth, blocks = launch_shape(k, weight.shape[0], m, multiprocessor_count())
    kernel = gemv_kernel(m, read_chunk, make_epilogue(m, rows_per_block), threads, rows_per_block, depth, weight_row)
    kernel[blocks, threads, stream](x, weight, out)


def launch_shape(k: int, n: int, m: int, num_sms: int) -> tuple[int, int, int, int]:
    """(threads, rows of W per block, chunks a thread loads at once, blocks) for an N x K
    weight and m rows of x, on a GPU of num_sms SMs (see above)."""
    chunks = -(-k // VECTOR)
    share = chunks // CHUNKS_PER_THREAD
    threads = min(MAX_THREADS, max(MIN_THREADS, 1 << max(0, share.bit_length() - 1)))
    wide = m == 1 and n >= WIDE_OUTPUT
    rows_per_block = 4 if k > LONG_ROW or wide else 2
    depth = max(1, min(-(-chunks // threads), WORD_BUDGET // ((rows_per_block + m) * WORDS),
                       UNROLLED_PRODUCTS // (rows_per_block * m)))
    groups = -(-n // rows_per_block)
    blocks = min(groups, BLOCKS_PER_SM * num_sms) if m == 1 else groups
    return threads, rows_per_block, depth, blocks


@functools.cache
def store_silu_mul(m_rows: int, rows_per_block: int):
    """SwiGLU's epilogue: rows 2j and 2j + 1 of a group are a (gate, up) pair; thread
    (pair, m) stores silu(gate) * up, both sums rounded to bf16 first as the unfused path
    stores them."""
    pairs = rows_per_block // 2 * m_rows

    @cuda.jit(device=True, inline=True)
    def epilogue(partials, tid, n0, out):
        pair = tid // m_rows
        m = tid % m_rows
        row = n0 // 2 + pair
        if tid < pairs and row < out.shape[1]:
            gate = bf16_to_f32(f32_to_bf16(partials[2 * pair * m_rows + m, 0]))
            up = bf16_to_f32(f32_to_bf16(partials[(2 * pair + 1) * m_rows + m, 0]))
            store_bf16(out, m, row, silu_times(gate, up))

    return epilogue


def gemv_silu_mul(x, weight, out, *, stream=0) -> None:
    """out[M, I] = silu(gate) * up of x[M, K] @ weight[2I, K]^T, whose rows interleave gate and up.

    One pass over weight, as `gemv`; out is bf16.
    """
    m, k = check_array("x", x, np.uint16, (None, None))
    _, intermediate = check_array("out", out, np.uint16, (m, None))
    check_array("weight", weight, np.uint16, (2 * intermediate, k))
    if min(m, intermediate, k) == 0:
        raise ValueError(f"linear: empty operand (M={m}, I={intermediate}, K={k})")
    launch(x, weight, out, store_silu_mul, stream=stream)
