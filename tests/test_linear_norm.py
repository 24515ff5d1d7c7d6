"""The RMSNorm in front of a product (`norm`) and the residual add after it (`accumulate`).

Oracles: the float64 reference RMSNorm, then the float64 product (rounded to bf16 where
the unfused path stores it); for `accumulate`, the reference sum of the prior out and
the product. The GEMV applies the norm as it multiplies and never rounds the normed row;
the tiled kernel reads the row that the norm's own kernel stored in bf16.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests import test_linear_rope_write_kv as rope_tests
from tests import test_linear_silu_mul as silu_tests
from tests.helpers import (
    BF16_TOLERANCE,
    pick,
    poisoned,
    random_bf16,
    relative_error,
    sharded,
    widen,
)
from tests.test_gemv import small_gpu
from tinyvllm.kernels import reference
from tinyvllm.kernels.gemv_shape import MAX_ROWS
from tinyvllm.kernels.linear import linear, linear_rope_write_kv, linear_silu_mul
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.kernels.reference import to_bf16

KERNELS = ("gemv", "tiled")
NORMED_GEMV_TOLERANCE = 1e-4
"""The GEMV's float32 sums of the unrounded normed row: float32 rounding, and the rms."""


@st.composite
def gains(draw, k: int):
    """A norm's gain of K elements and its eps."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_bf16(rng, (k,), draw(st.sampled_from([0.1, 1.0, 3.0]))), draw(st.sampled_from([1e-6, 1e-5, 0.5]))


@st.composite
def products(draw, max_rows=MAX_ROWS):
    """x [M, K] (K whole chunks, rows of very different sizes), weight [N, K], a gain."""
    m = draw(st.integers(1, max_rows))
    n = draw(st.integers(1, pick(9, 700)))
    k = 8 * draw(st.integers(1, pick(8, 600)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = to_bf16(rng.standard_normal((m, k)) * rng.choice([1e-2, 1.0, 40.0], (m, 1)))
    return x, random_bf16(rng, (n, k)), *draw(gains(k))


def normed(x, gain, eps) -> np.ndarray:
    """The reference norm of x's rows in float64."""
    return reference.rmsnorm(widen(x), widen(gain), eps)


def normed_bits(x, gain, eps) -> np.ndarray:
    """The normed rows as the norm's own kernel stores them: bf16 bits."""
    return to_bf16(normed(x, gain, eps))


def prior_residual(x, weight) -> np.ndarray:
    """The residual a product is added to, as large as the product, seeded from x."""
    rng = np.random.default_rng(int(x[0, 0]))
    return random_bf16(rng, (x.shape[0], weight.shape[0]), scale=np.sqrt(x.shape[1]))


def norm_on_device(x, gain, eps) -> RMSNorm:
    return RMSNorm(cuda.to_device(gain), eps, poisoned(x.shape))


@given(products(), st.sampled_from([np.uint16, np.float32]), st.sampled_from(KERNELS))
def test_normed_product_matches_reference(problem, out_dtype, kernel):
    x, weight, gain, eps = problem
    out = poisoned((x.shape[0], weight.shape[0]), out_dtype)
    linear(cuda.to_device(x), cuda.to_device(weight), out, norm=norm_on_device(x, gain, eps), kernel=kernel)
    actual = widen(out) if out_dtype == np.uint16 else out.copy_to_host().astype(np.float64)
    error = relative_error(actual, reference.linear(normed(x, gain, eps), widen(weight)))
    exact_norm = kernel == "gemv" and out_dtype == np.float32
    assert error <= (NORMED_GEMV_TOLERANCE if exact_norm else BF16_TOLERANCE)


@given(products(max_rows=1), st.integers(1, 3))
def test_normed_gemv_blocks_loop_over_row_groups_past_the_grid(problem, num_sms):
    x, weight, gain, eps = problem
    out = poisoned((1, weight.shape[0]), np.float32)
    with small_gpu(num_sms):
        linear(cuda.to_device(x), cuda.to_device(weight), out, norm=norm_on_device(x, gain, eps), kernel="gemv")
    expected = reference.linear(normed(x, gain, eps), widen(weight))
    assert relative_error(out.copy_to_host(), expected) <= NORMED_GEMV_TOLERANCE


@given(products(), st.sampled_from(KERNELS))
def test_accumulated_product_matches_reference(problem, kernel):
    x, weight, _, _ = problem
    prior = prior_residual(x, weight)
    out = cuda.to_device(prior)
    linear(cuda.to_device(x), cuda.to_device(weight), out, accumulate=True, kernel=kernel)
    expected = widen(prior) + reference.linear(widen(x), widen(weight))
    assert relative_error(widen(out), expected) <= BF16_TOLERANCE


@given(products(), st.sampled_from(KERNELS))
def test_normed_gate_up_with_silu_matches_reference(problem, kernel):
    x, weight, gain, eps = problem
    # (gate, up) pairs, a whole number of chunks of them: the unfused activation needs it
    weight = np.resize(weight, (16 * -(-weight.shape[0] // 8), weight.shape[1]))
    out = poisoned((x.shape[0], weight.shape[0] // 2))
    linear_silu_mul(
        cuda.to_device(x),
        cuda.to_device(weight),
        poisoned((x.shape[0], weight.shape[0])),
        out,
        norm=norm_on_device(x, gain, eps),
        kernel=kernel,
    )
    # the GEMV multiplies the normed row unrounded: rounding it first moves a product whose
    # terms cancel (found on the H200 at ca7724f: 8 terms of about 1 summing to 0.0032)
    rows = normed(x, gain, eps) if kernel == "gemv" else normed_bits(x, gain, eps)
    silu_tests.assert_matches_reference(out.copy_to_host(), rows, weight)


@sharded(2)
@given(rope_tests.problems(whole_vectors=True), st.data(), st.sampled_from(KERNELS))
def test_normed_qkv_with_rope_matches_reference(shard, problem, data, kernel):
    x = problem["x"]
    gain, eps = data.draw(gains(x.shape[1]))
    arguments = rope_tests.on_device(problem)
    qkv = poisoned((x.shape[0], problem["weight"].shape[0]))
    linear_rope_write_kv(
        arguments.pop("x"), arguments.pop("weight"), qkv, **arguments, norm=norm_on_device(x, gain, eps), kernel=kernel
    )
    rope_tests.assert_matches_reference(rope_tests.targets(arguments), problem | {"x": normed_bits(x, gain, eps)})


@pytest.mark.gpu
@given(products())
def test_cublas_normed_and_accumulated_products_match_reference(problem):
    x, weight, gain, eps = problem
    prior = prior_residual(x, weight)
    out = cuda.to_device(prior)
    linear(
        cuda.to_device(x),
        cuda.to_device(weight),
        out,
        norm=norm_on_device(x, gain, eps),
        accumulate=True,
        kernel="cublas",
    )
    expected = widen(prior) + reference.linear(normed(x, gain, eps), widen(weight))
    assert relative_error(widen(out), expected) <= BF16_TOLERANCE


def test_accumulating_needs_a_bf16_out():
    rng = np.random.default_rng(4)
    x, weight = cuda.to_device(random_bf16(rng, (1, 16))), cuda.to_device(random_bf16(rng, (3, 16)))
    with pytest.raises(ValueError, match="^out: accumulating into it needs dtype uint16"):
        linear(x, weight, poisoned((1, 3), np.float32), accumulate=True, kernel="gemv")


@pytest.mark.parametrize(
    ("norm", "message"),
    [
        (lambda: RMSNorm(cuda.to_device(np.zeros(8, np.uint16)), 1e-5, poisoned((1, 16))), "^weight:"),
        (lambda: RMSNorm(cuda.to_device(np.zeros(16, np.uint16)), 1e-5, poisoned((2, 16))), "^normed:"),
        (lambda: RMSNorm(cuda.to_device(np.zeros(16, np.uint16)), 0.0, poisoned((1, 16))), "^eps"),
    ],
)
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_bad_norm_is_refused_by_name(norm, message, kernel):
    rng = np.random.default_rng(5)
    x, weight = cuda.to_device(random_bf16(rng, (1, 16))), cuda.to_device(random_bf16(rng, (3, 16)))
    with pytest.raises(ValueError, match=message):
        linear(x, weight, poisoned((1, 3)), norm=norm(), kernel=kernel)
