"""The tiled GEMM's configuration (`GemmShape`) and the index arithmetic that follows from it.

`gemm.py` builds one kernel per (staging, store, shape); `GEMM_SHAPE` is the library's.
The levers a shape pulls, each the size of an idea from mma.sync GEMMs on Ampere/Hopper:

- `block_n`: a block's tile is block_m x block_n (128 or 256), its warps block_m / 64 x
  warps_n over it, each 64 x block_n / warps_n: a wider tile reads each operand byte from L2
  into shared memory fewer times per FLOP, at the price of registers (the 128 x 256 tile's
  warps hold 128 accumulators; `blocks_per_sm` = 1 lets them have up to 255 registers).
- `warps_n`: 4, or 2 for warps of 64 x 64 on a 128 x 128 tile (4 warps, 128 threads): a warp
  reads a third fewer operand bytes through `ldmatrix` per mma than at 64 x 32, and two
  blocks of 128 threads at up to 255 registers share an SM, where the 128 x 256 tile's one
  block stalls the whole SM at each barrier.
- `block_m`: 256 stacks a second 128 rows of warps under the first: 16 warps, each with the
  same 64 x block_n / warps_n piece and registers as at 128, read the 256 x 128 tile's operands
  a quarter less often per FLOP than the 128 x 128 tile's 8 warps (each W byte serves
  twice the rows). 512 threads at up to 128 registers fill an SM's 64 K registers: one block
  an SM.
- `stages`: slices in shared memory at once. With S stages a block waits for the oldest of
  S - 1 copies in flight (`cp.async.wait_group S - 2`), so more latency hides behind the mmas.
- `swizzle`: rows of a slice unpadded, the 16-byte chunks of a row XOR-permuted (`chunk_slot`),
  in place of padding each row by 8 elements. It is what lets three 128 x 128 x 32 stages
  fit the 48 KB of static shared memory (3 x 2 x 8 KB = 48 KB; padded, 60 KB).
- `uniform`: a warp whose 64 x N piece lies wholly inside Y multiplies a full slice with no
  branch between its ldmatrix and mma instructions (one basic block that ptxas can
  schedule); the edge blocks and the last, partial slice of K take the checked path.
- `double_buffer`: on that branch-free path, the fragments of the next 16 of K of the slice
  are loaded (ldmatrix) before the mmas of this 16 are issued (the slice's first 16 of K
  waits for its own loads: the barrier between slices stands between them anyway).
- `group_m`: blocks in a 1-D grid, handed out in groups of group_m rows of tiles (column by
  column within a group), so that the blocks resident at once share W's tiles in L2; 0:
  a 2-D grid, blockIdx.x along N (each wave sweeps all of W for one or two rows of tiles).
- `packed`: the bf16 epilogue stores two neighbouring outputs as one 32-bit word
  (`cvt.rn.bf16x2`) when Y's rows allow it (even N, 4-byte aligned); otherwise per element.

Swizzle: a slice row of BLOCK_K = 32 bf16 is 64 bytes, 4 chunks; shared memory has 32 banks
of 4 bytes, 8 chunk-sized bank groups per 128 bytes, so row r's chunk c starts in group
(4 (r % 2) + c) % 8 unswizzled. An ldmatrix row group reads one logical chunk of 8
consecutive rows (8 first rows of each 8x8 matrix, a multiple of 8 apart): unswizzled they
fall on 2 groups, a 4-way conflict. Stored at slot c ^ ((r >> 1) % 4), the 8 rows land on
4 (r % 2) + (c ^ (r >> 1) % 4): all 8 groups. The copies (8 threads a 16-byte phase: rows
2i, 2i + 1, chunks 0..3 each) keep all 8 groups too, XOR by one value being a permutation
of the 4 chunks. For BLOCK_K = 64 (8 chunks, 128 bytes a row) the map is c ^ (r % 8).

Shared memory past 48 KB (4 stages of 128 x 128 x 32, 3 of 128 x 256 x 32, any BLOCK_K = 64)
is dynamic: one array holding X's stages, then W's, sized at launch, which the driver allows
only after cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). numba-cuda
has no method for it; `allow_dynamic_shared` makes the call the way numba-cuda's own
`set_shared_memory_carveout` makes its own, on the compiled kernel's `library.get_cufunc()`.
`tests/test_gemm_variants.py` checks both claims by counting banks.
"""

import dataclasses
import functools

import numpy as np
from numba import cuda, uint16

from tinyvllm.kernels.device.mma import MMA_M, MMA_N, WARP
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT
from tinyvllm.kernels.device.vector_io import VECTOR

WARP_M = 64
"""A warp's piece of Y is WARP_M x block_n / warps_n, and a block has block_m / WARP_M x
warps_n warps, in every shape."""
TILES_M = WARP_M // MMA_M
STATIC_SHARED_BYTES = 48 * 1024
"""Static shared memory a block may declare; past it a shape's tiles are dynamic shared memory,
which the kernel must opt in to (`allow_dynamic_shared`)."""
MAX_SHARED_BYTES = 227 * 1024
"""The most shared memory a block may opt in to on sm_90 (and sm_80: 163 KB there)."""
BANK_GROUPS = 8
"""16-byte chunks per 128 bytes of shared memory: 32 banks of 4 bytes."""


@dataclasses.dataclass(frozen=True)
class GemmShape:
    """One tile configuration of the tiled GEMM (module docstring: what each field buys)."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    stages: int = 2
    swizzle: bool = False
    uniform: bool = False
    double_buffer: bool = False
    group_m: int = 0
    packed: bool = False
    blocks_per_sm: int = 2
    warps_n: int = 4

    def __post_init__(self):
        sizes = self.block_m in (128, 256) and self.block_n in (128, 256) and self.block_k in (32, 64)
        if not sizes or self.stages < 2 or self.warps_n not in (2, 4):
            raise ValueError(f"{self}: block_m and block_n 128 or 256, block_k 32 or 64, stages >= 2, warps_n 2 or 4")
        if self.double_buffer and not self.uniform:
            raise ValueError(f"{self}: double_buffer applies to the branch-free (uniform) path")
        if self.shared_bytes > MAX_SHARED_BYTES:
            raise ValueError(f"{self}: {self.shared_bytes} bytes of shared memory, more than {MAX_SHARED_BYTES}")

    @property
    def warps_m(self) -> int:
        return self.block_m // WARP_M

    @property
    def threads(self) -> int:
        """A block's threads: warps_m x warps_n warps."""
        return WARP * self.warps_m * self.warps_n

    @property
    def warp_n(self) -> int:
        return self.block_n // self.warps_n

    @property
    def tiles_n(self) -> int:
        """A warp's piece of Y in mma tiles: TILES_M x tiles_n of 16 x 8."""
        return self.warp_n // MMA_N

    @property
    def chunks_per_row(self) -> int:
        return self.block_k // VECTOR

    @property
    def row_stride(self) -> int:
        """Shared elements a slice row: block_k, plus 8 of padding where not swizzled."""
        return self.block_k if self.swizzle else self.block_k + VECTOR

    @property
    def stage_a(self) -> int:
        """Shared elements of one stage of X's slice (W's: `stage_b`)."""
        return self.block_m * self.row_stride

    @property
    def stage_b(self) -> int:
        return self.block_n * self.row_stride

    @property
    def shared_bytes(self) -> int:
        return 2 * self.stages * (self.stage_a + self.stage_b)

    @property
    def dynamic_bytes(self) -> int:
        """Dynamic shared memory a block launches with: the tiles past 48 KB, else none."""
        return self.shared_bytes if self.shared_bytes > STATIC_SHARED_BYTES else 0

    @property
    def rows_per_pass(self) -> int:
        """Slice rows the block's threads copy at once, a 16-byte chunk each."""
        return self.threads // self.chunks_per_row

    @property
    def swizzle_shift(self) -> int:
        """Rows that share a 128-byte line of banks, as a shift: 1 for 64-byte rows, 0 for 128."""
        return (BANK_GROUPS // self.chunks_per_row).bit_length() - 1

    @property
    def swizzle_mask(self) -> int:
        return self.chunks_per_row - 1 if self.swizzle else 0


GEMM_SHAPE = GemmShape(
    block_k=64, swizzle=True, stages=3, uniform=True, double_buffer=True, group_m=8, packed=True, warps_n=2
)
"""The library's configuration: 128 x 128 tiles of 4 warps of 64 x 64, two blocks an SM, walking K
64 at a time; three stages of swizzled rows (96 KB of dynamic shared memory), the branch-free
inner path with the next 16 of K's fragments loaded ahead, blocks in groups of 8 tile rows,
packed bf16 stores. The fastest of perf/experiments/gemm_variants.py's shapes (perf/LOG.md
has each run)."""


def chunk_slot(row: int, chunk: int, shift: int, mask: int) -> int:
    """Where chunk `chunk` of slice row `row` sits in its row (mask 0: where it is)."""
    return chunk ^ ((row >> shift) & mask)


chunk_slot_device = cuda.jit(device=True, inline=True)(chunk_slot)


@cuda.jit(device=True, inline=True)
def next_stage(stage, stages):
    """The stage after `stage` of 0 .. stages - 1, in 32-bit integers and by a comparison: a
    remainder by 3 is 64-bit arithmetic in Numba."""
    return np.uint32(stage + np.uint32(1)) if stage < np.uint32(stages - 1) else np.uint32(0)


@cuda.jit(device=True, inline=True)
def grouped_tile(block, blocks_m, blocks_n, group_m):
    """(row, column) of tiles that 1-D block `block` computes: groups of group_m rows of
    tiles, each walked column by column (the last group may have fewer rows)."""
    per_group = group_m * blocks_n
    group = block // per_group
    first = group * group_m
    rows = min(blocks_m - first, group_m)
    within = block - group * per_group
    return first + within % rows, within // rows


@functools.cache
def shared_tiles(shape: GemmShape):
    """(a device function returning the shared arrays of X's and W's stages, where W's start
    in the second): two static arrays, or one dynamic array of X's stages, then W's."""
    a_elements, b_elements = shape.stages * shape.stage_a, shape.stages * shape.stage_b
    if shape.dynamic_bytes:

        @cuda.jit(device=True, inline=True)
        def dynamic_tiles():
            tiles = cuda.shared.array(0, uint16, alignment=SHARED_ALIGNMENT)  # numba's type: the simulator
            # sizes a dynamic array by its dtype's itemsize, which numpy's scalar class lacks
            return tiles, tiles

        return dynamic_tiles, a_elements

    @cuda.jit(device=True, inline=True)
    def static_tiles():
        a_tiles = cuda.shared.array(a_elements, np.uint16, alignment=SHARED_ALIGNMENT)
        return a_tiles, cuda.shared.array(b_elements, np.uint16, alignment=SHARED_ALIGNMENT)

    return static_tiles, 0


@functools.cache
def allow_dynamic_shared(kernel, argument_types: tuple, nbytes: int) -> None:
    """Let `kernel`, compiled for argument_types (now, if not yet), launch with nbytes of
    dynamic shared memory on the current device (once per kernel and types: `cache`)."""
    from cuda.bindings import driver as binding
    from numba.cuda.cudadrv.driver import driver

    cufunc = kernel.compile(argument_types).library.get_cufunc()
    attribute = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attribute, nbytes, cufunc.handle, cufunc.device.id)


def grid(shape: GemmShape, m: int, n: int) -> tuple:
    """The launch grid of `shape`'s kernel for an M x N output."""
    blocks_m, blocks_n = -(-m // shape.block_m), -(-n // shape.block_n)
    return (blocks_m * blocks_n,) if shape.group_m else (blocks_n, blocks_m)
