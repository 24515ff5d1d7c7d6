"""Run four requests on a tiny random Llama twice: with room for all of them, and with a KV
arena so small that sequences are preempted and recomputed. The tokens are the same.

Run it from the repository root: python docs/examples/preemption.py
The NumPy backend runs the model (no GPU); sampling is seeded, not greedy, so the match also
shows that a recomputed sequence draws the noise it would have drawn.
"""

import tempfile
from pathlib import Path

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, SamplingParams

prompts = [list(range(start, start + 10)) for start in (10, 40, 70, 100)]
params = [SamplingParams(temperature=0.8, seed=seed, max_tokens=12, ignore_eos=True) for seed in range(4)]
results = {}
with tempfile.TemporaryDirectory() as scratch:
    model = make_random_llama_dir(Path(scratch), tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    for num_blocks in (64, 8):  # 8 blocks of 4 tokens: 32 tokens for four sequences of up to 22
        llm = LLM(model, backend="numpy", block_size=4, num_blocks=num_blocks, enable_prefix_caching=False)
        outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        results[num_blocks] = [output.outputs[0].token_ids for output in outputs]
        preemptions = llm.engine.scheduler.num_preemptions
        print(f"{num_blocks:2} blocks: {preemptions} preemptions; first request's tokens {results[num_blocks][0]}")
        assert (preemptions > 0) == (num_blocks == 8)
assert results[64] == results[8]
print("the same tokens with and without preemption")
