"""Planned launches (tinyvllm/kernels/device/launch.py) against Numba's own, on a real GPU.

The first launch of a kernel with given argument types goes through Numba and makes the
plan; the ones after go through the plan. Both must give what NumPy gives."""

import numpy as np
import pytest
from numba import cuda

from tinyvllm import LLM, SamplingParams
from tinyvllm.kernels.device.launch import launch_kernel, unplanned_kernels
from tinyvllm.model.default_model import default_model_dir

pytestmark = pytest.mark.gpu


@cuda.jit
def _scaled_sum(a, b, scale, offset, out):
    """out[i, j] = a[i, j] * scale + b[i, j] + offset, b possibly a strided view."""
    i, j = cuda.grid(2)
    if i < out.shape[0] and j < out.shape[1]:
        out[i, j] = a[i, j] * scale + b[i, j] + offset


def test_planned_launches_equal_numba_launches_and_numpy():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((37, 19)).astype(np.float32)
    wide = rng.standard_normal((37, 40)).astype(np.float32)
    d_a, d_wide = cuda.to_device(a), cuda.to_device(wide)
    # scales are powers of two, so a * scale is exact and a fused multiply-add rounds as NumPy does
    for round_, (scale, offset, step) in enumerate([(2.0, 3, 2), (-0.25, -7, 2), (4.0, 11, 1), (0.5, 0, 2)]):
        b = wide[:, : 19 * step : step]
        out = cuda.to_device(np.full((37, 19), np.nan, np.float32))
        d_b = d_wide[:, : 19 * step : step]
        launch_kernel(_scaled_sum, (37, 1), (1, 32), 0, d_a, d_b, np.float32(scale), offset, out)
        expected = a * np.float32(scale) + b + np.float32(offset)
        np.testing.assert_array_equal(out.copy_to_host(), expected, err_msg=f"launch {round_}")
    assert "_scaled_sum" not in unplanned_kernels()


def test_an_engine_launches_its_eager_kernels_through_plans():
    """A prefill step's kernels, and eager decode's, have plans; only kernels with a boolean
    argument (the penalties') or a tuple of arrays (the GEMV whose epilogue applies RoPE and
    writes the KV cache, `gemv_rope.py`, through gemv_normalized) go through Numba."""
    llm = LLM(default_model_dir(), backend="cuda", max_model_len=512, num_blocks=64, enforce_eager=True)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    first = llm.generate(["The capital of France is"], params)[0].outputs[0].token_ids
    again = llm.generate(["The capital of France is"], params)[0].outputs[0].token_ids
    assert first == again
    assert unplanned_kernels() <= {"_penalty_kernel", "gemv_normalized"}
