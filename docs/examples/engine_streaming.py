"""The quickstart's streaming loop through `LLMEngine`: one request, stepped until it finishes,
each step reporting the request's whole text so far.

Run it from the repository root: python docs/examples/engine_streaming.py
"""

from tinyvllm import LLMEngine, SamplingParams

engine = LLMEngine()
engine.add_request("Once upon a time", SamplingParams(max_tokens=32, temperature=0))
outputs = []
while engine.has_unfinished_requests():
    for output in engine.step():
        print(output.outputs[0].text)  # the whole text so far; output.finished on the last one
        outputs.append(output)

last = outputs[-1].outputs[0]
texts = [output.outputs[0].text for output in outputs]
assert len(outputs) == len(last.token_ids)  # one output a step, each step one token
assert all(later.startswith(earlier) for earlier, later in zip(texts, texts[1:]))  # cumulative, never rewritten
assert [output.finished for output in outputs] == [False] * (len(outputs) - 1) + [True]
assert last.finish_reason in ("stop", "length")
