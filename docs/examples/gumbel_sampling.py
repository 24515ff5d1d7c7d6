"""Softmax with a temperature by hand, against the sampler's reference distribution, and
Gumbel-max draws with the sampler's own counter-based noise (reference.gumbel_noise, what the
GPU computes): argmax(l / T + G) lands on each token as often as softmax(l / T) says.

Run it from the repository root: python docs/examples/gumbel_sampling.py
"""

import numpy as np

from tinyvllm.kernels import reference

logits = np.array([2.0, 1.0, 0.5, 0.0, -1.0])
temperature, seed, draws = 0.7, 1234, 3000
probs = np.exp(logits / temperature) / np.exp(logits / temperature).sum()
assert np.allclose(probs, reference.sampling_probs(logits, temperature, -1, 1.0))

# The noise of token i is a hash of (seed, offset, i): the engine's offset is the position of the
# token being sampled, so each position gets fresh noise and a rerun gets the same noise.
counts = np.zeros(len(logits))
for position in range(draws):
    noise = reference.gumbel_noise(seed, position, len(logits))
    counts[np.argmax(logits / temperature + noise)] += 1
print("softmax(l / T):", np.round(probs, 3))
print("Gumbel-max    :", np.round(counts / draws, 3), f"({draws} positions)")
assert np.abs(counts / draws - probs).max() < 0.03
assert np.array_equal(reference.gumbel_noise(seed, 7, 5), reference.gumbel_noise(seed, 7, 5))  # no hidden state

# top-k 2 keeps the two largest logits; the draw is then among them only.
print("top_k = 2     :", np.round(reference.sampling_probs(logits, temperature, 2, 1.0), 3))
