"""The RMSNorm kernel against the float64 NumPy reference (the norm inside the GEMV:
test_linear_norm.py)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import (
    BF16_TOLERANCE,
    pick,
    poisoned,
    random_bf16,
    relative_error,
    widen,
)
from tinyvllm.kernels import reference
from tinyvllm.kernels.rmsnorm import MAX_HIDDEN, rmsnorm


# --8<-- [start:property]
@st.composite
def problems(draw):
    tokens = draw(st.integers(1, pick(3, 200)))
    hidden = 8 * draw(st.one_of(st.integers(1, pick(12, 1024)), st.sampled_from(pick([72], [72, 256, 1024]))))
    eps = draw(st.floats(1e-8, 1e-2))
    scale = draw(st.sampled_from([1e-3, 1.0, 30.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = random_bf16(rng, (tokens, hidden), scale)
    weight = random_bf16(rng, (hidden,))
    return x, weight, eps


def _assert_rows_close(actual, expected):
    for row in range(expected.shape[0]):
        assert relative_error(actual[row], expected[row]) < BF16_TOLERANCE, f"row {row}"


@given(problems())
def test_rmsnorm_matches_reference(problem):
    x, weight, eps = problem
    out = poisoned(x.shape)
    x_device = cuda.to_device(x)
    rmsnorm(x_device, cuda.to_device(weight), eps, out)
    _assert_rows_close(widen(out), reference.rmsnorm(widen(x), widen(weight), eps))
    np.testing.assert_array_equal(x_device.copy_to_host(), x)


# --8<-- [end:property]


def test_rmsnorm_of_a_zero_row_is_zero():
    x = np.zeros((2, 64), np.uint16)
    out = poisoned(x.shape)
    rmsnorm(cuda.to_device(x), cuda.to_device(random_bf16(np.random.default_rng(0), (64,))), 1e-6, out)
    assert np.all(widen(out) == 0)


def _valid_arguments():
    rng = np.random.default_rng(3)
    return {
        "x": cuda.to_device(random_bf16(rng, (3, 16))),
        "weight": cuda.to_device(random_bf16(rng, (16,))),
        "eps": 1e-5,
        "out": poisoned((3, 16)),
    }


BAD_ARGUMENTS = [
    ("x", lambda: cuda.to_device(np.zeros((3, 16), np.float32))),
    ("x", lambda: cuda.to_device(np.zeros((3, 4, 4), np.uint16))),
    ("x", lambda: cuda.to_device(np.zeros((3, 32), np.uint16))[:, ::2]),
    ("x", lambda: cuda.to_device(np.zeros(49, np.uint16))[1:].reshape(3, 16)),
    ("weight", lambda: cuda.to_device(np.zeros(24, np.uint16))),
    ("weight", lambda: cuda.to_device(np.zeros(16, np.float32))),
    ("weight", lambda: cuda.to_device(np.zeros(32, np.uint16))[::2]),
    ("out", lambda: poisoned((2, 16))),
    ("out", lambda: poisoned((3, 16), np.int16)),
    ("out", lambda: poisoned((3, 32))[:, ::2]),
    ("eps", lambda: 0.0),
    ("eps", lambda: -1e-6),
]


@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS)
def test_bad_arguments_are_rejected_by_name(name, make_bad):
    arguments = _valid_arguments()
    arguments[name] = make_bad()
    with pytest.raises(ValueError, match=f"^{name}:"):
        rmsnorm(**arguments)


def test_rows_that_are_not_a_multiple_of_eight_are_rejected():
    x = cuda.to_device(np.zeros((2, 12), np.uint16))
    with pytest.raises(ValueError, match="^x:.*multiple of 8"):
        rmsnorm(x, cuda.to_device(np.zeros(12, np.uint16)), 1e-5, poisoned((2, 12)))


def test_rows_longer_than_the_kernel_maximum_are_rejected():
    hidden = MAX_HIDDEN + 8
    with pytest.raises(ValueError, match=f"^x: hidden size {hidden}"):
        rmsnorm(
            cuda.to_device(np.zeros((1, hidden), np.uint16)),
            cuda.to_device(np.zeros(hidden, np.uint16)),
            1e-5,
            cuda.to_device(np.zeros((1, hidden), np.uint16)),
        )
