"""Rotary position embedding (RoPE), HF's rotate-half layout, in place on q and k.

Each head vector of size D is read as D/2 planar pairs (x[i], x[i + D/2]); pair i turns by
the angle p * inv_freq[i] for a token at position p:

    x[i]       <- x[i] cos - x[i + D/2] sin
    x[i + D/2] <- x[i + D/2] cos + x[i] sin

(HF's `q * cos + rotate_half(q) * sin`). The angle is computed as HF computes it: the
position as float32 times the float32 inverse frequency, a float32 product, then cos and
sin in float32. The rotation itself is done in float32 and rounded to bf16 once.

The inverse frequencies are host work, done once per model: theta^(-2i/D), and for
Llama 3.x the `rope_scaling` of type "llama3", which leaves high frequencies alone,
divides low frequencies by `factor`, and blends smoothly between the two bands:

    wavelen = 2 pi / inv_freq
    wavelen < original / high_freq_factor:   inv_freq
    wavelen > original / low_freq_factor:    inv_freq / factor
    otherwise, s = (original / wavelen - low) / (high - low):
                                             (1 - s) inv_freq / factor + s inv_freq

One block per token. Thread (x, y) owns pairs 8x .. 8x + 7: it computes their cos and sin
once, then rotates those pairs in heads y, y + blockDim.y, ... of q and then of k, with
16-byte loads of both halves. D must be a multiple of 16 so that both halves are aligned.
"""

import math

import numpy as np
from numba import cuda, float32

from tinyvllm.kernels.checks import check_array
from tinyvllm.kernels.vector_io import VECTOR, check_rows_of_eight, load_bf16x8, store_bf16x8

THREADS = 128


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


# --8<-- [start:kernel]
@cuda.jit(device=True, inline=True)
def _rotate(row, first, half, cos, sin):
    a = cuda.local.array(VECTOR, float32)
    b = cuda.local.array(VECTOR, float32)
    load_bf16x8(row, first, a)
    load_bf16x8(row, first + half, b)
    for i in range(VECTOR):
        a_i = a[i]
        a[i] = a_i * cos[i] - b[i] * sin[i]
        b[i] = b[i] * cos[i] + a_i * sin[i]
    store_bf16x8(row, first, a)
    store_bf16x8(row, first + half, b)


@cuda.jit
def _rope_kernel(q, k, positions, inv_freq):
    token = cuda.blockIdx.x
    num_q_heads = q.shape[1]
    half = q.shape[2] // 2
    first = cuda.threadIdx.x * VECTOR
    position = float32(positions[token])
    cos = cuda.local.array(VECTOR, float32)
    sin = cuda.local.array(VECTOR, float32)
    for i in range(VECTOR):
        angle = position * inv_freq[first + i]
        cos[i] = math.cos(angle)
        sin[i] = math.sin(angle)
    for head in range(cuda.threadIdx.y, num_q_heads + k.shape[1], cuda.blockDim.y):
        if head < num_q_heads:
            _rotate(q[token, head], first, half, cos, sin)
        else:
            _rotate(k[token, head - num_q_heads], first, half, cos, sin)
# --8<-- [end:kernel]


def rope(q, k, positions, inv_freq, *, stream=0) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by their tokens' positions."""
    num_tokens, num_q_heads, head_dim = check_rows_of_eight("q", q, (None, None, None))
    if head_dim % (2 * VECTOR):
        raise ValueError(f"q: head_dim {head_dim} must be a multiple of {2 * VECTOR}")
    _, num_kv_heads, _ = check_rows_of_eight("k", k, (num_tokens, None, head_dim))
    check_array("positions", positions, np.int32, (num_tokens,))
    check_array("inv_freq", inv_freq, np.float32, (head_dim // 2,))
    if num_tokens == 0:
        return
    chunks = head_dim // (2 * VECTOR)
    heads_per_step = max(1, min(num_q_heads + num_kv_heads, THREADS // chunks))
    _rope_kernel[num_tokens, (chunks, heads_per_step), stream](q, k, positions, inv_freq)
