"""RoPE's inverse frequencies: host work, done once per model from its config.

Pair i of a head of size D turns by the angle p * inv_freq[i] at position p (the kernel,
`tinyvllm.kernels.rope`). The inverse frequencies are theta^(-2i/D), and for Llama 3.x the
`rope_scaling` of type "llama3", which leaves high frequencies alone, divides low
frequencies by `factor`, and blends smoothly between the two bands:

    wavelen = 2 pi / inv_freq
    wavelen < original / high_freq_factor:   inv_freq
    wavelen > original / low_freq_factor:    inv_freq / factor
    otherwise, s = (original / wavelen - low) / (high - low):
                                             (1 - s) inv_freq / factor + s inv_freq
"""

import math

import numpy as np


# --8<-- [start:inv-freq]
def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    """float32[head_dim // 2] inverse frequencies, computed in float32 steps as transformers does.

    The one step done wider is theta ** exponent: in float64, then rounded, which is what
    torch's float32 pow aims for (it can differ in the last bit).
    """
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim: must be a positive even number, got {head_dim}")
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / head_dim
    powers = (np.float64(np.float32(theta)) ** exponents.astype(np.float64)).astype(np.float32)
    inv_freq = np.float32(1.0) / powers
    rope_type = "default" if scaling is None else scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type != "llama3":
        raise ValueError(f"rope_scaling: unsupported rope_type {rope_type!r} (supported: 'default', 'llama3')")
    factor = scaling["factor"]
    low_freq_factor = scaling["low_freq_factor"]
    high_freq_factor = scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    low_freq_wavelen = original / low_freq_factor
    high_freq_wavelen = original / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


# --8<-- [end:inv-freq]
