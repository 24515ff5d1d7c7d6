"""The tiled GEMM's tile configurations (`kernels/gemm_tiles.py`) and the candidate variants
of perf/experiments/gemm_variants.py against NumPy.

The swizzle and the grouped block order are index maps, checked in plain Python: the swizzle
a bijection on each row's chunks that spreads every ldmatrix row group and every 16-byte
phase of the copies over all 8 bank groups; the block order a bijection onto the grid. Each
variant then runs on shapes small enough for the simulator that still have a warp wholly
inside Y (the branch-free path), warps cut by the edges, and a partial last slice of K: every
variant on the GPU; under the simulator, where a variant costs a CI worker about 16 s, the
variants that between them take every value of every GemmShape field (`covering`) and two
more (the padded branch-free path, the double buffer at 128 wide).
"""

import dataclasses
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

from perf.experiments.gemm_variants import VARIANTS
from tests.helpers import BF16_TOLERANCE, SIMULATOR, poisoned, random_bf16, relative_error, widen
from tinyvllm.kernels import reference
from tinyvllm.kernels.gemm import gemm
from tinyvllm.kernels.gemm_tiles import (
    BANK_GROUPS,
    GEMM_SHAPE,
    STATIC_SHARED_BYTES,
    GemmShape,
    chunk_slot,
    grid,
    grouped_tile,
)

FLOAT32_TOLERANCE = 2e-5


Layout = tuple[int, int, int, int]
"""A slice row's (chunks, row stride in elements, swizzle shift, swizzle mask)."""


def layout(shape: GemmShape) -> Layout:
    return shape.chunks_per_row, shape.row_stride, shape.swizzle_shift, shape.swizzle_mask


LAYOUTS = {
    "padded": layout(GemmShape()),
    "swizzled": layout(GemmShape(swizzle=True)),
    "k64-swizzled": layout(GemmShape(block_k=64, swizzle=True)),
}


def bank_group(rows: Layout, row: int, chunk: int) -> int:
    """The 16-byte bank group (of 8) where logical chunk `chunk` of slice row `row` starts."""
    _, stride, shift, mask = rows
    return (row * stride // 8 + chunk_slot(row, chunk, shift, mask)) % BANK_GROUPS


@pytest.mark.parametrize("rows", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_swizzle_is_a_bijection_on_each_row(rows):
    chunks, _, shift, mask = rows
    for row in range(128):
        assert {chunk_slot(row, c, shift, mask) for c in range(chunks)} == set(range(chunks))


def copy_phase_groups(rows: Layout, first_thread: int) -> set[int]:
    """Bank groups of a copy phase: 8 consecutive threads, row tid // chunks, chunk tid % chunks."""
    chunks = rows[0]
    return {bank_group(rows, t // chunks, t % chunks) for t in range(first_thread, first_thread + 8)}


@pytest.mark.parametrize("rows", LAYOUTS.values(), ids=LAYOUTS.keys())
def test_ldmatrix_row_groups_hit_every_bank_group(rows):
    """An ldmatrix phase: one logical chunk of 8 rows from a multiple of 8 (one 8x8 matrix)."""
    for first in range(0, 128, 8):
        for chunk in range(rows[0]):
            assert len({bank_group(rows, first + r, chunk) for r in range(8)}) == BANK_GROUPS, (first, chunk)


@pytest.mark.parametrize("name", ["swizzled", "k64-swizzled"])
def test_swizzled_copies_hit_every_bank_group(name):
    for first_thread in range(0, 256, 8):
        assert len(copy_phase_groups(LAYOUTS[name], first_thread)) == BANK_GROUPS, first_thread


def test_padded_copies_meet_twice_on_a_bank_group():
    """The library's padded rows (80 bytes) put two of a copy phase's 8 chunks on one group."""
    assert len(copy_phase_groups(LAYOUTS["padded"], 0)) == BANK_GROUPS - 1


def test_unpadded_rows_without_swizzle_would_conflict():
    """The check above can fail: unswizzled 64-byte rows put an ldmatrix phase on 2 groups."""
    chunks, stride, shift, _ = LAYOUTS["swizzled"]
    assert len({bank_group((chunks, stride, shift, 0), r, 0) for r in range(8)}) == 2


@pytest.mark.parametrize(("blocks_m", "blocks_n", "group_m"), [(1, 1, 8), (5, 3, 2), (32, 1002, 8), (17, 7, 8)])
def test_grouped_block_order_covers_the_grid_once(blocks_m, blocks_n, group_m):
    tiles = [grouped_tile.py_func(b, blocks_m, blocks_n, group_m) for b in range(blocks_m * blocks_n)]
    assert sorted(tiles) == [(i, j) for i in range(blocks_m) for j in range(blocks_n)]
    assert grid(GemmShape(group_m=group_m), blocks_m * 128, blocks_n * 128) == (blocks_m * blocks_n,)


def test_shapes_past_static_shared_memory_are_dynamic_up_to_the_limit():
    assert GemmShape(swizzle=True, stages=3).shared_bytes == STATIC_SHARED_BYTES
    assert GemmShape(stages=3).dynamic_bytes == 60 * 1024  # padded rows: past static shared memory
    with pytest.raises(ValueError, match="shared memory"):
        GemmShape(block_n=256, block_k=64, swizzle=True, stages=5)  # 240 KB
    with pytest.raises(ValueError, match="uniform"):
        GemmShape(double_buffer=True)
    with pytest.raises(ValueError, match="warps_n 2 or 4"):
        GemmShape(warps_n=3)


def run(x, weight, out_dtype, shape, accumulate_onto=None):
    """The product (or accumulate_onto + it) by `shape`'s kernel on a poisoned output, as float64."""
    if accumulate_onto is None:
        out = poisoned((x.shape[0], weight.shape[0]), out_dtype)
    else:
        out = cuda.to_device(accumulate_onto)
    gemm(cuda.to_device(x), cuda.to_device(weight), out, shape=shape, accumulate=accumulate_onto is not None)
    return widen(out) if out_dtype == np.uint16 else out.copy_to_host().astype(np.float64)


def check(shape, m, n, k, out_dtype=np.uint16, seed=0):
    rng = np.random.default_rng(seed + m + n + k)
    x, weight = random_bf16(rng, (m, k)), random_bf16(rng, (n, k))
    expected = reference.linear(widen(x), widen(weight))
    tolerance = BF16_TOLERANCE if out_dtype == np.uint16 else FLOAT32_TOLERANCE
    assert relative_error(run(x, weight, out_dtype, shape), expected) <= tolerance


def field_values(shape: GemmShape) -> set[tuple[str, object]]:
    return {(field.name, getattr(shape, field.name)) for field in dataclasses.fields(GemmShape)}


def covering(variants: dict[str, GemmShape]) -> list[str]:
    """Names of variants that between them take every value any variant takes of every field:
    each next one the variant with the most values not yet taken (the first such in order)."""
    missing = set().union(*map(field_values, variants.values()))
    chosen = []
    while missing:
        name = max(variants, key=lambda name: len(field_values(variants[name]) & missing))
        chosen.append(name)
        missing -= field_values(variants[name])
    return chosen


SIMULATED = [*covering(VARIANTS), "uniform", "swizzle3_dbuf"]


def test_the_simulated_variants_take_every_value_of_every_field():
    for field in dataclasses.fields(GemmShape):
        taken = {getattr(shape, field.name) for shape in VARIANTS.values()}
        assert {getattr(VARIANTS[name], field.name) for name in SIMULATED} == taken, field.name
    assert len(set(SIMULATED)) == len(SIMULATED) < len(VARIANTS)


@pytest.mark.parametrize("name", SIMULATED if SIMULATOR else list(VARIANTS))
def test_variant_matches_reference(name):
    """72 x 72 x (block_k + 8): warp 0's piece wholly inside Y (its first slice branch-free), the
    others cut by M or N, the second slice of K partial; then 64 x 64 x 64, float32 out: M, N
    and K whole multiples of the warp's piece and of BLOCK_K (every slice whole)."""
    check(VARIANTS[name], 72, 72, VARIANTS[name].block_k + 8)
    check(VARIANTS[name], 64, 64, 64, np.float32)


@pytest.mark.parametrize(
    "name", ["swizzle3_raster8_packed", "wide_packed", "swizzle4_raster8_packed", "quad_swizzle4_raster8_packed"]
)
def test_variant_at_a_tile_multiple_float32_out(name):
    """One whole 128 x block_n tile, every warp branch-free, three slices: the pipeline's
    stages all used; float32 out (no packing)."""
    check(VARIANTS[name], 128, VARIANTS[name].block_n, 96, np.float32)


def test_grouped_order_over_several_rows_of_tiles():
    check(VARIANTS["swizzle3_raster8"], 130, 20, 16)


TALL = "tall_k64_swizzle3_raster8_packed"


def test_tall_tile_has_sixteen_warps_and_a_grid_of_half_the_rows():
    shape = VARIANTS[TALL]
    assert (shape.block_m, shape.warps_m, shape.threads) == (256, 4, 512)
    assert shape.rows_per_pass == 64 and shape.stage_a == 2 * shape.stage_b
    assert grid(shape, 4096, 4096) == (16 * 32,)
    assert grid(GemmShape(block_m=256), 257, 129) == (2, 2)
    with pytest.raises(ValueError, match="block_m and block_n 128 or 256"):
        GemmShape(block_m=192)


def test_tall_tile_rows_all_branch_free():
    """All 256 rows of a tall tile, N = 32: the first warp of each of the four warp rows wholly
    inside Y (branch-free; the other warps hold no column and skip), three slices (every stage
    used); float32 out."""
    check(VARIANTS[TALL], 256, 32, 3 * VARIANTS[TALL].block_k, np.float32)


def test_tall_tiles_over_two_rows_of_tiles():
    """M = 300: the second row of tall tiles has one warp row cut by M and three outside Y."""
    check(VARIANTS[TALL], 300, 20, 16)


def test_library_tile_walks_its_interior_loop_then_the_edges():
    """M = block_m + 8: the first block wholly inside Y walks the slices whose refill lies
    inside K with unpredicated copies (the interior loop), then the general loop's last two
    whole slices and a partial one; the second block, cut by M, only the general loop."""
    check(GEMM_SHAPE, GEMM_SHAPE.block_m + 8, GEMM_SHAPE.block_n, 3 * GEMM_SHAPE.block_k + 8, np.float32)


def test_packed_variant_falls_back_on_odd_n_and_accumulates():
    shape = VARIANTS["swizzle3_raster8_packed"]
    check(shape, 20, 23, 24)
    rng = np.random.default_rng(4)
    x, weight, base = random_bf16(rng, (9, 24)), random_bf16(rng, (10, 24)), random_bf16(rng, (9, 10))
    expected = widen(base) + reference.linear(widen(x), widen(weight))
    assert relative_error(run(x, weight, np.uint16, shape, accumulate_onto=base), expected) <= BF16_TOLERANCE


def test_swizzled_variant_takes_unaligned_k():
    """K = 20: no 16-byte chunks, the element-wise staging into the swizzled slots."""
    check(VARIANTS["swizzle3_dbuf"], 17, 9, 20, np.float32)


@pytest.mark.skipif(SIMULATOR or shutil.which("ptxas") is None, reason="needs NVVM and ptxas, no simulator")
@pytest.mark.parametrize("name", list(VARIANTS))
def test_variant_compiles_without_spills(name):
    """Each variant's sm_90 kernel (bf16 or packed out) keeps everything in registers (ptxas -v)."""
    from numba import types

    from perf.experiments.mma_sass import compile_for_sm90
    from tinyvllm.kernels.gemm import gemm_kernel
    from tinyvllm.kernels.gemm_copies import stage_chunk_async
    from tinyvllm.kernels.gemm_stores import store_bf16, store_bf16x2

    shape, tile = VARIANTS[name], types.uint16[:, ::1]
    store, out = (store_bf16x2, types.uint32[:, ::1]) if shape.packed else (store_bf16, tile)
    with tempfile.TemporaryDirectory() as folder:
        ptx, report, _ = compile_for_sm90(gemm_kernel(stage_chunk_async, store, shape), (tile, tile, out), Path(folder))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report
