"""The tensor-core kernels compile for sm_90 into what they were written for, and spill nothing.

Drives `perf/experiments/mma_sass.py`: NVVM's PTX must hold the three instructions, and
ptxas must keep every value in registers (no spills, no stack frame). Needs NVVM and ptxas
and real PTX, so under the simulator it is skipped like the GPU-only tests (on the CPU
machine run the script itself with the simulator off).
"""

import shutil
import tempfile
from pathlib import Path

import pytest

from tests.helpers import SIMULATOR

pytestmark = pytest.mark.skipif(SIMULATOR or shutil.which("ptxas") is None, reason="needs NVVM and ptxas, no simulator")


@pytest.mark.parametrize(
    "name", ["mma_kernel", "staged_kernel", "mma_gemm_kernel", "gemm_kernel", "chained_f16_kernel"]
)
def test_kernel_compiles_to_tensor_core_instructions_without_spills(name):
    from perf.experiments.mma_sass import KERNELS, compile_for_sm90

    kernel, signature = KERNELS[name]
    with tempfile.TemporaryDirectory() as folder:
        ptx, report, _ = compile_for_sm90(kernel, signature, Path(folder))
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    if name != "mma_kernel":
        assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and "cp.async.cg.shared.global" in ptx
        assert ".shared .align 16" in ptx
    if name == "chained_f16_kernel":
        assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx and "cvt.rn.f16x2.f32" in ptx
    assert "0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads" in report
