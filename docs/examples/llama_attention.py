"""Grouped-query attention's head mapping, the causal mask and softmax with a temperature,
checked on the engine's NumPy references (no GPU needed).

Run it from the repository root: python docs/examples/llama_attention.py
"""

import numpy as np

from tinyvllm.kernels import reference

rng = np.random.default_rng(0)
q_heads, kv_heads, head_dim, length = 4, 2, 8, 6
group = q_heads // kv_heads
q = rng.standard_normal((length, q_heads, head_dim))
k = rng.standard_normal((length, kv_heads, head_dim))
v = rng.standard_normal((length, kv_heads, head_dim))
out = reference.causal_attention(q, k, v)  # [length, q_heads, head_dim]

# Which KV head does each query head read? Change one KV head's values and see whose output moves.
for kv in range(kv_heads):
    changed = v.copy()
    changed[:, kv] += 1.0
    moved = np.abs(reference.causal_attention(q, k, changed) - out).max(axis=(0, 2)) > 0
    print(f"KV head {kv} is read by query heads {np.flatnonzero(moved).tolist()}")
    assert np.flatnonzero(moved).tolist() == [h for h in range(q_heads) if h // group == kv]

# The causal mask: changing the last token's key and value leaves every earlier output as it was.
k2, v2 = k.copy(), v.copy()
k2[-1] += 1.0
v2[-1] += 1.0
later = reference.causal_attention(q, k2, v2)
assert np.array_equal(later[:-1], out[:-1]) and not np.allclose(later[-1], out[-1])
print("changing token 5's key and value changes only token 5's output")

# Softmax with a temperature, by hand, against the sampler's reference distribution.
logits = np.array([2.0, 1.0, 0.5, -1.0])
for temperature in (0.5, 1.0, 2.0):
    by_hand = np.exp(logits / temperature) / np.exp(logits / temperature).sum()
    engine = reference.sampling_probs(logits, temperature, -1, 1.0)
    print(f"T = {temperature}: {np.round(engine, 3)}")
    assert np.allclose(by_hand, engine)
greedy = reference.sampling_probs(logits, 0.0, -1, 1.0)
assert greedy.argmax() == reference.argmax(logits[None])[0] == 0 and greedy.max() == 1.0
print("T = 0: all the probability on the argmax, token 0")
