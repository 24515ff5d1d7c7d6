"""silu(gate) * up on the gate|up GEMM output (pairs interleaved), against the float64 reference."""

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
from tinyvllm.kernels.activation import silu_mul
from tinyvllm.kernels.reference import to_bf16
from tinyvllm.model.llama import interleave_rows


@st.composite
def problems(draw):
    tokens = draw(st.integers(1, pick(4, 300)))
    intermediate = 8 * draw(st.integers(1, pick(12, 1024)))
    scale = draw(st.sampled_from([0.1, 1.0, 20.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_bf16(rng, (tokens, 2 * intermediate), scale)


@given(problems())
def test_silu_mul_matches_reference(gate_up):
    tokens, intermediate = gate_up.shape[0], gate_up.shape[1] // 2
    out = poisoned((tokens, intermediate))
    silu_mul(cuda.to_device(gate_up), out)
    expected = reference.silu_mul(widen(gate_up))
    actual = widen(out)
    for row in range(tokens):
        assert relative_error(actual[row], expected[row]) < BF16_TOLERANCE, f"row {row}"


def test_extreme_gates_saturate_instead_of_overflowing():
    gate = np.array([-1e4, -100.0, -20.0, 0.0, 20.0, 100.0, 1e4, 3e38], np.float32)
    gate_up = interleave_rows(gate, np.full(8, 0.5, np.float32))[None, :]
    bits = to_bf16(gate_up)
    out = poisoned((1, 8))
    silu_mul(cuda.to_device(bits), out)
    with np.errstate(over="ignore"):
        expected = reference.silu_mul(widen(bits))[0]
    np.testing.assert_allclose(widen(out)[0], expected, rtol=1e-2, atol=1e-30)


def _valid_arguments():
    rng = np.random.default_rng(6)
    return {"gate_up": cuda.to_device(random_bf16(rng, (3, 32))), "out": poisoned((3, 16))}


BAD_ARGUMENTS = [
    ("gate_up", lambda: cuda.to_device(np.zeros((3, 32), np.float32))),
    ("gate_up", lambda: cuda.to_device(np.zeros((3, 16), np.uint16))),
    ("gate_up", lambda: cuda.to_device(np.zeros((4, 32), np.uint16))),
    ("gate_up", lambda: cuda.to_device(np.zeros((3, 64), np.uint16))[:, ::2]),
    ("gate_up", lambda: cuda.to_device(np.zeros(3 * 32 + 2, np.uint16))[2:].reshape(3, 32)),
    ("out", lambda: poisoned((3, 16), np.float32)),
    ("out", lambda: poisoned((3, 4, 4))),
    ("out", lambda: poisoned((3, 32))[:, ::2]),
    ("out", lambda: poisoned((3, 12))),
]


@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS)
def test_bad_arguments_are_rejected_by_name(name, make_bad):
    arguments = _valid_arguments()
    arguments[name] = make_bad()
    with pytest.raises(ValueError, match=f"^{name}:"):
        silu_mul(**arguments)
