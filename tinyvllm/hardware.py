"""Is there a CUDA GPU here? Asked of the driver directly, without importing Numba.

The answer decides two things before any kernel module is imported: the test run
switches Numba to its CUDA simulator when it is False, and `LLM(backend="auto")` picks
the NumPy backend.
"""

import ctypes
import functools


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
