"""`tinyvllm chat`: a conversation in the terminal, tokens printed as they are produced.

The whole history is sent through the chat template each turn (the KV cache is not
kept between turns: recomputing a short history costs one prefill). `/reset` forgets the
history, `/exit` (or end of input) leaves.
"""

import sys
from typing import TextIO

from tinyvllm.config import EngineConfig
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.sampling_params import SamplingParams


def stream_reply(engine: LLMEngine, messages: list[dict], params: SamplingParams, out: TextIO) -> str:
    """Generate one assistant turn, writing text to `out` as it becomes final."""
    request_id = engine.add_request(engine.tokenizer.encode_chat(messages), params)
    text = ""
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.request_id == request_id:
                out.write(output.text[len(text) :])
                out.flush()
                text = output.text
    out.write("\n")
    return text


def run_chat(
    model: str | None,
    engine_config: EngineConfig,
    params: SamplingParams,
    system: str | None = None,
    stdin: TextIO = sys.stdin,
    stdout: TextIO = sys.stdout,
) -> None:
    engine = LLMEngine(model, engine_config=engine_config)
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    stdout.write("tinyvllm chat: /reset forgets the conversation, /exit leaves\n")
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line or line.strip() == "/exit":
            return
        text = line.strip()
        if text == "/reset":
            messages = list(start)
            stdout.write("(conversation reset)\n")
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": stream_reply(engine, messages, params, stdout)})
