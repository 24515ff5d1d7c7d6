"""The quickstart's offline batch through `LLM`: two prompts and a chat greedily, then one
prompt sampled three times from a seed, on the embedded SmolLM2-135M-Instruct.

Run it from the repository root: python docs/examples/offline_llm.py
"""

from tinyvllm import LLM, SamplingParams

llm = LLM()  # the embedded SmolLM2; or LLM("path/to/model", mode="static", max_model_len=4096, ...)
params = SamplingParams(temperature=0, max_tokens=16)  # greedy; or temperature=0.7, top_p=0.9
prompts = ["The capital of France is", "def fibonacci(n):"]
outputs = llm.generate(prompts, params)
for output in outputs:  # in prompt order
    completion = output.outputs[0]
    print(completion.finish_reason, repr(completion.text))
assert [output.prompt for output in outputs] == prompts
assert all(output.finished and output.outputs[0].finish_reason in ("stop", "length") for output in outputs)
assert "Paris" in outputs[0].outputs[0].text

replies = llm.chat([{"role": "user", "content": "Write a haiku about the sea."}], params)
print(replies[0].outputs[0].finish_reason, repr(replies[0].outputs[0].text))
assert 0 < len(replies[0].outputs[0].token_ids) <= params.max_tokens

sampling = SamplingParams(n=3, temperature=0.8, seed=7, max_tokens=12)
samples = llm.generate("Once upon a time", sampling)
for completion in samples[0].outputs:  # three completions, index 0, 1, 2; the prompt computed once
    print(completion.index, repr(completion.text))
assert [completion.index for completion in samples[0].outputs] == [0, 1, 2]
assert len({completion.text for completion in samples[0].outputs}) == 3  # each its own seed stream
again = llm.generate("Once upon a time", sampling)  # the same seed repeats exactly
assert [c.text for c in again[0].outputs] == [c.text for c in samples[0].outputs]
