"""The matrix product of a linear layer on the tensor cores, tiled for large M (prefill).

    Y[M, N] = X[M, K] @ W[N, K]^T        (X, W bf16; accumulate in float32; Y bf16 or float32)
    Y[M, N] += X[M, K] @ W[N, K]^T       (`accumulate`: Y bf16, the sum rounded once)

W keeps HF's [out_features, in_features] orientation, so both operands are read along K,
which is the layout `mma.sync ... .row.col` takes: X row-major (A), W^T column-major (B).
The instructions and their fragment layouts are in `device/mma.py`.

Each block of THREADS = 128 threads (4 warps) computes one 128 x 128 tile of Y, the warps
2 x 2 over it, each a 64 x 64 piece: 4 x 8 mma tiles of 16 x 8 (other shapes, `GemmShape`,
put 4 warps across the tile, each a 64 x 32 piece, or stack a second row of warps under a
256 x 128 tile). A lane holds the float32 accumulators of all 32 (128 registers, rows g and
g + 8, columns 2t and 2t + 1 of each tile, g = lane // 4, t = lane % 4), in a local array
indexed only by unrolled loop counters so that it never leaves the registers. The epilogue
stores them from there (`gemm_stores.py`).

The library's tile configuration is `gemm_tiles.GEMM_SHAPE` (what each of its fields buys
is `gemm_tiles.py`'s docstring). K is walked BLOCK_K = 64 at a time: a step's slices X[128,
64] and W[128, 64] sit in shared memory as unpadded rows whose 16-byte chunks are XOR-
swizzled, so that the 8 rows one ldmatrix reads start in 8 different bank groups. Per 16 of
K (`gemm_multiply.py`) a warp loads its fragments with ldmatrix_x4 (4 for X: the 16 x 16 A
tile of each mma row; 4 for W: b0, b1 of two n8 tiles each) and issues 32 mmas: 8 ldmatrix
for 32 mmas, where a 64 x 32 piece takes 6 for 16. On the branch-free path (below) the next
16's fragments are loaded before this 16's mmas are issued.

The slices come in by cp.async, global to shared with no register in between, into one
of three stages. At the top of step s the block waits for its copies of slice s and meets at
a barrier, which also tells it that every warp is done reading slice s - 1's stage; it then
starts the copies of slice s + 2 into that stage and multiplies slice s while those of s + 1
and s + 2 fly. One barrier a step. Each thread works its copies out once, before the K loop
(`gemm_copies.py`), and the stages are counted, not taken modulo: in the loop a copy costs a
few adds. Three stages of 2 x 16 KB are 96 KB, past the 48 KB of static shared memory: the
tiles are dynamic shared memory, which the kernel opts in to (`gemm_tiles.allow_dynamic_shared`).
A block wholly inside Y first walks, in a loop of its own, the steps whose refill lies wholly
inside K: no predicate on its copies, and each chunk's source one wide multiply-add from a
64-bit address a slice, where the general loop keeps the edges' bounds live and ptxas, short
of registers, recomputes them every step (perf/LOG.md, 2026-12-07). Past it (and in
blocks cut by the edges) a warp wholly inside Y multiplies a whole slice with no branch among
its loads and mmas. Blocks go out in groups of 8 tile rows, so that the blocks resident at
once share W's tiles in L2; the bf16 store writes two outputs as one word.

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

import numba
import numpy as np
from numba import cuda, float32

from tinyvllm.kernels import gemm_multiply as multiply
from tinyvllm.kernels import gemm_tiles as tiles
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.mma import (
    MMA_K,
    MMA_M,
    MMA_N,
    WARP,
    cp_async_commit,
    cp_async_wait,
)
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.simulator import SIMULATOR, launch_bounds
from tinyvllm.kernels.device.vector_io import VECTOR, data_address
from tinyvllm.kernels.gemm_copies import copy_functions, rows_of_eight, stage_chunk_async, stage_chunk_ragged
from tinyvllm.kernels.gemm_stores import pair_store, store_bf16, store_bf16x2, store_for
from tinyvllm.kernels.gemm_tiles import GEMM_SHAPE, GemmShape, allow_dynamic_shared, grid

BLOCK_M, BLOCK_N, BLOCK_K, THREADS = GEMM_SHAPE.block_m, GEMM_SHAPE.block_n, GEMM_SHAPE.block_k, GEMM_SHAPE.threads
TILES_M = tiles.TILES_M
"""The library shape's tile: BLOCK_M x BLOCK_N outputs a block, K walked BLOCK_K at a time."""

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


# --8<-- [start:kernel]
@functools.cache
def gemm_kernel(stage_chunk, store, shape: GemmShape = GEMM_SHAPE):
    """The tiled kernel for one staging function, one output store and one tile shape
    (compiled per triple). With `store_bf16x2` it takes Y's rows viewed as uint32."""
    block_m, block_n, block_k, stages = shape.block_m, shape.block_n, shape.block_k, shape.stages
    row_stride = shape.row_stride
    stage_a, stage_b, rows_per_pass, chunks = shape.stage_a, shape.stage_b, shape.rows_per_pass, shape.chunks_per_row
    shift, mask, tiles_n = shape.swizzle_shift, shape.swizzle_mask, shape.tiles_n
    warp_n_size, warps_n = shape.warp_n, shape.warps_n
    pending, uniform, group_m, grouped = stages - 2, shape.uniform, max(shape.group_m, 1), shape.group_m > 0
    shared_tiles, b_start = tiles.shared_tiles(shape)
    columns = 2 if store is store_bf16x2 else 1  # outputs per element of out
    store_pair = pair_store(store)
    multiply_k16, multiply_slice = multiply.k16_multiplier(shape), multiply.slice_multiplier(shape)

    thread_copies, stage_operand, stage_whole_operand, source_view = copy_functions(shape, stage_chunk)
    # the element-wise staging gains nothing from the interior loop and spills with it
    interior_loop = uniform and stage_chunk is stage_chunk_async
    a_count, b_count = block_m // rows_per_pass, block_n // rows_per_pass  # a thread's chunks of each slice

    @cuda.jit(device=True, inline=True)
    def stage_slice(a_tiles, b_tiles, x_source, w_source, a_copies, b_copies, col, k, fill, fill_k0):
        """Start this thread's copies of the slice at fill_k0 into stage `fill`."""
        k_live = fill_k0 + col < k
        stage_operand(a_tiles, fill * stage_a, x_source, a_copies, a_count, col, fill_k0, k_live)
        stage_operand(b_tiles, b_start + fill * stage_b, w_source, b_copies, b_count, col, fill_k0, k_live)

    @cuda.jit(device=True, inline=True)
    def stage_whole_slice(a_tiles, b_tiles, x_source, w_source, a_copies, b_copies, fill, fill_k0):
        """`stage_slice` for a slice whose every chunk is inside X, W and K (cp.async staging)."""
        stage_whole_operand(a_tiles, fill * stage_a, x_source, a_copies, a_count, fill_k0)
        stage_whole_operand(b_tiles, b_start + fill * stage_b, w_source, b_copies, b_count, fill_k0)

    @cuda.jit(**launch_bounds(shape.threads, shape.blocks_per_sm))
    def gemm(x, weight, out):
        allow_dependent_launch()
        wait_for_prior_grid()
        a_tiles, b_tiles = shared_tiles()
        acc = cuda.local.array((TILES_M, tiles_n, 4), float32)
        for mi in range(TILES_M):
            for ni in range(tiles_n):
                for r in range(4):
                    acc[mi, ni, r] = float32(0.0)
        a_frag = cuda.local.array((2, TILES_M, 4), np.uint32)
        b_frag = cuda.local.array((2, tiles_n, 2), np.uint32)

        # Unsigned indices: Numba adds wraparound code for negative signed ones.
        tid = np.uint32(cuda.threadIdx.x)
        warp, lane = tid // WARP, tid % WARP
        width = np.int64(out.shape[1]) * columns
        if grouped:
            blocks_m = np.uint32((out.shape[0] + block_m - 1) // block_m)
            blocks_n = np.uint32((width + block_n - 1) // block_n)
            tile_m, tile_n = tiles.grouped_tile(np.uint32(cuda.blockIdx.x), blocks_m, blocks_n, np.uint32(group_m))
        else:
            tile_m, tile_n = np.uint32(cuda.blockIdx.y), np.uint32(cuda.blockIdx.x)
        m0, n0 = np.uint32(tile_m) * block_m, np.uint32(tile_n) * block_n
        warp_m = (warp // warps_n) * tiles.WARP_M
        warp_n = (warp % warps_n) * warp_n_size
        copy_row, copy_chunk = tid // chunks, tid % chunks
        # ldmatrix: lanes 8j .. 8j + 7 name rows 0..7 of 8x8 matrix j; for A the matrices
        # are the quarters (rows 8 (j % 2), k 8 (j // 2)), for W (n 8 (j // 2), k 8 (j % 2));
        # tile rows start at multiples of 16, so a lane's swizzle is that of its row in the tile
        matrix, matrix_row = lane // 8, lane % 8
        a_row, b_row = matrix_row + 8 * (matrix % 2), matrix_row + 8 * (matrix // 2)
        a_lane, a_chunk = (warp_m + a_row) * row_stride, tiles.chunk_slot_device(a_row, matrix // 2, shift, mask)
        b_lane, b_chunk = (warp_n + b_row) * row_stride, tiles.chunk_slot_device(b_row, matrix % 2, shift, mask)

        # mma tiles wholly past the edge of Y are skipped: the count is the same for all
        # lanes of a warp, so the warp-collective instructions stay convergent
        live_m = min(max(np.int64(out.shape[0]) - (m0 + warp_m) + MMA_M - 1, 0) // MMA_M, TILES_M)
        live_n = min(max(width - (n0 + warp_n) + MMA_N - 1, 0) // MMA_N, tiles_n)
        k = np.uint32(x.shape[1])
        num_steps = (k + np.uint32(block_k - 1)) // np.uint32(block_k)
        # the steps that take the branch-free path: all of a warp's tiles inside Y, the slice inside K
        whole_steps = k // np.uint32(block_k) if uniform and live_m == TILES_M and live_n == tiles_n else np.uint32(0)
        x_source, w_source = source_view(x), source_view(weight)
        a_copies = thread_copies(np.uint32(x.shape[0]), m0, copy_row, copy_chunk, k, a_count)
        b_copies = thread_copies(np.uint32(weight.shape[0]), n0, copy_row, copy_chunk, k, b_count)
        col = copy_chunk * np.uint32(VECTOR)
        # 32-bit counters, and stages counted, not taken modulo: Numba's loop index and a
        # remainder by 3 are 64-bit arithmetic in every step
        fill, fill_k0 = np.uint32(0), np.uint32(0)
        for s in range(stages - 1):
            if s < num_steps:
                stage_slice(a_tiles, b_tiles, x_source, w_source, a_copies, b_copies, col, k, fill, fill_k0)
            cp_async_commit()  # empty groups too: the wait below counts groups
            fill, fill_k0 = np.uint32(fill + np.uint32(1)), np.uint32(fill_k0 + np.uint32(block_k))
        step, stage = np.uint32(0), np.uint32(0)
        # a block wholly inside Y first walks the steps whose refill is wholly inside K with
        # no predicate and no edge path: fewer live values in the loop that does the work
        if interior_loop:  # a compile-time constant: Numba drops the branch, types and all
            interior_steps = np.uint32(0)
            block_inside = m0 + block_m <= x.shape[0] and n0 + block_n <= weight.shape[0]
            if block_inside and whole_steps >= stages - 1:
                interior_steps = np.uint32(whole_steps - np.uint32(stages - 1))
            while step < interior_steps:
                cp_async_wait(pending)
                cuda.syncthreads()
                stage_whole_slice(a_tiles, b_tiles, x_source, w_source, a_copies, b_copies, fill, fill_k0)
                cp_async_commit()
                fill = tiles.next_stage(fill, stages)
                fill_k0 = np.uint32(fill_k0 + np.uint32(block_k))
                a_base, b_base = stage * stage_a + a_lane, b_start + stage * stage_b + b_lane
                stage = tiles.next_stage(stage, stages)
                multiply_slice(acc, a_frag, b_frag, a_tiles, b_tiles, a_base, b_base, a_chunk, b_chunk)
                step = np.uint32(step + np.uint32(1))
        while step < num_steps:
            cp_async_wait(pending)
            cuda.syncthreads()  # slice `step` is in, and no warp still reads the stage refilled next
            if np.uint32(step + np.uint32(stages - 1)) < num_steps:
                stage_slice(a_tiles, b_tiles, x_source, w_source, a_copies, b_copies, col, k, fill, fill_k0)
            cp_async_commit()
            fill = tiles.next_stage(fill, stages)
            fill_k0 = np.uint32(fill_k0 + np.uint32(block_k))
            a_base, b_base = stage * stage_a + a_lane, b_start + stage * stage_b + b_lane
            stage = tiles.next_stage(stage, stages)
            if step < whole_steps:
                multiply_slice(acc, a_frag, b_frag, a_tiles, b_tiles, a_base, b_base, a_chunk, b_chunk)
            else:
                for kk in range(block_k // MMA_K):
                    if live_m > 0 and live_n > 0 and step * block_k + kk * MMA_K < k:
                        a_offset = a_base + VECTOR * ((2 * kk) ^ a_chunk)
                        b_offset = b_base + VECTOR * ((2 * kk) ^ b_chunk)
                        multiply_k16(acc, a_tiles, b_tiles, a_offset, b_offset, live_m, live_n)
            step = np.uint32(step + np.uint32(1))

        g, t = lane // 4, lane % 4
        for mi in range(TILES_M):
            for half in range(2):
                row = m0 + warp_m + mi * MMA_M + 8 * half + g
                if row < out.shape[0]:
                    for ni in range(tiles_n):
                        col = n0 + warp_n + ni * MMA_N + 2 * t
                        store_pair(out, row, col, width, acc[mi, ni, 2 * half], acc[mi, ni, 2 * half + 1])

    return gemm


# --8<-- [end:kernel]


def gemm(x, weight, out, *, accumulate: bool = False, stream=0, shape: GemmShape = GEMM_SHAPE) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T with the tiled kernel (any shape; best for large M);
    with `accumulate`, out += the product. `shape`: the tile configuration (`gemm_tiles.py`)."""
    m, n, _ = check_linear(x, weight, out, accumulate=accumulate)
    # cp.async's flat indices are 32-bit: a matrix of 2^32 elements or more is gathered
    fits = max(x.shape[0] * x.shape[1], weight.shape[0] * weight.shape[1]) < 2**32
    stage_chunk = stage_chunk_async if fits and rows_of_eight(x, weight) else stage_chunk_ragged
    store = store_for(out, accumulate)
    if shape.packed and store is store_bf16 and n % 2 == 0 and data_address(out) % 4 == 0:
        store, out = store_bf16x2, out.view(np.uint32)
    kernel = gemm_kernel(stage_chunk, store, shape)
    if shape.dynamic_bytes and not SIMULATOR:
        allow_dynamic_shared(kernel, tuple(numba.typeof(a) for a in (x, weight, out)), shape.dynamic_bytes)
    launch_kernel(kernel, grid(shape, m, n), shape.threads, stream, x, weight, out, shared_bytes=shape.dynamic_bytes)
