"""Counter-based random numbers: the randomness of a token is a hash of where it is drawn.

A generator with a running state makes each number depend on how many were drawn before
it, and so a sampled token on the batch around it. Hashing the coordinates instead gives
each (seed, offset, token index) its own number (cuRAND's and JAX's Philox work the same
way), so a token drawn again, after preemption or in another batch, is the same token:

    key_j  = mix(mix(mix(mix(salt_j ^ seed_lo) ^ seed_hi) ^ offset_lo) ^ offset_hi)   j = 1, 2
    bits_i = mix(mix(i ^ key_1) ^ key_2)
    U_i    = (bits_i + 1/2) / 2**32, kept below 1
    G_i    = -log(-log(1 - U_i))

mix is lowbias32 (C. Wellons' hash prospector), a bijection of 32-bit words with strong
avalanche; the two keys carry 64 bits of (seed, offset). G_i is a standard Gumbel variable:
-log(1 - U) is exponential, computed with log1p so that U near 0 (large G, the values that
win an argmax) keeps the 2**-32 grid. Words are 32-bit values held in uint64, so no product
wraps (NumPy and the CUDA simulator warn when one does).

`gumbel` is the device function; `reference.gumbel_noise` computes the same numbers on the
host (for the NumPy backend, which then samples the tokens the GPU samples, and for the
tests), and the hash and its constants are defined there once.
"""

import math

import numpy as np
from numba import cuda, float32, uint64

from tinyvllm.kernels.reference import BELOW_ONE, LOW32, SHIFT_32, TWO_POW_M32, mix32

GUMBEL_MAX = np.float32(23.0)
"""Above every G: U >= 2**-33 makes -log(1 - U) >= 2**-33 and G <= 33 log 2 = 22.87."""

_mix32 = cuda.jit(device=True, inline=True)(mix32)


# --8<-- [start:gumbel]
@cuda.jit(device=True, inline=True)
def stream_key(salt, seed, offset):
    """key_j of the row (seed, offset), salt = SALTS[j]; seed and offset as uint64."""
    state = _mix32(salt ^ (seed & LOW32))
    state = _mix32(state ^ (seed >> SHIFT_32))
    state = _mix32(state ^ (offset & LOW32))
    return _mix32(state ^ (offset >> SHIFT_32))


@cuda.jit(device=True, inline=True)
def gumbel(key_1, key_2, index):
    """G_index of the stream (key_1, key_2), float32."""
    bits = _mix32(_mix32(uint64(index) ^ key_1) ^ key_2)
    uniform = min(float32(bits) * TWO_POW_M32 + float32(0.5) * TWO_POW_M32, BELOW_ONE)
    return -math.log(-math.log1p(-uniform))


# --8<-- [end:gumbel]
