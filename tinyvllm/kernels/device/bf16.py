"""bfloat16: the top half of a float32.

A bf16 number keeps float32's sign bit and 8 exponent bits and the first 7 of its 23
mantissa bits, so it covers float32's whole range with about 3 significant digits.
tinyvllm stores every bf16 tensor as `uint16` bits, on the host and on the device. These
are the device conversions; `reference.to_bf16` and `reference.from_bf16` are their host twins.

Widening is exact: shift the 16 bits into the high half of a 32-bit word.
Narrowing rounds to nearest, ties to even: add 0x7FFF plus the lowest kept bit, then
drop the low 16 bits. A carry out of the mantissa bumps the exponent, which is exactly
the right answer (and turns the largest finite values into infinity, as IEEE rounding
does). NaN is the one input the addition could corrupt (a NaN whose payload sits only in
the low bits would round to infinity), so it is kept NaN by setting a quiet bit.
"""

import numpy as np
from numba import cuda

from tinyvllm.kernels.reference import BF16_EXPONENT_ALL_ONES, BF16_QUIET_NAN_BIT


# --8<-- [start:device]
@cuda.jit(device=True, inline=True)
def bf16_to_f32(bits):
    """uint16 bf16 bits -> float32 (exact)."""
    return np.uint32(np.uint32(bits) << np.uint32(16)).view(np.float32)


@cuda.jit(device=True, inline=True)
def f32_to_bf16(value):
    """float32 -> uint16 bf16 bits, rounded to nearest even."""
    bits = np.float32(value).view(np.uint32)
    if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(BF16_EXPONENT_ALL_ONES):
        return np.uint16((bits >> np.uint32(16)) | np.uint32(BF16_QUIET_NAN_BIT))
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return np.uint16(np.uint32(bits + rounding) >> np.uint32(16))


# --8<-- [end:device]
