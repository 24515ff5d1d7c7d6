"""The float16 primitives of `tinyvllm/kernels/device/mma.py` against NumPy.

`np.float16` rounding (to nearest even, with subnormals and overflow to infinity) is the
oracle of the conversions: `f16x2` on chosen float32 pairs (ties, subnormals, the overflow
edge) and `bf16x2_to_f16x2` on every bf16 value there is. The mma's oracle is a float64
product of the float16 operands. Under the simulator the conversion stand-in rounds through
NumPy itself, so there these tests check the packing (which value lands in which half) and the
fragment layout; on a GPU they check `cvt.rn.f16x2.f32` and the tensor cores.
"""

import numpy as np
import pytest
from numba import cuda

from tests.helpers import poisoned, random_bf16, widen
from tests.test_mma import assert_close, fragment_mma_kernel, pair
from tinyvllm.kernels.device.mma import (
    bf16x2_to_f16x2,
    cp_async_16,
    cp_async_commit,
    cp_async_wait,
    f16x2,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_bf16_16816,
    mma_f16_16816,
)
from tinyvllm.kernels.device.simulator import SHARED_ALIGNMENT
from tinyvllm.kernels.reference import from_bf16, to_bf16

LANES = 32


def halves(words: np.ndarray) -> np.ndarray:
    """uint32 words -> their float16 halves [..., (low, high)] as float64."""
    return words.astype("<u4").view(np.float16).reshape(*words.shape, 2).astype(np.float64)


def fp16_bits(values: np.ndarray) -> np.ndarray:
    return np.asarray(values).astype(np.float16).view(np.uint16)


def to_f16(values: np.ndarray) -> np.ndarray:
    """float16 rounding, back in float64; past float16's range, infinity."""
    with np.errstate(over="ignore"):
        return np.asarray(values).astype(np.float16).astype(np.float64)


mma_f16_kernel = fragment_mma_kernel(mma_f16_16816)
"""One mma of float16 bits, the fragments gathered as in test_mma's mma_kernel."""


@pytest.mark.parametrize("seed", [0, 1])
def test_f16_mma_fragment_layout(seed):
    rng = np.random.default_rng(seed)
    # probabilities against values, as P V multiplies them: [0, 1] and normal-sized
    a = fp16_bits(rng.random((16, 16)))
    b = fp16_bits(rng.standard_normal((16, 8)))
    c = rng.standard_normal((16, 8)).astype(np.float32)
    d = poisoned((16, 8), np.float32)
    mma_f16_kernel[1, LANES](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), d)
    expected = a.view(np.float16).astype(np.float64) @ b.view(np.float16).astype(np.float64) + c
    assert_close(d.copy_to_host(), expected)


@cuda.jit
def pack_kernel(pairs, packed):
    for i in range(cuda.threadIdx.x, pairs.shape[0], cuda.blockDim.x):
        packed[i] = f16x2(pairs[i, 0], pairs[i, 1])


def test_f16x2_rounds_as_numpy_does():
    rng = np.random.default_rng(2)
    spacing = 2.0**-10  # of float16 in [1, 2)
    special = [
        1 + spacing / 2,  # a tie: to even (1.0)
        1 + 3 * spacing / 2,  # a tie: to even (1 + 2 spacing)
        2.0**-20,  # a subnormal of float16
        2.0**-26,  # below half the smallest subnormal: 0
        65504.0,  # the largest float16
        65519.0,  # rounds down to it
        65520.0,  # rounds up to infinity
        -0.0,
        np.inf,
        -np.inf,
    ]
    values = np.concatenate([special, rng.random(118), rng.standard_normal(128) * 100]).astype(np.float32)
    pairs = values.reshape(-1, 2)
    packed = cuda.device_array(len(pairs), np.uint32)
    pack_kernel[1, LANES](cuda.to_device(pairs), packed)
    np.testing.assert_array_equal(halves(packed.copy_to_host()).view(np.uint64), to_f16(pairs).view(np.uint64))


@cuda.jit
def widen_kernel(words, converted):
    for i in range(cuda.threadIdx.x, words.shape[0], cuda.blockDim.x):
        converted[i] = bf16x2_to_f16x2(words[i])


def test_bf16x2_to_f16x2_on_every_bf16_value():
    """Exact from 2^-14 to 65280 (bf16's largest below 2^16), rounded below, infinite from 2^16:
    what NumPy's float16 makes of the same values; NaN stays NaN (its payload is cvt's own)."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    words = bits[0::2] | (bits[1::2] << np.uint32(16))
    converted = cuda.device_array(len(words), np.uint32)
    widen_kernel[1, LANES](cuda.to_device(words), converted)
    actual = halves(converted.copy_to_host()).ravel()
    expected = to_f16(from_bf16(bits.astype(np.uint16)))
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(actual), nan)
    np.testing.assert_array_equal(actual[~nan].view(np.uint64), expected[~nan].view(np.uint64))


@cuda.jit
def chained_f16_kernel(a, bt, v, d):
    """D[16, 16] = f16(A @ B) @ f16(V): attention's P V in float16. The bf16 product's accumulators,
    packed by f16x2, are the A fragment of the second mma; V, bf16 stored [k, n], is converted to
    float16 in shared memory and comes by ldmatrix_x4_trans. a, bt, v: 16x16 tiles flattened."""
    lane = cuda.threadIdx.x
    tiles = cuda.shared.array(768, np.uint16, alignment=SHARED_ALIGNMENT)
    row, column = lane // 2, 8 * (lane % 2)
    for i, source in enumerate((a, bt, v)):
        cp_async_16(tiles, 256 * i + 16 * row + column, source, 16 * row + column)
    cp_async_commit()
    cp_async_wait(0)
    # each lane converts the 8 V elements its own copy brought
    for k in range(0, 8, 2):
        at = 512 + 16 * row + column + k
        word = bf16x2_to_f16x2(pair(tiles[at], tiles[at + 1]))
        tiles[at] = np.uint16(word & np.uint32(0xFFFF))
        tiles[at + 1] = np.uint16(word >> np.uint32(16))
    cuda.syncthreads()
    matrix, r = lane // 8, lane % 8
    g, t = lane // 4, lane % 4
    a0, a1, a2, a3 = ldmatrix_x4(tiles, 16 * (r + 8 * (matrix % 2)) + 8 * (matrix // 2))
    b00, b01, b10, b11 = ldmatrix_x4(tiles, 256 + 16 * (r + 8 * (matrix // 2)) + 8 * (matrix % 2))
    zero = np.float32(0.0)
    s0, s1, s2, s3 = mma_bf16_16816(a0, a1, a2, a3, b00, b01, zero, zero, zero, zero)
    s4, s5, s6, s7 = mma_bf16_16816(a0, a1, a2, a3, b10, b11, zero, zero, zero, zero)
    p0, p1, p2, p3 = f16x2(s0, s1), f16x2(s2, s3), f16x2(s4, s5), f16x2(s6, s7)
    v00, v01, v10, v11 = ldmatrix_x4_trans(tiles, 512 + 16 * (r + 8 * (matrix % 2)) + 8 * (matrix // 2))
    for tile, (b0, b1) in enumerate(((v00, v01), (v10, v11))):
        d0, d1, d2, d3 = mma_f16_16816(p0, p1, p2, p3, b0, b1, zero, zero, zero, zero)
        n = 8 * tile + 2 * t
        d[g, n] = d0
        d[g, n + 1] = d1
        d[g + 8, n] = d2
        d[g + 8, n + 1] = d3


def test_accumulators_feed_an_f16_mma_through_a_converted_transposed_load():
    rng = np.random.default_rng(4)
    # A @ B^T (multiples of 1/64, at most 1) is exact in float32, bf16 and float16 alike
    a, bt = (to_bf16(rng.integers(-2, 3, (16, 16)) / 8.0) for _ in range(2))
    v = random_bf16(rng, (16, 16))
    d = poisoned((16, 16), np.float32)
    chained_f16_kernel[1, LANES](*(cuda.to_device(x.ravel()) for x in (a, bt, v)), d)
    assert_close(d.copy_to_host(), to_f16(widen(a) @ widen(bt).T) @ to_f16(widen(v)))
