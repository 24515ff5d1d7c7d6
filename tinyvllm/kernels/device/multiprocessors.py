"""How many blocks the GPU runs at once: kernels that size their grid to the GPU ask here."""

import functools

from numba import cuda

from tinyvllm.kernels.device.simulator import SIMULATOR

H200_SMS = 132
"""The simulator's stand-in for the multiprocessor count it does not report."""


@functools.cache
def multiprocessor_count() -> int:
    """The current GPU's SM count (the H200's under the simulator, which reports none)."""
    if SIMULATOR:
        return H200_SMS
    return cuda.get_current_device().MULTIPROCESSOR_COUNT
