"""bf16 rounding, device and host, against ml_dtypes: bit for bit."""

import ml_dtypes
import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tinyvllm.kernels.device.bf16 import bf16_to_f32, f32_to_bf16
from tinyvllm.kernels.reference import from_bf16, to_bf16


@cuda.jit
def _round_trip(values, narrowed, widened):
    i = cuda.grid(1)
    if i < values.size:
        narrowed[i] = f32_to_bf16(values[i])
        widened[i] = bf16_to_f32(narrowed[i])


SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, 1e-45, -1e-45, 1.17e-38, 3.4e38, -3.4e38, 1.0 + 2**-8, 1.0 + 3 * 2**-8],
    dtype=np.float32,
)

float32_bits = st.integers(min_value=0, max_value=2**32 - 1)


def _floats_from_bits(bits):
    values = np.array(bits, dtype=np.uint32).view(np.float32)
    return np.concatenate([values, SPECIALS])


def _expected(values):
    return values.astype(ml_dtypes.bfloat16).view(np.uint16)


def _assert_same_bits(actual, expected, values):
    nan = np.isnan(values)
    assert np.all(np.isnan(from_bf16(actual[nan])))
    np.testing.assert_array_equal(actual[~nan], expected[~nan])


@given(st.lists(float32_bits, min_size=1, max_size=64))
def test_device_rounding_matches_ml_dtypes(bits):
    values = _floats_from_bits(bits)
    narrowed = cuda.to_device(np.full(values.size, 0xFFFF, np.uint16))
    widened = cuda.to_device(np.zeros(values.size, np.float32))
    _round_trip[1, 128](cuda.to_device(values), narrowed, widened)
    narrowed = narrowed.copy_to_host()
    _assert_same_bits(narrowed, _expected(values), values)
    np.testing.assert_array_equal(widened.copy_to_host().view(np.uint32), from_bf16(narrowed).view(np.uint32))


@given(st.lists(float32_bits, min_size=1, max_size=2048))
def test_host_rounding_matches_ml_dtypes(bits):
    values = _floats_from_bits(bits)
    narrowed = to_bf16(values)
    _assert_same_bits(narrowed, _expected(values), values)
    finite = ~np.isnan(values)
    np.testing.assert_array_equal(
        from_bf16(narrowed[finite]), values[finite].astype(ml_dtypes.bfloat16).astype(np.float32)
    )


def test_subnormals_and_ties():
    values = np.array([2**-133, 2**-130 * 1.5, 1 + 2**-8, 1 + 3 * 2**-8], dtype=np.float32)
    np.testing.assert_array_equal(to_bf16(values), _expected(values))
