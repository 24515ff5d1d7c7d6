"""Scoring a text through `tinyvllm serve`, as evaluation harnesses do: `echo` with `max_tokens` 0.
The file starts the server itself (the embedded SmolLM2) on a free port, and stops it at the end
(`serve_in_background.py`).

Run it from the repository root: python docs/examples/score_text.py
"""

import math

import httpx
from serve_in_background import running_server

with running_server() as url:
    # --8<-- [start:score]
    text = "The capital of France is Paris."
    body = {"prompt": text, "echo": True, "max_tokens": 0, "logprobs": 1, "temperature": 0}
    choice = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]
    scores = choice["logprobs"]  # one entry per prompt token; the first has no logprob (null)
    logprobs = scores["token_logprobs"][1:]
    print(f"{len(scores['tokens'])} tokens, log-likelihood {sum(logprobs):.2f} nats")
    print(f"perplexity {math.exp(-sum(logprobs) / len(logprobs)):.1f}")
    for token, logprob, top in zip(scores["tokens"][1:], logprobs, scores["top_logprobs"][1:]):
        likeliest = max(top, key=top.get)
        print(f"  {token!r:>10} {logprob:7.2f}   the model's first choice: {likeliest!r}")
    # --8<-- [end:score]
    assert choice["text"] == text and scores["token_logprobs"][0] is None
    counted = httpx.post(f"{url}/tokenize", json={"prompt": text}).json()
    assert counted["tokens"] and len(scores["tokens"]) == counted["count"]  # the same tokens /tokenize gives
    assert all(logprob <= 0 for logprob in logprobs)
