"""Argument checks that every launcher runs before it launches.

A kernel given the wrong shape or dtype does not fail: it reads or writes the wrong
memory. So each launcher checks its arrays here first and raises a ValueError that names
the argument. The arrays may be NumPy arrays (the simulator), Numba device arrays or
CuPy arrays: all three have `.shape` and `.dtype`, and contiguity is asked of each in
its own way.
"""

from collections.abc import Sequence

import numpy as np


def is_c_contiguous(array) -> bool:
    if hasattr(array, "is_c_contiguous"):
        return array.is_c_contiguous()
    flags = array.flags
    return bool(flags["C_CONTIGUOUS"] if isinstance(flags, dict) else flags.c_contiguous)


def check_array(name: str, array, dtype, shape: Sequence[int | None]) -> tuple[int, ...]:
    """Check dtype, rank, each dimension that is not None, and C contiguity; return the shape.
    (A prefill step makes about 900 of these checks: the passing path does as little as it can.)"""
    actual_shape = getattr(array, "shape", None)
    actual_dtype = getattr(array, "dtype", None)
    if actual_shape is None or actual_dtype is None:
        raise ValueError(f"{name}: expected an array, got {type(array).__name__}")
    if actual_dtype != dtype:
        raise ValueError(f"{name}: expected dtype {np.dtype(dtype)}, got {np.dtype(actual_dtype)}")
    if len(actual_shape) != len(shape):
        raise ValueError(f"{name}: expected {len(shape)} dimensions, got shape {tuple(actual_shape)}")
    for axis, (actual, expected) in enumerate(zip(actual_shape, shape)):
        if expected is not None and actual != expected:
            raise ValueError(f"{name}: dimension {axis} is {actual}, expected {expected} (shape {tuple(actual_shape)})")
    if not is_c_contiguous(array):
        raise ValueError(f"{name}: must be C-contiguous")
    return tuple(actual_shape)


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name}: must be positive, got {value}")
