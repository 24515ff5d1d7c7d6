"""What the server does with a request body before the engine sees it, and why a streamed
reply holds back a tail: the server's own parser and hold-back rule, with no server running.

Run it from the repository root: python docs/examples/serving_request.py
"""

import tempfile
from pathlib import Path

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm.engine.detokenizer import partial_stop_length
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.sampling_params import SamplingParams
from tinyvllm.serving.errors import OpenAIError
from tinyvllm.serving.protocol import parse_completion

with tempfile.TemporaryDirectory() as scratch:
    tokenizer = Tokenizer.from_dir(make_random_llama_dir(Path(scratch), tokenizer="bytes",
                                                         config_overrides=TINY_OVERRIDES))  # fmt: skip
defaults = SamplingParams(temperature=0.6, top_p=0.9)  # as if from generation_config.json
body = {"model": "tiny", "prompt": "Once upon a time", "max_tokens": 20, "stop": ["THE END"], "stream": True}
request = parse_completion(body, defaults, max_tokens_limit=100, tokenizer=tokenizer, max_model_len=64)
params = request.params
print(f"prompt {request.prompt!r}, stream {request.stream}")
print(f"temperature {params.temperature}, top_p {params.top_p} (the model's defaults), max_tokens {params.max_tokens}")
assert (params.temperature, params.top_p, params.max_tokens) == (0.6, 0.9, 20)

for bad in ({**body, "suffix": "!"}, {**body, "max_tokens": 60}):  # an unsupported field; past the context
    try:
        parse_completion(bad, defaults, max_tokens_limit=100, tokenizer=tokenizer, max_model_len=64)
    except OpenAIError as error:
        print(f"{error.status}: {error.body()['error']['message']}")

# Streaming: text that could still become "THE END" is held back until the next tokens tell.
for text in ("and they lived", "and they lived happily. THE", "and they lived happily. THE E"):
    held = partial_stop_length(text, ["THE END"])
    print(f"{text!r}: send {text[: len(text) - held]!r}, hold back {text[len(text) - held :]!r}")
assert partial_stop_length("happily. THE E", ["THE END"]) == 5
