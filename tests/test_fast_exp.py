"""`exp2_ftz` (`tinyvllm/kernels/device/fast_exp.py`) against NumPy's float64 exp2.

The oracle is exp2 of the float32 argument in float64, with the instruction's two flushes: a
subnormal argument counts as 0, a result below 2^-126 is 0. Within the normal range
`ex2.approx` is within 2 ulp (2^-22 of the value). The kernel test runs the instruction on a
GPU and the stand-in under the simulator; the compile test (GPU toolchain, no simulator)
checks that it is one MUFU.EX2 with no subnormal fix-up around it.
"""

import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from numba import cuda, types

from tests.helpers import SIMULATOR
from tinyvllm.kernels.device.fast_exp import _simulated_exp2_ftz, exp2_ftz

SMALLEST_NORMAL = 2.0**-126
RELATIVE_BOUND = 2.0**-22
EDGES = np.array(
    [0.0, -0.0, 1e-40, -1e-40, 1.0, -1.0, 0.5, -125.5, -126.5, -127.0, -149.0, -200.0, 127.5, 128.0, 200.0,
     -np.inf, np.inf],
    np.float32,
)  # fmt: skip


@cuda.jit
def exp2_ftz_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i] = exp2_ftz(x[i])


def arguments() -> np.ndarray:
    rng = np.random.default_rng(7)
    normal = rng.uniform(-125.9, 127.9, 2000)  # results within the normal range, clear of its edges
    flushed = rng.uniform(-180.0, -126.1, 200)  # results that would be subnormal or underflow
    near_zero = rng.standard_normal(300) * 1e-3  # softmax's usual weights near 1
    return np.concatenate([normal, flushed, near_zero, EDGES]).astype(np.float32)


def expected(x: np.ndarray) -> np.ndarray:
    x = np.where(np.abs(x) < SMALLEST_NORMAL, 0.0, x.astype(np.float64))
    with np.errstate(over="ignore"):
        exact = np.exp2(x)
    return np.where(exact < SMALLEST_NORMAL, 0.0, exact)


def assert_matches_oracle(actual: np.ndarray, x: np.ndarray) -> None:
    oracle = expected(x)
    flushed = oracle == 0.0
    assert np.all(actual[flushed] == 0.0), x[flushed & (actual != 0.0)]
    infinite = np.isinf(oracle) | (oracle > np.finfo(np.float32).max)
    assert np.all(np.isposinf(actual[infinite])), x[infinite & ~np.isposinf(actual)]
    finite = ~flushed & ~infinite
    error = np.abs(actual[finite].astype(np.float64) - oracle[finite]) / oracle[finite]
    assert error.max() <= RELATIVE_BOUND, (x[finite][error.argmax()], error.max())


def test_stand_in_matches_the_oracle():
    x = arguments()
    actual = np.array([_simulated_exp2_ftz(v) for v in x], np.float32)
    assert_matches_oracle(actual, x)
    assert np.isnan(_simulated_exp2_ftz(np.float32(np.nan)))


def test_kernel_matches_the_oracle():
    x = np.concatenate([arguments(), np.float32([np.nan])])
    out = cuda.to_device(np.full(x.shape, -1.0, np.float32))  # poison: NaN is a result here, a negative never
    exp2_ftz_kernel[-(-x.size // 128), 128](cuda.to_device(x), out)
    actual = out.copy_to_host()
    assert np.isnan(actual[-1])
    assert_matches_oracle(actual[:-1], x[:-1])


@pytest.mark.skipif(SIMULATOR or shutil.which("ptxas") is None, reason="needs NVVM and ptxas, no simulator")
def test_compiles_to_one_mufu_without_fix_up():
    from perf.experiments.mma_sass import compile_for_sm90, disassemble

    signature = (types.float32[::1], types.float32[::1])
    with tempfile.TemporaryDirectory() as folder:
        ptx, _, cubin = compile_for_sm90(exp2_ftz_kernel, signature, Path(folder))
        if shutil.which("nvdisasm") is None:
            pytest.skip("the SASS check needs nvdisasm")
        sass = disassemble(cubin)
    assert "ex2.approx.ftz.f32" in ptx
    assert sass.count("MUFU.EX2") == 1
    assert "-126" not in sass  # ptxas's subnormal fix-up compares the argument with -126
