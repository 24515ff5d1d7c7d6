"""No kernel of a decode step keeps values in local memory, at batch 1 to 8 (ptxas, sm_90).

A memory-bound kernel that spills, or that keeps a local array in memory (a stack frame),
pays for it in bandwidth (`perf/kernel_registers.py`, which this test drives). It needs
Numba's NVVM and ptxas from a CUDA toolkit, and real PTX: under the simulator there is none,
so there it is skipped like the GPU-only tests.
"""

import shutil

import pytest

from perf.kernel_registers import compile_step
from tests.helpers import SIMULATOR
from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tinyvllm.model.config import ModelConfig

pytestmark = pytest.mark.skipif(SIMULATOR or shutil.which("ptxas") is None, reason="needs NVVM and ptxas, no simulator")

SINE_SLOW_PATH_BYTES = 32
"""The stack frame of the kernels that turn RoPE's pairs: libdevice's sine reduces large
arguments through a local array, on a path that positions times inverse frequencies below
10^5 never take."""
ROPE_OPERATORS = ("rope_write_kv", "linear_rope_write_kv")


@pytest.mark.parametrize("batch", [1, 2, 4, 8])
def test_decode_step_kernels_keep_nothing_in_local_memory(batch):
    rows = compile_step(ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG), batch, 2048)
    operators = {"linear (down)", "decode_attention", "cascade_decode_attention", "sample"}
    assert {row["operator"] for row in rows} >= operators
    for row in rows:
        allowed = SINE_SLOW_PATH_BYTES if row["operator"] in ROPE_OPERATORS else 0
        assert row["spill_store_bytes"] == 0 and row["spill_load_bytes"] == 0, row
        assert row["stack_bytes"] <= allowed, row
