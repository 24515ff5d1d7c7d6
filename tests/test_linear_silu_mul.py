"""The MLP's gate|up product with SwiGLU after it: fused into the GEMV's store, or unfused.

Oracles: the float64 reference of x @ W^T, rounded to bf16 as the unfused path stores it,
then silu(gate) * up; and, for the fused GEMV, the unfused GEMV + activation kernel, which
must give the very same bits (same sums, same roundings).
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import BF16_TOLERANCE, SIMULATOR, pick, poisoned, random_bf16, sharded, widen
from tests.test_gemv import LONG_KS, small_gpu
from tinyvllm.kernels import reference
from tinyvllm.kernels.activation import silu_mul
from tinyvllm.kernels.gemv import gemv
from tinyvllm.kernels.gemv_shape import MAX_ROWS
from tinyvllm.kernels.gemv_silu import gemv_silu_mul
from tinyvllm.kernels.linear import linear_silu_mul
from tinyvllm.kernels.reference import from_bf16, to_bf16
from tinyvllm.model.llama import interleave_rows


@st.composite
def problems(draw, whole_vectors=False):
    """x [M, K] and an interleaved gate|up weight [2I, K]; I around the block edge, K ragged too.
    Under the simulator a long K comes with one row and I of at most 8: a long K at M = 4 and
    I = 24 took the simulator about a minute a call."""
    k = draw(st.one_of(st.integers(1, pick(64, 5000)), st.sampled_from(LONG_KS)))
    small = k in LONG_KS and SIMULATOR
    m = draw(st.one_of(st.just(1), st.integers(1, 1 if small else MAX_ROWS)))
    if whole_vectors:
        intermediate = 8 * draw(st.integers(1, 1 if small else pick(3, 90)))
    else:
        intermediate = draw(st.one_of(st.integers(1, 8 if small else pick(9, 700)), st.sampled_from([1, 2, 3])))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gate, up = random_bf16(rng, (intermediate, k)), random_bf16(rng, (intermediate, k))
    return random_bf16(rng, (m, k)), interleave_rows(gate, up)


def assert_matches_reference(actual, x, weight) -> None:
    """actual within bf16 tolerance of the reference (the product rounded to bf16, as the
    unfused path stores it, then SwiGLU in float64), measured against the largest the
    output could be given its factors, |silu(g) u| <= |g u|. A norm of the outputs alone is
    ill-conditioned: where g is large and negative, silu(g) u is tiny and a one-ulp change
    of the rounded g moves it by half of itself. x is bf16 bits, or float64 rows that the
    kernel multiplies unrounded."""
    rows = x if x.dtype == np.float64 else widen(x)
    gate_up = from_bf16(to_bf16(reference.linear(rows, widen(weight)))).astype(np.float64)
    error = np.linalg.norm(widen(actual) - reference.silu_mul(gate_up))
    assert error <= BF16_TOLERANCE * np.linalg.norm(gate_up[..., 0::2] * gate_up[..., 1::2])


def run_fused(x, weight) -> np.ndarray:
    out = poisoned((x.shape[0], weight.shape[0] // 2))
    gemv_silu_mul(cuda.to_device(x), cuda.to_device(weight), out)
    return out.copy_to_host()


@given(problems())
def test_fused_gemv_matches_reference(problem):
    x, weight = problem
    assert_matches_reference(run_fused(x, weight), x, weight)


@sharded(2)
@given(problems(), st.integers(1, 3))
def test_fused_gemv_blocks_loop_over_row_groups_past_the_grid(shard, problem, num_sms):
    x, weight = problem[0][:1], problem[1]  # the grid is capped at M = 1 only
    with small_gpu(num_sms):
        assert_matches_reference(run_fused(x, weight), x, weight)


@sharded(4)
@given(problems(whole_vectors=True))
def test_fused_gemv_gives_the_bits_of_gemv_then_activation(shard, problem):
    x, weight = problem
    gate_up = poisoned((x.shape[0], weight.shape[0]))
    gemv(cuda.to_device(x), cuda.to_device(weight), gate_up)
    unfused = poisoned((x.shape[0], weight.shape[0] // 2))
    silu_mul(gate_up, unfused)
    np.testing.assert_array_equal(run_fused(x, weight), unfused.copy_to_host())


@pytest.mark.parametrize("kernel", ["gemv", "tiled"])
def test_linear_silu_mul_matches_reference_on_every_backend(kernel):
    rng = np.random.default_rng(3)
    m = 1 if kernel == "gemv" else MAX_ROWS + 1
    gate, up = random_bf16(rng, (24, 40)), random_bf16(rng, (24, 40))
    x, weight = random_bf16(rng, (m, 40)), interleave_rows(gate, up)
    gate_up, out = poisoned((m, 48)), poisoned((m, 24))
    linear_silu_mul(cuda.to_device(x), cuda.to_device(weight), gate_up, out, kernel=kernel)
    assert_matches_reference(out.copy_to_host(), x, weight)


def _valid_arguments():
    rng = np.random.default_rng(6)
    return {
        "x": cuda.to_device(random_bf16(rng, (2, 16))),
        "weight": cuda.to_device(random_bf16(rng, (16, 16))),
        "gate_up": poisoned((2, 16)),
        "out": poisoned((2, 8)),
    }


BAD_ARGUMENTS = [
    ("x", lambda: cuda.to_device(np.zeros((2, 16), np.float32))),
    ("weight", lambda: cuda.to_device(np.zeros((16, 8), np.uint16))),
    ("weight", lambda: cuda.to_device(np.zeros((15, 16), np.uint16))),
    ("gate_up", lambda: poisoned((2, 12))),
    ("gate_up", lambda: poisoned((2, 16), np.float32)),
    ("out", lambda: poisoned((2, 16))),
    ("out", lambda: poisoned((3, 8))),
]


@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS)
@pytest.mark.parametrize("kernel", ["gemv", "tiled"])
def test_bad_arguments_are_rejected_by_name(name, make_bad, kernel):
    arguments = _valid_arguments()
    arguments[name] = make_bad()
    with pytest.raises(ValueError, match=f"^{name}:"):
        linear_silu_mul(**arguments, kernel=kernel)


def test_fused_gemv_refuses_more_than_max_rows():
    rng = np.random.default_rng(2)
    x = cuda.to_device(random_bf16(rng, (MAX_ROWS + 1, 16)))
    weight = cuda.to_device(random_bf16(rng, (4, 16)))
    with pytest.raises(ValueError, match="^x:"):
        gemv_silu_mul(x, weight, poisoned((MAX_ROWS + 1, 2)))
