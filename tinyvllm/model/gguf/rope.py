"""Llama 3.1+/3.2 RoPE scaling ("llama3") from a GGUF: metadata plus `rope_freqs.weight`.

HF's config describes llama3 scaling by four numbers (`rope_scaling`: factor, low_freq_factor,
high_freq_factor, original_max_position_embeddings). llama.cpp's converter instead stores the
result, one divisor per rotary frequency (`rope_freqs.weight`, head_dim / 2 float32 values:
1 for the fast frequencies, `factor` for the slow ones, a smooth blend between), and writes
none of the four numbers unless a `llama.rope.scaling.*` key says so.

The numbers are read back as: `factor` = `llama.rope.scaling.factor`, else the largest divisor;
the original context = `llama.rope.scaling.original_context_length`, else 8192; low and high
frequency factors 1 and 4 (GGUF has no key for them; Meta's Llama 3.1 and 3.2 use these, and
they are llama.cpp's converter's defaults). The divisors these numbers give, computed as the
converter computes them, must equal the file's; otherwise the file describes some other
scaling and is refused rather than converted into a model with different positions.
"""

import math
from pathlib import Path

import numpy as np

from tinyvllm.model.gguf.format import GGUFError

ROPE_FREQS = "rope_freqs.weight"
DEFAULT_ORIGINAL_CONTEXT = 8192
DEFAULT_LOW_FREQ_FACTOR = 1.0
DEFAULT_HIGH_FREQ_FACTOR = 4.0
# The converter computes in float32 (torch) and we in float64: a few float32 roundings apart at most;
# another factor or context length moves the divisors by far more.
_RELATIVE_TOLERANCE = 1e-5


def llama3_divisors(head_dim: int, theta: float, scaling: dict) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py rope_freqs for these llama3 numbers, as float32 [head_dim / 2]."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)))
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    original = scaling["original_max_position_embeddings"]
    low_freq_wavelen, high_freq_wavelen = original / low, original / high
    divisors = []
    for freq in freqs.astype(np.float64):
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            divisors.append(1.0)
        elif wavelen > low_freq_wavelen:
            divisors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def rope_scaling(
    metadata: dict, rope_freqs: np.ndarray | None, head_dim: int, theta: float, source: Path | str
) -> dict | None:
    """config.json's `rope_scaling` for this file: None, or the llama3 dict its rope_freqs agree with."""
    scaling_type = metadata.get("llama.rope.scaling.type", "none")
    if rope_freqs is None:
        if scaling_type != "none":
            raise GGUFError(f"{source}: RoPE scaling {scaling_type!r} (llama.rope.scaling.type) is not supported")
        return None
    if scaling_type not in ("none", "llama3"):
        raise GGUFError(f"{source}: RoPE scaling {scaling_type!r} with {ROPE_FREQS} is not supported (only llama3)")
    divisors = np.asarray(rope_freqs, dtype=np.float32).reshape(-1)
    if divisors.shape != (head_dim // 2,):
        raise GGUFError(f"{source}: {ROPE_FREQS} has {divisors.size} values, expected head_dim / 2 = {head_dim // 2}")
    if not np.all(np.isfinite(divisors)) or divisors.min() < 1:
        raise GGUFError(f"{source}: {ROPE_FREQS} holds divisors below 1 or not finite; llama3 scaling has 1 to factor")
    scaling = {
        "rope_type": "llama3",
        "factor": float(metadata.get("llama.rope.scaling.factor", divisors.max())),
        "low_freq_factor": DEFAULT_LOW_FREQ_FACTOR,
        "high_freq_factor": DEFAULT_HIGH_FREQ_FACTOR,
        "original_max_position_embeddings": int(
            metadata.get("llama.rope.scaling.original_context_length", DEFAULT_ORIGINAL_CONTEXT)
        ),
    }
    if scaling["original_max_position_embeddings"] <= 0:
        raise GGUFError(f"{source}: llama.rope.scaling.original_context_length must be positive")
    expected = llama3_divisors(head_dim, theta, scaling)
    wrong = np.flatnonzero(~np.isclose(divisors, expected, rtol=_RELATIVE_TOLERANCE, atol=0))
    if wrong.size:
        i = wrong[0]
        numbers = ", ".join(f"{key} {value}" for key, value in scaling.items() if key != "rope_type")
        raise GGUFError(
            f"{source}: {ROPE_FREQS} disagrees with llama3 RoPE scaling ({numbers}, rope_theta {theta}) at "
            f"{wrong.size} of {divisors.size} frequencies (first: #{i} is {divisors[i]}, expected {expected[i]})"
        )
    return scaling
