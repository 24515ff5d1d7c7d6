"""Which captured decode graph a batch replays, and the padding rows that make a batch of 5 fit
a graph recorded for 8: the runner's own bucket list and padding, on the host (no GPU).

Run it from the repository root: python docs/examples/graph_padding.py
"""

import numpy as np

from tinyvllm.engine.cuda_graphs import graph_buckets, pad_decode_step
from tinyvllm.engine.model_runner import build_step
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.sequence import Sequence
from tinyvllm.sampling_params import SamplingParams

buckets = graph_buckets(max_num_seqs=64)
print("graphs captured for batches of", buckets)

seqs = []
for index in range(5):  # five sequences, each decoding its 7th token
    seq = Sequence(str(index), list(range(7)), SamplingParams(temperature=0.0))
    seq.num_computed_tokens, seq.block_table = 6, [2 * index, 2 * index + 1]
    seqs.append(seq)
batch = ScheduledBatch(seqs=seqs, num_scheduled_tokens=np.ones(5, dtype=np.int32),
                       samples=np.ones(5, dtype=bool), num_decodes=5)  # fmt: skip
step = build_step(batch, block_size=4, max_blocks_per_seq=4)
size = min(bucket for bucket in buckets if bucket >= len(seqs))
padded = pad_decode_step(step, size)
print(f"a batch of {len(seqs)} replays the graph for {size}")
for name in ("slot_mapping", "context_lens", "temperature", "sample_rows"):
    print(f"  {name:<13}{getattr(padded, name)}")
# The padding rows write no KV (slot -1), attend to one token, and sample greedily; their
# outputs are never read, so the graph computes the real rows exactly as an eager step would.
assert (padded.slot_mapping[5:] == -1).all() and (padded.context_lens[5:] == 1).all()
assert np.array_equal(padded.slot_mapping[:5], step.slot_mapping)
