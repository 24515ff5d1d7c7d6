"""Generate with the real engine on a tiny random Llama (NumPy backend, no GPU): the prompt is
prefilled, in one step or in chunks, then each step decodes one token over the KV cache.

Run it from the repository root: python docs/examples/kv_cache_steps.py
"""

import tempfile
from pathlib import Path

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, SamplingParams

prompt = list(range(10, 30))  # 20 token ids
params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
tokens = {}
with tempfile.TemporaryDirectory() as scratch:
    model = make_random_llama_dir(Path(scratch), tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    for budget in (64, 8):  # the step's token budget: the whole prompt in one step, or chunks of 8
        engine = LLM(model, backend="numpy", block_size=4, num_blocks=32, max_num_batched_tokens=budget).engine
        engine.add_request(prompt, params)
        computed = []  # tokens each step computes, read off the scheduled batch
        while (batch := engine.scheduler.schedule()) is not None:
            computed.append(int(batch.num_scheduled_tokens.sum()))
            seq = batch.seqs[0]
            launched = engine.runner.launch(batch)  # step inputs, the forward and the sampler, queued
            engine.scheduler.launched(batch)
            engine.scheduler.postprocess(batch, engine.runner.collect(launched))
        tokens[budget] = seq.completion_token_ids
        print(f"budget {budget:2}: tokens computed per step {computed}; generated {tokens[budget]}")
# After the prefill every step computes one token: its K and V join the cache, the rest is read.
assert tokens[64] == tokens[8] and len(tokens[8]) == 6  # chunking changes the steps, not the tokens
