"""NumPy references for every kernel: the test oracle and the CPU backend.

Each function is the plain math of one operator, written for clarity, in whatever float
dtype it is given: the tests call it in float64 to judge the kernels, and the NumPy
backend calls it in float32 to run the model. The operators never see bf16; the callers
widen and narrow with `to_bf16` and `from_bf16`, the host twins of the device conversions
(`tinyvllm.kernels.device.bf16`). `gumbel_noise` is the host twin of the sampler's random
numbers (`tinyvllm.kernels.device.rng`), so the NumPy backend samples the tokens the GPU
samples. Nothing here imports Numba: loading weights and the NumPy backend need none.

Shapes follow the kernels: T tokens, Hq query heads, Hkv key/value heads, D head_dim,
S sequences. The paged KV cache is `[num_blocks, block_size, Hkv, D]` per layer for K and
for V; a sequence's token at position p lives in block `block_table[p // block_size]`,
row `p % block_size`.
"""

import numpy as np

BF16_EXPONENT_ALL_ONES = 0x7F800000
BF16_QUIET_NAN_BIT = 0x0040


# --8<-- [start:bf16]
def to_bf16(values: np.ndarray) -> np.ndarray:
    """Any float array -> uint16 bf16 bits (via float32, rounded to nearest even)."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    is_nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(BF16_EXPONENT_ALL_ONES)
    nan_bits = ((bits >> 16) | BF16_QUIET_NAN_BIT).astype(np.uint16)
    return np.where(is_nan, nan_bits, rounded)


def from_bf16(bits: np.ndarray) -> np.ndarray:
    """uint16 bf16 bits -> float32 (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


# --8<-- [end:bf16]


def embedding(token_ids: np.ndarray, table: np.ndarray) -> np.ndarray:
    """Rows of the embedding table: out[t] = table[token_ids[t]]."""
    return table[np.asarray(token_ids)]


def feed_sampled_tokens(token_ids: np.ndarray, token_sources: np.ndarray, sampled: np.ndarray) -> np.ndarray:
    """token_ids with row t replaced by sampled[token_sources[t]] where that source is >= 0."""
    fed = np.where(token_sources >= 0, sampled[np.maximum(token_sources, 0)], token_ids)
    return fed.astype(np.int32)


def rmsnorm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) * weight, over the last axis."""
    mean_square = np.mean(x * x, axis=-1, keepdims=True)
    return x / np.sqrt(mean_square + eps) * weight


def rope(x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray:
    """Rotary embedding with HF's rotate-half pairing: element i turns with i + D/2.

    x: [T, H, D]; positions: [T]; inv_freq: [D/2]. The angle of pair i at position p is
    p * inv_freq[i]; (a, b) -> (a cos - b sin, b cos + a sin).
    """
    half = x.shape[-1] // 2
    angles = np.asarray(positions, dtype=np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None, :]
    cos = np.cos(angles).astype(x.dtype)[:, None, :]
    sin = np.sin(angles).astype(x.dtype)[:, None, :]
    first, second = x[..., :half], x[..., half:]
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def silu_mul(gate_up: np.ndarray) -> np.ndarray:
    """SwiGLU's activation: gate_up = (gate, up) pairs interleaved on the last axis -> silu(gate) * up."""
    gate, up = gate_up[..., 0::2], gate_up[..., 1::2]
    return gate / (1 + np.exp(-gate)) * up


def linear(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """y = x @ W^T with W in HF's [out_features, in_features] orientation."""
    return x @ weight.T


def write_kv(k: np.ndarray, v: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slot_mapping: np.ndarray) -> None:
    """Scatter each token's K and V into its cache slot (in place); a negative slot is padding,
    and a slot past the end of the cache is skipped too."""
    num_blocks, block_size = k_cache.shape[:2]
    for token, slot in enumerate(np.asarray(slot_mapping)):
        if 0 <= slot < num_blocks * block_size:
            k_cache[slot // block_size, slot % block_size] = k[token]
            v_cache[slot // block_size, slot % block_size] = v[token]


def rope_write_kv(
    qkv: np.ndarray,
    positions: np.ndarray,
    inv_freq: np.ndarray,
    slot_mapping: np.ndarray,
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
) -> None:
    """The fused attention input step (in place): qkv [T, (Hq + 2 Hkv) * D] holds each token's
    query, key and value heads in that order; q = rope(query heads), and rope(key heads) and
    the value heads go to the cache at slot_mapping (write_kv)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    heads = qkv.reshape(num_tokens, num_q_heads + 2 * num_kv_heads, head_dim)
    keys, values = heads[:, num_q_heads : num_q_heads + num_kv_heads], heads[:, num_q_heads + num_kv_heads :]
    q[...] = rope(heads[:, :num_q_heads], positions, inv_freq)
    write_kv(rope(keys, positions, inv_freq), values, k_cache, v_cache, slot_mapping)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Softmax(q k^T / sqrt(D)) v for one sequence, GQA, causal.

    q: [n, Hq, D] are the last n of the L tokens in k, v: [L, Hkv, D]; query i sits at
    position L - n + i and sees keys 0 .. L - n + i. Query head h reads KV head
    h // (Hq // Hkv).
    """
    n, num_heads, head_dim = q.shape
    length, num_kv_heads, _ = k.shape
    group = num_heads // num_kv_heads
    k = np.repeat(k, group, axis=1)
    v = np.repeat(v, group, axis=1)
    scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim).astype(q.dtype)
    query_pos = np.arange(length - n, length)[:, None]
    key_pos = np.arange(length)[None, :]
    scores = np.where(key_pos <= query_pos, scores, -np.inf)
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,khd->qhd", weights, v)


def varlen_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, cu_seqlens: np.ndarray) -> np.ndarray:
    """Causal attention for a packed batch of whole sequences: sequence s is rows cu[s]:cu[s+1]."""
    out = np.empty_like(q)
    for start, end in zip(cu_seqlens[:-1], cu_seqlens[1:]):
        out[start:end] = causal_attention(q[start:end], k[start:end], v[start:end])
    return out


def gather_kv(cache: np.ndarray, block_table: np.ndarray, length: int) -> np.ndarray:
    """The first `length` tokens of one sequence's K (or V), read through its block table."""
    block_size = cache.shape[1]
    blocks = cache[np.asarray(block_table)[: (length + block_size - 1) // block_size]]
    return blocks.reshape(-1, *cache.shape[2:])[:length]


def paged_attention(
    q: np.ndarray,
    k_cache: np.ndarray,
    v_cache: np.ndarray,
    block_tables: np.ndarray,
    cu_seqlens_q: np.ndarray,
    context_lens: np.ndarray,
) -> np.ndarray:
    """Attention over the paged cache, for prefill, chunked prefill and decode alike.

    Sequence s owns query rows cu_seqlens_q[s]:cu_seqlens_q[s+1]: the newest of its
    context_lens[s] tokens, whose K and V are already in the cache. Decode is the case
    of one query row per sequence.
    """
    out = np.empty_like(q)
    for s, (start, end) in enumerate(zip(cu_seqlens_q[:-1], cu_seqlens_q[1:])):
        length = int(context_lens[s])
        k = gather_kv(k_cache, block_tables[s], length)
        v = gather_kv(v_cache, block_tables[s], length)
        out[start:end] = causal_attention(q[start:end], k, v)
    return out


def merge_partition_states(maxima: np.ndarray, sums: np.ndarray, outputs: np.ndarray) -> np.ndarray:
    """Split-K's merge: partition p's state is its max score m_p (base 2), its sum l_p of
    2^(s - m_p) and its unnormalised output acc_p[D]; the merged softmax output is
    sum_p 2^(m_p - M) acc_p / sum_p 2^(m_p - M) l_p, with M = max_p m_p."""
    weights = np.exp2(np.asarray(maxima, np.float64) - np.max(maxima))
    return weights @ np.asarray(outputs, np.float64) / (weights @ np.asarray(sums, np.float64))


def argmax(logits: np.ndarray) -> np.ndarray:
    """Greedy choice per row; ties take the lowest index."""
    return np.argmax(logits, axis=-1).astype(np.int32)


def sampling_probs(logits: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The distribution one row is sampled from, after temperature, top-k and top-p.

    Both filters are thresholds, so ties at the edge are kept. top-k keeps every token
    whose logit is at least the k-th largest (-1 keeps all). top-p then sorts the
    remaining probabilities in descending order, finds the first one at which the
    cumulative sum reaches top_p, and keeps every token at least that probable. The kept
    probabilities are renormalised. temperature 0 is greedy: all mass on the argmax.
    """
    logits = np.asarray(logits, dtype=np.float64)
    probs = np.zeros_like(logits)
    if temperature == 0:
        probs[np.argmax(logits)] = 1.0
        return probs
    keep = np.ones(logits.shape, dtype=bool)
    if top_k > 0:
        keep &= logits >= np.sort(logits)[::-1][min(top_k, logits.size) - 1]
    scaled = np.where(keep, logits / temperature, -np.inf)
    weights = np.exp(scaled - scaled.max())
    weights /= weights.sum()
    descending = np.sort(weights)[::-1]
    crossing = min(int(np.searchsorted(np.cumsum(descending), top_p)), weights.size - 1)
    probs = np.where(weights >= descending[crossing], weights, 0.0)
    return probs / probs.sum()


def apply_penalties(
    logits: np.ndarray,
    output_counts: np.ndarray,
    seen: np.ndarray,
    presence: float,
    frequency: float,
    repetition: float,
) -> np.ndarray:
    """vLLM's penalties on one row of raw logits (`apply_penalties` in vLLM's
    model_executor/layers/utils.py). repetition_penalty r first, on every token seen in the
    prompt or the output: a positive logit is divided by r, any other multiplied. Then
    OpenAI's two, on the output's counts c: l - frequency * c - presence * (c > 0)."""
    factor = np.where(seen, repetition, 1.0).astype(logits.dtype)
    penalized = np.where(logits > 0, logits / factor, logits * factor)
    return penalized - frequency * output_counts - presence * (output_counts > 0)


def min_p_filter(logits: np.ndarray, temperature: float, min_p: float) -> np.ndarray:
    """One row with every token less probable than min_p times the most probable one (after
    temperature) set to -inf, as vLLM's min-p processor; a greedy row (temperature 0) as it is."""
    if temperature == 0 or min_p == 0:
        return logits
    scaled = np.asarray(logits, np.float64) / temperature
    probs = np.exp(scaled - scaled.max())
    return np.where(probs < min_p * probs.max(), -np.inf, logits).astype(logits.dtype)


def logprobs(logits: np.ndarray, sampled: int, num_top: int) -> tuple[float, int, np.ndarray, np.ndarray]:
    """One row's raw log-softmax, in float64: the sampled token's logprob and rank (1 + the
    tokens with a larger logit), and the ids and logprobs of the `num_top` most likely tokens,
    most likely first, ties to the lowest id (`kernels/logprobs.py`)."""
    logits = np.asarray(logits, np.float64)
    peak = logits.max()
    log_softmax = logits - (peak + np.log(np.exp(logits - peak).sum()))
    top = np.argsort(-logits, kind="stable")[:num_top]
    rank = int((logits > logits[sampled]).sum()) + 1
    return float(log_softmax[sampled]), rank, top.astype(np.int32), log_softmax[top]


LOW32 = np.uint64(0xFFFFFFFF)
SHIFT_32 = np.uint64(32)
_SHIFT_15 = np.uint64(15)
_SHIFT_16 = np.uint64(16)
_MIX_1 = np.uint64(0x7FEB352D)
_MIX_2 = np.uint64(0x846CA68B)
SALTS = (np.uint64(0x9E3779B9), np.uint64(0x85EBCA6B))
TWO_POW_M32 = np.float32(2.0**-32)
BELOW_ONE = np.float32(1.0 - 2.0**-24)


def mix32(x):
    """lowbias32 on 32-bit words held in uint64 (the device's `rng._mix32` is this function, jitted)."""
    x = x ^ (x >> _SHIFT_16)
    x = (x * _MIX_1) & LOW32
    x = x ^ (x >> _SHIFT_15)
    x = (x * _MIX_2) & LOW32
    return x ^ (x >> _SHIFT_16)


def gumbel_noise(seed: int, offset: int, vocab: int) -> np.ndarray:
    """G_0 .. G_{vocab-1} for (seed, offset), float32: what the device's `rng.gumbel` computes."""
    words = [np.uint64(int(seed) % 2**64), np.uint64(int(offset) % 2**64)]
    keys = []
    for salt in SALTS:
        state = salt
        for word in words:
            state = mix32(state ^ (word & LOW32))
            state = mix32(state ^ (word >> SHIFT_32))
        keys.append(state)
    bits = mix32(mix32(np.arange(vocab, dtype=np.uint64) ^ keys[0]) ^ keys[1])
    uniform = np.minimum(bits.astype(np.float32) * TWO_POW_M32 + np.float32(0.5) * TWO_POW_M32, BELOW_ONE)
    return -np.log(-np.log1p(-uniform))
