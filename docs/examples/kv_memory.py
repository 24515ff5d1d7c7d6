"""What a token of KV cache costs, how many fit in a GiB, and the block allocator's owner counts.

Run it from the repository root: python docs/examples/kv_memory.py
Numbers come from the models' configs (ModelConfig) and the engine's own sizing function.
"""

import json
from pathlib import Path

import numpy as np

from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tinyvllm.engine.block_manager import BlockAllocator, OutOfBlocks
from tinyvllm.engine.model_runner import kv_block_bytes
from tinyvllm.model.config import ModelConfig

smollm2 = json.loads(Path("docs/generated/smollm2_config.json").read_text())
for name, config in (("SmolLM2-135M", ModelConfig.from_dict(smollm2)),
                     ("Llama 3.2 1B", ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG))):  # fmt: skip
    per_token = kv_block_bytes(config, 1, np.uint16)  # one token's K and V, all layers, bf16
    by_hand = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim * 2
    assert per_token == by_hand
    print(f"{name}: {per_token:,} bytes a token, {2**30 // per_token:,} tokens a GiB, "
          f"a 16-token block {kv_block_bytes(config, 16, np.uint16) // 1024} KiB")  # fmt: skip

# The allocator: a stack of free ids, and an owner count per block.
allocator = BlockAllocator(4)
first = allocator.allocate(3)
allocator.share(first[:2])  # a second owner for two of them (a shared prompt prefix)
allocator.free(first)  # the first owner is done: only the unshared block goes back
print(f"after sharing 2 of 3 blocks and freeing the 3: {allocator.num_free} free, owners {allocator.ref_counts}")
assert allocator.num_free == 2
try:
    allocator.allocate(3)
except OutOfBlocks as error:
    print("asking for 3:", error)  # a failed call changes nothing
assert allocator.num_free == 2
