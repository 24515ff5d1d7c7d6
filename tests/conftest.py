"""The two worlds of the test suite.

With a GPU, the kernels run on it. Without one, Numba's CUDA simulator runs the very same
`@cuda.jit` Python code on the CPU; the switch must be made before anything imports
`numba.cuda`, which is why it sits at the top of the root conftest. Hypothesis gets a
profile for each world: a few tiny examples under the (slow) simulator, many model-sized
ones on the GPU.
"""

import os
import sys

from tinyvllm.hardware import has_cuda_gpu

# --8<-- [start:worlds]
if not has_cuda_gpu():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.helpers import SIMULATOR  # noqa: E402

settings.register_profile(
    "simulator",
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
settings.register_profile(
    "gpu", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "simulator" if SIMULATOR else "gpu"))
# --8<-- [end:worlds]

if SIMULATOR:
    # The simulator runs each CUDA thread as a Python thread and busy-waits for them at
    # every barrier; a short GIL switch interval hands them the interpreter sooner
    # (about 10x faster kernels).
    sys.setswitchinterval(5e-5)


def pytest_collection_modifyitems(config, items):
    if not SIMULATOR:
        return
    skip_gpu = pytest.mark.skip(reason="needs a real CUDA GPU; runs on the H200 (perf/gpu_check.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch's worker threads slow down manyfold when the two cores are shared; one thread stays steady."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
