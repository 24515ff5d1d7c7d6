"""Is there a CUDA GPU here? Asked of the driver directly, without importing Numba.

The answer decides two things before any kernel module is imported: the test run
switches Numba to its CUDA simulator when it is False, and `LLM(backend="auto")` picks
the NumPy backend.
"""

import ctypes
import functools
import importlib.util


@functools.cache
def has_cuda_gpu() -> bool:
    """True when the CUDA driver loads, initialises and reports at least one device."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    if driver.cuInit(0) != 0:
        return False
    count = ctypes.c_int(0)
    return driver.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0


def cuda_device_name(ordinal: int = 0) -> str | None:
    """The name the driver gives device `ordinal` (the one the engine runs on), None without one."""
    if not has_cuda_gpu():
        return None
    driver = ctypes.CDLL("libcuda.so.1")
    device = ctypes.c_int(0)
    if driver.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return None
    name = ctypes.create_string_buffer(256)
    if driver.cuDeviceGetName(name, len(name), device) != 0:
        return None
    return name.value.decode()


def missing_for_cuda() -> str | None:
    """What this machine lacks for the CUDA backend, in words (None when it has it all)."""
    if not has_cuda_gpu():
        return "a CUDA GPU and its driver, and this machine has none"
    if importlib.util.find_spec("cupy") is None:
        return 'CuPy, which is not installed (pip install -e ".[cuda12]" or ".[cuda13]")'
    return None
