"""The tensor-core primitives of `tinyvllm/kernels/device/mma.py`, one warp at a time.

`mma_kernel` gathers the A[16, 16] and B[16, 8] fragments from global memory by the
documented layout, one mma, and scatters D[16, 8]: a wrong lane-to-element map shows as a
wrong product. `staged_kernel` copies A[16, 16] and B^T[16, 16] (two n8 tiles, stored [n, k]
as weights are) into shared memory with `cp_async_16`, loads the fragments with
`ldmatrix_x4`, and runs two mmas for D[16, 16] = A @ B. `zero_fill_kernel` copies a tile's
first rows with `cp_async_16_zfill` and has it zero the rest, over poisoned shared memory.

Under the simulator these show that the test kernels and mma.py's stand-ins agree on the
layout documented there (both read from the PTX ISA; a misreading shared by both would pass).
On a GPU the same tests put that layout against the tensor cores, and the GPU-only cases below
look for the instructions in the PTX and SASS (tests/test_mma_compile.py and
perf/experiments/mma_sass.py do that offline). The expected product is float64 on bf16-exact
inputs; the tensor core's float32 accumulation is what the tolerance allows.
"""

import shutil

import numpy as np
import pytest
from numba import cuda

from tests.helpers import SIMULATOR, poisoned, random_bf16, widen
from tinyvllm.kernels.device.mma import (
    bf16x2,
    cp_async_16,
    cp_async_16_zfill,
    cp_async_commit,
    cp_async_wait,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_bf16_16816,
    quad_max,
    quad_sum,
)
from tinyvllm.kernels.device.mma_ptx import MMA_PTX
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT
from tinyvllm.kernels.reference import to_bf16

TOLERANCE = 1e-5
"""Sixteen bf16 products are exact in float32; only the float32 sums round."""


@cuda.jit(device=True, inline=True)
def pair(low, high):
    """Two bf16 bits -> one register, the first in the low half."""
    return np.uint32(np.uint32(low) | np.uint32(np.uint32(high) << np.uint32(16)))


# --8<-- [start:mma-kernel]
def fragment_mma_kernel(mma):
    """A kernel of one warp: D = A[16, 16] @ B[16, 8] + C by `mma` (mma_bf16_16816 or
    mma_f16_16816), each lane gathering its fragments from global memory by the layout."""

    @cuda.jit
    def kernel(a, b, c, d):
        lane = cuda.threadIdx.x
        g, t = lane // 4, lane % 4
        a0 = pair(a[g, 2 * t], a[g, 2 * t + 1])
        a1 = pair(a[g + 8, 2 * t], a[g + 8, 2 * t + 1])
        a2 = pair(a[g, 2 * t + 8], a[g, 2 * t + 9])
        a3 = pair(a[g + 8, 2 * t + 8], a[g + 8, 2 * t + 9])
        b0 = pair(b[2 * t, g], b[2 * t + 1, g])
        b1 = pair(b[2 * t + 8, g], b[2 * t + 9, g])
        d0, d1, d2, d3 = mma(a0, a1, a2, a3, b0, b1, c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])
        d[g, 2 * t] = d0
        d[g, 2 * t + 1] = d1
        d[g + 8, 2 * t] = d2
        d[g + 8, 2 * t + 1] = d3

    return kernel


mma_kernel = fragment_mma_kernel(mma_bf16_16816)
# --8<-- [end:mma-kernel]


@cuda.jit(device=True, inline=True)
def two_tiles_into(d, lane, a, b):
    """d[16, 16] = A @ B for A's fragment `a` and the b0, b1 fragments of two n8 tiles `b`."""
    g, t = lane // 4, lane % 4
    zero = np.float32(0.0)
    for tile in range(2):
        d0, d1, d2, d3 = mma_bf16_16816(a[0], a[1], a[2], a[3], b[2 * tile], b[2 * tile + 1], zero, zero, zero, zero)
        n = 8 * tile + 2 * t
        d[g, n] = d0
        d[g, n + 1] = d1
        d[g + 8, n] = d2
        d[g + 8, n + 1] = d3


@cuda.jit
def staged_kernel(a, bt, d):
    """a, bt: 16x16 tiles flattened row-major (cp.async takes 1-D rows)."""
    lane = cuda.threadIdx.x
    a_tile = cuda.shared.array(256, np.uint16, alignment=SHARED_ALIGNMENT)
    bt_tile = cuda.shared.array(256, np.uint16, alignment=SHARED_ALIGNMENT)
    # one 16-byte chunk of each 16x16 tile a lane: row lane // 2, columns 8 * (lane % 2)
    row, column = lane // 2, 8 * (lane % 2)
    cp_async_16(a_tile, 16 * row + column, a, 16 * row + column)
    cp_async_16(bt_tile, 16 * row + column, bt, 16 * row + column)
    cp_async_commit()
    cp_async_wait(0)
    cuda.syncthreads()
    # lanes 8j .. 8j + 7 name the rows of 8x8 matrix j
    matrix, r = lane // 8, lane % 8
    a0, a1, a2, a3 = ldmatrix_x4(a_tile, 16 * (r + 8 * (matrix % 2)) + 8 * (matrix // 2))
    b00, b01, b10, b11 = ldmatrix_x4(bt_tile, 16 * (r + 8 * (matrix // 2)) + 8 * (matrix % 2))
    two_tiles_into(d, lane, (a0, a1, a2, a3), (b00, b01, b10, b11))


@cuda.jit
def zero_fill_kernel(source, valid_rows, out):
    """out = the 16x16 tile source (flattened) with its rows from valid_rows on zeroed, via shared memory."""
    lane = cuda.threadIdx.x
    tile = cuda.shared.array(256, np.uint16, alignment=SHARED_ALIGNMENT)
    row, column = lane // 2, 8 * (lane % 2)
    start = 16 * row + column
    for i in range(8):
        tile[start + i] = 0x7FC0  # bf16 NaN: what zfill must overwrite
    cuda.syncthreads()
    inside = row < valid_rows
    cp_async_16_zfill(tile, start, source, start if inside else 0, inside)
    cp_async_commit()
    cp_async_wait(0)
    cuda.syncthreads()
    for i in range(8):
        out[start + i] = tile[start + i]


def assert_close(actual, expected):
    assert np.all(np.isfinite(actual)), "unwritten output (NaN poison) left"
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCE, atol=TOLERANCE * np.abs(expected).max())


@pytest.mark.parametrize("seed", [0, 1])
def test_mma_fragment_layout(seed):
    rng = np.random.default_rng(seed)
    a, b = random_bf16(rng, (16, 16)), random_bf16(rng, (16, 8))
    c = rng.standard_normal((16, 8)).astype(np.float32)
    d = poisoned((16, 8), np.float32)
    mma_kernel[1, 32](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), d)
    assert_close(d.copy_to_host(), widen(a) @ widen(b) + c.astype(np.float64))


def test_cp_async_ldmatrix_mma():
    rng = np.random.default_rng(2)
    a, bt = random_bf16(rng, (16, 16)), random_bf16(rng, (16, 16))
    d = poisoned((16, 16), np.float32)
    staged_kernel[1, 32](cuda.to_device(a.ravel()), cuda.to_device(bt.ravel()), d)
    assert_close(d.copy_to_host(), widen(a) @ widen(bt).T)


def test_mma_identity_is_exact():
    """A = I: D is B's columns spread over the C/D layout, with no rounding anywhere."""
    rng = np.random.default_rng(3)
    identity = np.zeros((16, 16), np.uint16)
    identity[np.arange(16), np.arange(16)] = 0x3F80  # bf16 1.0
    b = random_bf16(rng, (16, 8))
    d = poisoned((16, 8), np.float32)
    mma_kernel[1, 32](cuda.to_device(identity), cuda.to_device(b), cuda.to_device(np.zeros((16, 8), np.float32)), d)
    np.testing.assert_array_equal(d.copy_to_host(), widen(b).astype(np.float32))


@pytest.mark.parametrize("valid_rows", [0, 5, 16])
def test_cp_async_zero_fill(valid_rows):
    rng = np.random.default_rng(4)
    source = random_bf16(rng, (16, 16))
    out = cuda.device_array(256, np.uint16)
    zero_fill_kernel[1, 32](cuda.to_device(source.ravel()), valid_rows, out)
    expected = source.copy()
    expected[valid_rows:] = 0
    np.testing.assert_array_equal(out.copy_to_host().reshape(16, 16), expected)


@cuda.jit
def chained_kernel(a, bt, v, d):
    """D[16, 16] = bf16(A @ B) @ V: the first product's accumulators, packed by bf16x2, are the
    A fragment of the second (as attention's probabilities are), and V, stored [k, n], comes
    by ldmatrix_x4_trans. a, bt, v: 16x16 tiles flattened row-major, bt = B^T."""
    lane = cuda.threadIdx.x
    tiles = cuda.shared.array(768, np.uint16, alignment=SHARED_ALIGNMENT)
    row, column = lane // 2, 8 * (lane % 2)
    for i, source in enumerate((a, bt, v)):
        cp_async_16(tiles, 256 * i + 16 * row + column, source, 16 * row + column)
    cp_async_commit()
    cp_async_wait(0)
    cuda.syncthreads()
    matrix, r = lane // 8, lane % 8
    a0, a1, a2, a3 = ldmatrix_x4(tiles, 16 * (r + 8 * (matrix % 2)) + 8 * (matrix // 2))
    b00, b01, b10, b11 = ldmatrix_x4(tiles, 256 + 16 * (r + 8 * (matrix // 2)) + 8 * (matrix % 2))
    zero = np.float32(0.0)
    s0, s1, s2, s3 = mma_bf16_16816(a0, a1, a2, a3, b00, b01, zero, zero, zero, zero)
    s4, s5, s6, s7 = mma_bf16_16816(a0, a1, a2, a3, b10, b11, zero, zero, zero, zero)
    p0, p1, p2, p3 = bf16x2(s0, s1), bf16x2(s2, s3), bf16x2(s4, s5), bf16x2(s6, s7)
    v00, v01, v10, v11 = ldmatrix_x4_trans(tiles, 512 + 16 * (r + 8 * (matrix % 2)) + 8 * (matrix // 2))
    two_tiles_into(d, lane, (p0, p1, p2, p3), (v00, v01, v10, v11))


def test_accumulators_feed_the_next_mma_through_a_transposed_load():
    rng = np.random.default_rng(4)
    # small integers: A @ B is exact in float32 and in bf16, so the chain has one rounding
    a, bt = (to_bf16(rng.integers(-2, 3, (16, 16)).astype(np.float64)) for _ in range(2))
    v = random_bf16(rng, (16, 16))
    d = poisoned((16, 16), np.float32)
    chained_kernel[1, 32](*(cuda.to_device(x.ravel()) for x in (a, bt, v)), d)
    assert_close(d.copy_to_host(), (widen(a) @ widen(bt).T) @ widen(v))


@cuda.jit
def lane_kernel(values, pairs, maxes, sums, packed):
    lane = cuda.threadIdx.x
    maxes[lane] = quad_max(values[lane])
    sums[lane] = quad_sum(values[lane])
    packed[lane] = bf16x2(pairs[lane, 0], pairs[lane, 1])


def test_quad_reductions_and_bf16_pairs():
    rng = np.random.default_rng(5)
    values = rng.standard_normal(32).astype(np.float32)
    # float32 values halfway between two bf16 numbers test the rounding (to even)
    pairs = rng.standard_normal((32, 2)).astype(np.float32)
    pairs[:8] = (pairs[:8].view(np.uint32) & np.uint32(0xFFFF0000) | np.uint32(0x8000)).view(np.float32)
    maxes, sums, packed = poisoned(32, np.float32), poisoned(32, np.float32), cuda.device_array(32, np.uint32)
    lane_kernel[1, 32](cuda.to_device(values), cuda.to_device(pairs), maxes, sums, packed)
    quads = values.reshape(8, 4)
    np.testing.assert_array_equal(maxes.copy_to_host(), np.repeat(quads.max(axis=1), 4))
    np.testing.assert_allclose(sums.copy_to_host(), np.repeat(quads.astype(np.float64).sum(axis=1), 4), rtol=1e-6)
    expected = to_bf16(pairs[:, 0].astype(np.float64)).astype(np.uint32) | (
        to_bf16(pairs[:, 1].astype(np.float64)).astype(np.uint32) << 16
    )
    np.testing.assert_array_equal(packed.copy_to_host(), expected)


@cuda.jit
def misaligned_ldmatrix_kernel(d):
    tile = cuda.shared.array(256, np.uint16, alignment=SHARED_ALIGNMENT)
    d[cuda.threadIdx.x] = ldmatrix_x4(tile, 4)[0]


@pytest.mark.skipif(not SIMULATOR, reason="on a GPU a misaligned ldmatrix faults instead")
def test_stand_in_refuses_misaligned_rows():
    with pytest.raises(ValueError, match="16 bytes"):
        misaligned_ldmatrix_kernel[1, 32](cuda.device_array(32, np.uint32))


def compile_staged_kernel():
    a = cuda.to_device(np.zeros(256, np.uint16))
    staged_kernel[1, 32](a, a, cuda.device_array((16, 16), np.float32))


@pytest.mark.gpu
def test_ptx_holds_the_instructions():
    compile_staged_kernel()
    ptx = next(iter(staged_kernel.inspect_asm().values()))
    assert MMA_PTX in ptx and "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and "cp.async.cg" in ptx


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("nvdisasm") is None, reason="inspect_sass needs nvdisasm")
def test_sass_runs_on_tensor_cores():
    compile_staged_kernel()
    sass = next(iter(staged_kernel.inspect_sass().values()))
    assert "HMMA.16816.F32.BF16" in sass and "LDSM.16.M88.4" in sass and "LDGSTS" in sass
