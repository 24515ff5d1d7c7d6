"""The GEMV's launch shape: threads, rows of W per block, chunks a thread keeps in flight, blocks.

T threads a block, R rows of W a block, `depth` chunks a thread loads before its first
multiply, as `gemv.py` describes the kernel. The launch shape (`launch_shape`) comes from a
sweep on the H200 (`python -m perf.bench_gemm --sweep`, weights streamed through a graph
with PDL; its runs are in perf/LOG.md): T is the largest power of two that leaves each
thread CHUNKS_PER_THREAD chunks, within [MIN_THREADS, MAX_THREADS]; R is 4 for rows longer
than LONG_ROW or (at M = 1) products at least WIDE_OUTPUT wide, else 2; depth is all of a
thread's chunks, as far as WORD_BUDGET registers hold them and NVVM still unrolls the
products (UNROLLED_PRODUCTS, below). On gate|up (K = 2048, N = 8192) that is 64 threads x 4
rows x 4 chunks and 1,056 blocks looping over 2,048 row groups, which stream 3.78 TB/s where
one block per row group streams 3.29. The o projection (N = 2048) keeps two rows a block,
which stream faster there than four. Past M = 1 the grid is one block per row group and wide
products keep two rows a block: with four rows of W and four of X the register budget holds
only three chunks at once, and the M = 1 shape made those products slower.

A thread's loaded chunks stay in registers only while NVVM unrolls the loops over them
completely: every index into the chunk arrays must be a constant. It does so up to about
36 (chunk slot, row of W, row of X) products a thread; past that the chunk-slot loop stays
a loop, and its arrays are indexed at run time and live in local memory, which is device
memory (`python -m perf.kernel_registers --batch 4` shows such a stack frame when a down
projection's chunk slots make 40 to 64 products at M = 4 to 8). So depth is also capped at
UNROLLED_PRODUCTS / (R x M), or / ((R + 1) x M) when the kernel also applies the norm
(`gemv.py`, "RMSNorm in the product"), whose gain and squares add work per chunk as a row of W would.
"""

from tinyvllm.kernels.device.vector_io import VECTOR

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
"""The most rows of x: past 8 the accumulators and loaded chunks no longer fit in registers."""
WORD_BUDGET = 96
"""32-bit registers a thread may hold loaded chunks in (W rows and X rows, `depth` deep)."""
UNROLLED_PRODUCTS = 32
"""Chunk slots x rows of W x rows of X a thread may multiply: the loops NVVM unrolls
completely, so that the chunks stay in registers (see above). Normalizing, the gain and
the squares count as one more row of W: at M = 8 two slots kept a 352-byte stack frame."""


def launch_shape(k: int, n: int, m: int, num_sms: int, normalize: bool = False) -> tuple[int, int, int, int]:
    """(threads, rows of W per block, chunks a thread loads at once, blocks) for an N x K
    weight and m rows of x (and normalizing one row of gain), on a GPU of num_sms SMs
    (see above)."""
    chunks = -(-k // VECTOR)
    share = chunks // CHUNKS_PER_THREAD
    threads = min(MAX_THREADS, max(MIN_THREADS, 1 << max(0, share.bit_length() - 1)))
    wide = m == 1 and n >= WIDE_OUTPUT
    rows_per_block = 4 if k > LONG_ROW or wide else 2
    depth = max(
        1,
        min(
            -(-chunks // threads),
            WORD_BUDGET // ((rows_per_block + m + normalize) * WORDS),
            UNROLLED_PRODUCTS // ((rows_per_block + normalize) * m),
        ),
    )
    groups = -(-n // rows_per_block)
    blocks = min(groups, BLOCKS_PER_SM * num_sms) if m == 1 else groups
    return threads, rows_per_block, depth, blocks
