"""Online softmax by hand: attention for one query computed while the keys stream by, with a
running max, sum and output; then the same context cut into partitions and merged (split-K),
both against the engine's reference attention.

Run it from the repository root: python docs/examples/online_softmax.py
"""

import numpy as np

from tinyvllm.kernels import reference

rng = np.random.default_rng(0)
length, dim = 50, 16
q = rng.standard_normal(dim)
k, v = rng.standard_normal((2, length, dim))
scores = k @ q / np.sqrt(dim)
want = reference.causal_attention(q[None, None], k[:, None], v[:, None])[0, 0]  # one query, the newest


def stream(scores: np.ndarray, values: np.ndarray) -> tuple[float, float, np.ndarray]:
    """The online softmax's state after the keys, one at a time: (max m, sum of weights, output acc)."""
    m, total, acc = -np.inf, 0.0, np.zeros(values.shape[1])
    for s, value in zip(scores, values):
        new_m = max(m, s)
        scale = np.exp(m - new_m)  # rescale what was summed under the old max; 0 for the empty state
        total, acc, m = total * scale + np.exp(s - new_m), acc * scale + np.exp(s - new_m) * value, new_m
    return m, total, acc


m, total, acc = stream(scores, v)
print(f"one pass, no stored scores: max {m:.3f}, sum {total:.3f}; error {np.abs(acc / total - want).max():.1e}")
assert np.allclose(acc / total, want)

# Split-K: four partitions, each its own state, merged with the rule the merge kernel uses.
parts = [stream(scores[i : i + 13], v[i : i + 13]) for i in range(0, length, 13)]
maxima, sums, outputs = (np.array(column) for column in zip(*parts))
merged = reference.merge_partition_states(maxima / np.log(2), sums, outputs)  # it takes base-2 maxima
print(f"{len(parts)} partitions, maxima {np.round(maxima, 2)}: merged error {np.abs(merged - want).max():.1e}")
assert np.allclose(merged, want)
