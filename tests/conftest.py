"""The two worlds of the test suite.

With a GPU, the kernels run on it. Without one, Numba's CUDA simulator runs the very same
`@cuda.jit` Python code on the CPU; the switch must be made before anything imports
`numba.cuda`, which is why it sits at the top of the root conftest. Hypothesis gets a
profile for each world: a few tiny examples under the (slow) simulator, many model-sized
ones on the GPU.
"""

import importlib.util
import os
import sys
import threading

from tinyvllm.hardware import has_cuda_gpu

# --8<-- [start:worlds]
if not has_cuda_gpu():
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1"

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

from tests.helpers import SIMULATOR  # noqa: E402

# Six examples a property under the simulator: its kernels run a Python thread per CUDA thread,
# and at eight the CPU suite took 20 to 28 minutes on a 2-core machine (perf/LOG.md, 2026-12-07).
settings.register_profile(
    "simulator",
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
)
# Twelve examples a property keep the whole GPU suite within 8 minutes on the H200: many
# kernels compile anew for each drawn head size or block shape, so a property's time grows
# with its examples (at twenty, the 61866d5 run took 515 s). Each run draws new ones.
settings.register_profile("gpu", max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "simulator" if SIMULATOR else "gpu"))
# --8<-- [end:worlds]

if SIMULATOR:
    # The simulator runs each CUDA thread as a Python thread and busy-waits for them at
    # every barrier; a short GIL switch interval hands them the interpreter sooner
    # (about 10x faster kernels).
    sys.setswitchinterval(5e-5)


@pytest.fixture(autouse=True, scope="session")
def simulator_shared_arrays():
    """Numba's CUDA simulator creates a shared array when a thread first reaches its line,
    keyed by that line, without a lock; the key comes from reading the stack, which lets
    other threads run. Two threads of a block that reach the line together can then get
    different arrays, and that block computes garbage (seen in most runs of the attention
    tests). Creation is made atomic here, with the same key. Nothing changes on a GPU."""
    if not SIMULATOR:
        yield
        return
    from numba.cuda import types
    from numba.cuda.np.numpy_support import as_dtype
    from numba.cuda.simulator.kernelapi import FakeCUDAShared

    original = FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:
            return original(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            if key not in self._allocations:
                self._allocations[key] = np.empty(shape, as_dtype(dtype) if isinstance(dtype, types.Type) else dtype)
            return self._allocations[key]

    FakeCUDAShared.array = array
    yield
    FakeCUDAShared.array = original


def pytest_collection_modifyitems(config, items):
    if not SIMULATOR:
        return
    skip_gpu = pytest.mark.skip(reason="needs a real CUDA GPU; runs on the H200 (perf/gpu_check.sh)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")  # a constant: Hypothesis refuses function-scoped fixtures
def shard() -> int:
    """A sharded property's shard (tests/helpers.py `sharded`): the one item under the simulator."""
    return 0


@pytest.fixture(scope="module")
def one_torch_thread():
    """torch's worker threads slow down manyfold when the two cores are shared; one thread stays steady."""
    if importlib.util.find_spec("torch") is None:
        yield  # no torch, no threads to pin
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
