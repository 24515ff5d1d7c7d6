"""The tensor-core GEMM prototype (perf/experiments/mma_gemm.py) against NumPy, tiny shapes.

C = A @ B^T with bf16 inputs and float32 accumulation, checked against the float64
product of the same bf16 values. Under the simulator this tests the tiling, the
cp.async / ldmatrix offsets and the accumulator layout through mma.py's stand-ins; on a
GPU the same test runs the tensor cores.
"""

import numpy as np
import pytest
from numba import cuda

from perf.experiments.mma_gemm import mma_gemm
from tests.helpers import poisoned, random_bf16, widen

TOLERANCE = 1e-5


def check_against_numpy(m, n, k):
    rng = np.random.default_rng(m + n + k)
    a, b = random_bf16(rng, (m, k)), random_bf16(rng, (n, k))
    c = poisoned((m, n), np.float32)
    mma_gemm(cuda.to_device(a), cuda.to_device(b), c)
    actual, expected = c.copy_to_host(), widen(a) @ widen(b).T
    assert np.all(np.isfinite(actual)), "unwritten output (NaN poison) left"
    np.testing.assert_allclose(actual, expected, rtol=TOLERANCE, atol=TOLERANCE * np.abs(expected).max())


@pytest.mark.gpu
def test_mma_gemm_at_a_model_shape():
    """Llama 3.2 1B's o projection at a 512-token prefill: 8 x 32 blocks, 128 K steps."""
    check_against_numpy(512, 2048, 2048)


@pytest.mark.parametrize(("m", "n", "k"), [(64, 64, 16), (128, 64, 48), (64, 128, 32)])
def test_mma_gemm_matches_numpy(m, n, k):
    check_against_numpy(m, n, k)


def test_mma_gemm_refuses_ragged_shapes():
    a, b = np.zeros((64, 24), np.uint16), np.zeros((64, 24), np.uint16)
    with pytest.raises(ValueError, match="multiples"):
        mma_gemm(a, b, np.zeros((64, 64), np.float32))
