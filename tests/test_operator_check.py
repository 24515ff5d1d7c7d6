"""The operator check (tests/operator_check.py) itself: a normed product is right by either
rounding of the normed row, and wrong when it skips the norm."""

import numpy as np

from tests.helpers import relative_error
from tests.operator_check import OPERATOR_TOLERANCE, OperatorCheck
from tinyvllm.kernels import reference
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.kernels.reference import from_bf16, to_bf16

EPS = 1e-5


class FusedNormLinear:
    """A host stand-in for a kernel that applies the norm itself, in float64, the normed
    rows never rounded (as the GEMV keeps them in float32); or one that forgets the norm."""

    def __init__(self, applies_norm: bool = True):
        self.applies_norm = applies_norm

    def synchronize(self) -> None:
        """Nothing runs asynchronously."""

    def linear(self, x, weight, out, norm=None, accumulate=False) -> None:
        rows = from_bf16(x).astype(np.float64)
        if norm is not None and self.applies_norm:
            rms = np.sqrt(np.mean(rows * rows, axis=-1, keepdims=True) + EPS)
            rows = rows / rms * from_bf16(norm.weight)
        out[...] = to_bf16(rows @ from_bf16(weight).astype(np.float64).T)


def _cancelling_product(seed: int = 0):
    """Rows with two large channels that the weights subtract: their bf16 roundings, not
    averaged out, decide much of the product (SmolLM2's norm gains make such channels)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, 64))
    x[:, 0], x[:, 1] = 300.3, 299.1
    weight = rng.standard_normal((8, 64)) * 0.01
    weight[:, 0], weight[:, 1] = 1.0, -1.0
    gain = to_bf16(1.0 + 0.1 * rng.standard_normal(64))
    return to_bf16(x), to_bf16(weight), RMSNorm(gain, EPS, np.zeros((2, 64), np.uint16))


def _worst(backend) -> float:
    x, weight, norm = _cancelling_product()
    check = OperatorCheck(backend)
    check.linear(x, weight, np.zeros((2, 8), np.uint16), norm=norm)
    return check.worst[("linear (normed)", "out")]


def test_the_two_roundings_of_the_normed_row_are_far_apart_here():
    x, weight, norm = _cancelling_product()
    rows = reference.rmsnorm(from_bf16(x), from_bf16(norm.weight), EPS)
    as_float32 = reference.linear(rows, from_bf16(weight))
    as_bf16 = reference.linear(from_bf16(to_bf16(rows)), from_bf16(weight))
    assert relative_error(as_float32, as_bf16) > 10 * OPERATOR_TOLERANCE


def test_a_kernel_that_keeps_the_normed_rows_in_float32_passes():
    assert _worst(FusedNormLinear()) <= OPERATOR_TOLERANCE


def test_a_kernel_that_skips_the_norm_fails():
    assert _worst(FusedNormLinear(applies_norm=False)) > 0.5
