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

`gumbel` is the device function; `gumbel_noise` computes the same numbers on the host (for
the NumPy backend, which then samples the tokens the GPU samples, and for the tests).
"""

import math

import numpy as np
from numba import cuda, float32, uint64

_LOW32 = np.uint64(0xFFFFFFFF)
_SHIFT_15 = np.uint64(15)
_SHIFT_16 = np.uint64(16)
_SHIFT_32 = np.uint64(32)
_MIX_1 = np.uint64(0x7FEB352D)
_MIX_2 = np.uint64(0x846CA68B)
SALTS = (np.uint64(0x9E3779B9), np.uint64(0x85EBCA6B))
GUMBEL_MAX = np.float32(23.0)
"""Above every G: U >= 2**-33 makes -log(1 - U) >= 2**-33 and G <= 33 log 2 = 22.87."""
_TWO_POW_M32 = np.float32(2.0**-32)
_BELOW_ONE = np.float32(1.0 - 2.0**-24)


def _mix32_host(x):
    x = x ^ (x >> _SHIFT_16)
    x = (x * _MIX_1) & _LOW32
    x = x ^ (x >> _SHIFT_15)
    x = (x * _MIX_2) & _LOW32
    return x ^ (x >> _SHIFT_16)


_mix32 = cuda.jit(device=True, inline=True)(_mix32_host)


# --8<-- [start:gumbel]
@cuda.jit(device=True, inline=True)
def stream_key(salt, seed, offset):
    """key_j of the row (seed, offset), salt = SALTS[j]; seed and offset as uint64."""
    state = _mix32(salt ^ (seed & _LOW32))
    state = _mix32(state ^ (seed >> _SHIFT_32))
    state = _mix32(state ^ (offset & _LOW32))
    return _mix32(state ^ (offset >> _SHIFT_32))


@cuda.jit(device=True, inline=True)
def gumbel(key_1, key_2, index):
    """G_index of the stream (key_1, key_2), float32."""
    bits = _mix32(_mix32(uint64(index) ^ key_1) ^ key_2)
    uniform = min(float32(bits) * _TWO_POW_M32 + float32(0.5) * _TWO_POW_M32, _BELOW_ONE)
    return -math.log(-math.log1p(-uniform))
# --8<-- [end:gumbel]


def gumbel_noise(seed: int, offset: int, vocab: int) -> np.ndarray:
    """G_0 .. G_{vocab-1} for (seed, offset) on the host, float32: what `gumbel` computes."""
    words = [np.uint64(int(seed) % 2**64), np.uint64(int(offset) % 2**64)]
    keys = []
    for salt in SALTS:
        state = salt
        for word in words:
            state = _mix32_host(state ^ (word & _LOW32))
            state = _mix32_host(state ^ (word >> _SHIFT_32))
        keys.append(state)
    bits = _mix32_host(_mix32_host(np.arange(vocab, dtype=np.uint64) ^ keys[0]) ^ keys[1])
    uniform = np.minimum(bits.astype(np.float32) * _TWO_POW_M32 + np.float32(0.5) * _TWO_POW_M32, _BELOW_ONE)
    return -np.log(-np.log1p(-uniform))
