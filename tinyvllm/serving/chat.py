"""`tinyvllm chat`: a conversation in the terminal, tokens printed as they are produced.

The whole history is sent through the chat template each turn (the KV cache is not
kept between turns: recomputing a short history costs one prefill). `/reset` forgets the
history, `/exit` (or end of input, Ctrl-D) leaves.

Ctrl-C while a reply streams stops that reply and returns to the prompt with the
conversation kept (the cut reply included, marked as interrupted); Ctrl-C at the prompt
ends the program with exit status 130, as an interrupted command does in a shell.
"""

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import TextIO

from tinyvllm.config import EngineConfig
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.sampling_params import SamplingParams

INTERRUPTED_EXIT_STATUS = 128 + signal.SIGINT
"""What a shell reports for a command that Ctrl-C ended: 130."""
INTERRUPTED_MARK = " [interrupted]"


@contextlib.contextmanager
def sigint_deferred() -> Iterator[None]:
    """Hold a Ctrl-C that arrives inside the block and raise it when the block ends.

    An engine step interrupted half-way could leave a batch launched but not recorded by
    the scheduler; deferring the interrupt to the step's end keeps the engine whole, so
    the cut request can be aborted and the next turn can run. Signal handlers can only be
    set from the main thread; elsewhere the block runs unguarded.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received:
        raise KeyboardInterrupt


def stream_reply(engine: LLMEngine, messages: list[dict], params: SamplingParams, out: TextIO) -> str:
    """Generate one assistant turn, writing text to `out` as it becomes final.

    Ctrl-C aborts the request (freeing its KV blocks) and returns the text so far.
    """
    request_id = engine.add_request(engine.tokenizer.encode_chat(messages), params)
    text = ""
    try:
        while engine.has_unfinished_requests():
            with sigint_deferred():
                outputs = engine.step()
            for output in outputs:
                if output.request_id == request_id:
                    reply = output.outputs[0].text
                    out.write(reply[len(text) :])
                    out.flush()
                    text = reply
    except KeyboardInterrupt:
        engine.abort(request_id)
        out.write(INTERRUPTED_MARK)
    out.write("\n")
    return text


def chat_loop(engine: LLMEngine, params: SamplingParams, system: str | None, stdin: TextIO, stdout: TextIO) -> None:
    """Read a line, answer it, until /exit or end of input; Ctrl-C here propagates."""
    start = [{"role": "system", "content": system}] if system else []
    messages = list(start)
    stdout.write("tinyvllm chat: /reset forgets the conversation, /exit (or Ctrl-D) leaves\n")
    while True:
        stdout.write("> ")
        stdout.flush()
        line = stdin.readline()
        if not line:
            # End of input leaves the cursor after "> "; the shell's prompt belongs on a new line.
            stdout.write("\n")
            return
        text = line.strip()
        if text == "/exit":
            return
        if text == "/reset":
            messages = list(start)
            stdout.write("(conversation reset)\n")
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": stream_reply(engine, messages, params, stdout)})


def run_chat(
    model: str | None,
    engine_config: EngineConfig,
    params: SamplingParams,
    system: str | None = None,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
) -> None:
    """Load the model and converse; Ctrl-C outside a reply exits with status 130, no traceback."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    try:
        engine = LLMEngine(model, engine_config=engine_config)
        chat_loop(engine, params, system, stdin, stdout)
    except KeyboardInterrupt:
        # The terminal echoed "^C" where the cursor was; end that line before the shell prints its prompt.
        stdout.write("\n")
        stdout.flush()
        raise SystemExit(INTERRUPTED_EXIT_STATUS) from None
