"""Round floats to bfloat16 with tinyvllm's host arithmetic and look at the bits (no GPU needed).

Run it from the repository root: python docs/examples/bfloat16.py
"""

import numpy as np

from tinyvllm.kernels.reference import from_bf16, to_bf16

values = np.array([1.0, 1 / 3, 1.00390625, 1.01171875, 65504.0, 3.0e38], dtype=np.float32)
bits = to_bf16(values)  # uint16: the top half of each float32, rounded to nearest even
back = from_bf16(bits)  # exact: the 16 bits become the top half of a float32 again
for value, b, rounded in zip(values, bits, back):
    float_bits = int(np.float32(value).view(np.uint32))
    print(f"{value:>14.8g}  float32 0x{float_bits:08X}  bf16 0x{int(b):04X}  = {rounded:.8g}")

# 1/3 is 0x3EAAAAAB: the dropped half 0xAAAB is more than half a unit, so the kept half rounds up.
assert bits[1] == 0x3EAB
# 1 + 2^-8 and 1 + 3 * 2^-8 are ties: each goes to the neighbour whose last kept bit is even.
assert bits[2] == 0x3F80 and bits[3] == 0x3F82
# The relative error of rounding is at most 2^-8 for every normal value.
assert np.all(np.abs(back - values) <= np.abs(values) * 2.0**-8)
