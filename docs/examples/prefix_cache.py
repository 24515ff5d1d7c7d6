"""Two prompts that share their first 8 tokens, through the real prefix-caching allocator:
A computes and registers its full blocks, B finds the shared ones and computes only the rest.

Run it from the repository root: python docs/examples/prefix_cache.py
"""

from tinyvllm.engine.prefix_cache import PrefixCachingAllocator, attach_prefix, register_computed_blocks
from tinyvllm.engine.sequence import Sequence
from tinyvllm.sampling_params import SamplingParams

block_size = 4
cache = PrefixCachingAllocator(8)
a = Sequence("A", [7, 3, 9, 1, 4, 4, 2, 8, 5, 6, 0, 3], SamplingParams(max_tokens=1))
b = Sequence("B", [7, 3, 9, 1, 4, 4, 2, 8, 1, 1, 5, 2], SamplingParams(max_tokens=1))

a.block_table = cache.allocate(3).tolist()  # A's 12 tokens, computed: three full blocks
a.num_computed_tokens = 12
register_computed_blocks(cache, a, block_size)  # each full block is now findable by its content
print("A's blocks", a.block_table, "keys", [f"{key & 0xFFFF:04x}" for key in a.block_keys])

cached = attach_prefix(cache, b, block_size)  # B's lookup walks its blocks and stops at a miss
print(f"B found {cached} tokens cached, in blocks {b.block_table}; owners {cache.ref_counts[:3].tolist()}")
assert cached == 8 and b.block_table == a.block_table[:2]
assert cache.ref_counts[a.block_table[0]] == 2 and cache.ref_counts[a.block_table[2]] == 1

# A finishes: its blocks lose an owner but stay cached, so a third prompt like A finds all three.
cache.free(a.block_table)
c = Sequence("C", [*a.token_ids, 9], SamplingParams(max_tokens=1))
print(f"after A is freed, C (A's 12 tokens and one more) finds {attach_prefix(cache, c, block_size)} tokens")
assert c.block_table == a.block_table
