"""How the tiled GEMM's slices of X and W get into shared memory (kernels/gemm.py).

Each of a block's THREADS copies 16-byte chunks (8 bf16 of a row) of the slice X[m0:,
k0:k0 + block_k] and W[n0:, ...]: thread t takes chunk t % chunks_per_row of rows t //
chunks_per_row + p * rows_per_pass, p = 0, 1, ... When every row is a multiple of 8 elements
and both operands start on a 16-byte boundary (`rows_of_eight`), a chunk is all inside the
matrix or all outside it, and cp.async copies it with no register in between, zero-filling
the outside ones (source size 0): `stage_chunk_async`. Otherwise the thread gathers it
element by element and stores it itself: `stage_chunk_ragged`.

A thread's copies are worked out once, before the K loop (`thread_copies`): from one of its
chunks to the next, the matrix row, the flat index into the operand (`flat_view`, in 32-bit
integers) and the offset in shared memory move by constants (rows_per_pass is a multiple of
the swizzle's pattern, so every chunk of a thread has the same slot), and from one slice to
the next only k0 moves; so a copy in the loop costs a few adds (`stage_operand`). Recomputed
per chunk and slice in Numba's 64-bit integers, the copies' arithmetic took more issue slots
than the mmas (perf/LOG.md, 2026-12-07).
"""

import numpy as np
from numba import cuda

from tinyvllm.kernels import gemm_tiles as tiles
from tinyvllm.kernels.device.mma import cp_async_16, cp_async_16_zfill
from tinyvllm.kernels.device.vector_io import ALIGNMENT_BYTES, VECTOR, data_address, flat_view
from tinyvllm.kernels.gemm_tiles import GemmShape


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
def stage_chunk_async(tiles, offset, source, row, col, index, inside):
    """Chunk (row, col:col+8) into tiles[offset:offset+8] by cp.async from the flat matrix
    `source` at `index` (row * K + col), zeros past the edge (`inside` false; rows of
    eight: a chunk is all in or all out)."""
    cp_async_16_zfill(tiles, offset, source, index if inside else np.uint32(0), inside)


@cuda.jit(device=True, inline=True)
def stage_chunk_ragged(tiles, offset, source, row, col, index, inside):
    """The same chunk gathered element by element from the 2-D `source` (any K and alignment)
    and stored by the thread; zeros past the edge."""
    for i in range(VECTOR):
        tiles[offset + i] = np.uint16(_element(source, row, col + i))


@cuda.jit(device=True, inline=True)
def whole_rows(array):
    return array


SOURCES = {stage_chunk_async: flat_view, stage_chunk_ragged: whole_rows}
"""The view of X and W that each staging function reads."""


def copy_functions(shape: GemmShape, stage_chunk):
    """(thread_copies, stage_operand, stage_whole_operand, source_view) for one tile shape and
    staging function: the device functions that set up and start a thread's copies (the last:
    every chunk inside the matrices, cp.async staging only), and the view of X and W that the
    staging function reads."""
    rows_per_pass, row_stride = shape.rows_per_pass, shape.row_stride
    shift, mask = shape.swizzle_shift, shape.swizzle_mask
    source_view = SOURCES[stage_chunk]
    pass_elements = rows_per_pass * row_stride  # shared elements from one of a thread's chunks to the next
    if (rows_per_pass >> shift) & mask:
        raise ValueError(f"{shape}: a thread's chunks would sit in different swizzle slots")

    @cuda.jit(device=True, inline=True)
    def thread_copies(rows, first_row, copy_row, copy_chunk, k, count):
        """This thread's `count` chunks of an operand's slice (rows `first_row` + copy_row +
        p * rows_per_pass of a matrix of `rows` rows and K = k): the first one's row, its flat
        index at k0 = 0 and its offset in a stage, then a mask of the chunks whose row is
        inside the matrix (bit p) and the flat index from one chunk to the next. Every chunk
        of a thread has the same swizzle slot (rows_per_pass is a multiple of the pattern)."""
        # Numba widens integer arithmetic to 64 bits; each np.uint32 narrows it back for LLVM
        row = np.uint32(first_row + copy_row)
        slot = tiles.chunk_slot_device(copy_row, copy_chunk, shift, mask)
        rows_inside = np.uint32(0)
        for p in range(count):
            if np.uint32(row + np.uint32(p * rows_per_pass)) < rows:
                rows_inside |= np.uint32(1) << np.uint32(p)
        index = np.uint32(np.uint32(row * k) + np.uint32(copy_chunk * VECTOR))
        offset = np.uint32(np.uint32(copy_row * row_stride) + np.uint32(slot * VECTOR))
        return row, index, offset, rows_inside, np.uint32(k * rows_per_pass)

    @cuda.jit(device=True, inline=True)
    def stage_operand(tiles_array, stage_offset, source, copies, count, col, k0, k_live):
        """Start this thread's `count` copies (`thread_copies`' `copies`) of one operand's
        slice at k0 into the stage at stage_offset; k_live: whether its chunk's columns are
        inside K."""
        row, index, offset, rows_inside, index_pass = copies
        for p in range(count):
            inside = k_live and (rows_inside >> np.uint32(p)) & np.uint32(1) != 0
            chunk_offset = np.uint32(np.uint32(stage_offset + offset) + np.uint32(p * pass_elements))
            chunk_row = np.uint32(row + np.uint32(p * rows_per_pass))
            chunk_index = np.uint32(np.uint32(index + np.uint32(np.uint32(p) * index_pass)) + k0)
            stage_chunk(tiles_array, chunk_offset, source, chunk_row, np.uint32(k0 + col), chunk_index, inside)

    @cuda.jit(device=True, inline=True)
    def stage_whole_operand(tiles_array, stage_offset, source, copies, count, k0):
        """`stage_operand` for a slice wholly inside the matrix, by cp.async (the flat `source`):
        no predicate, and each chunk's source a 32-bit offset from one 64-bit address a slice,
        which ptxas forms in one wide multiply-add."""
        row, index, offset, rows_inside, index_pass = copies
        start = np.uint64(np.uint32(index + k0))
        for p in range(count):
            chunk_offset = np.uint32(np.uint32(stage_offset + offset) + np.uint32(p * pass_elements))
            cp_async_16(tiles_array, chunk_offset, source, start + np.uint64(np.uint32(np.uint32(p) * index_pass)))

    return thread_copies, stage_operand, stage_whole_operand, source_view
