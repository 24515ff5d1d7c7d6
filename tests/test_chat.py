"""`tinyvllm chat` on a tiny random model (NumPy backend): Ctrl-C and end of input.

Ctrl-C at the prompt ends the program with status 130 and a newline, no traceback;
Ctrl-C during a reply stops that reply and returns to the prompt with the conversation
kept; end of input (Ctrl-D) leaves with status 0.
"""

import io
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm.config import EngineConfig
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.sampling_params import SamplingParams
from tinyvllm.serving.chat import INTERRUPTED_EXIT_STATUS, INTERRUPTED_MARK, chat_loop, run_chat

REPOSITORY = Path(__file__).resolve().parent.parent
PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(
        make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    )


class InterruptedInput(io.StringIO):
    """A terminal where the user presses Ctrl-C at the prompt."""

    def readline(self, size: int = -1) -> str:
        raise KeyboardInterrupt


def test_ctrl_c_at_the_prompt_exits_130_on_a_new_line(tiny_model):
    stdout = io.StringIO()
    with pytest.raises(SystemExit) as exit_info:
        run_chat(tiny_model, EngineConfig(backend="numpy"), PARAMS, stdin=InterruptedInput(), stdout=stdout)
    assert exit_info.value.code == INTERRUPTED_EXIT_STATUS == 130
    assert stdout.getvalue().endswith("> \n")


def test_end_of_input_leaves_on_a_new_line(tiny_model):
    stdout = io.StringIO()
    run_chat(tiny_model, EngineConfig(backend="numpy"), PARAMS, stdin=io.StringIO(""), stdout=stdout)
    assert stdout.getvalue().endswith("> \n")


def test_ctrl_c_during_a_reply_stops_it_and_keeps_the_conversation(tiny_model, monkeypatch):
    engine = LLMEngine(tiny_model, backend="numpy")
    real_step, real_encode_chat = engine.step, engine.tokenizer.encode_chat
    steps_started, steps_completed = [], []
    sent_conversations = []

    def step_with_ctrl_c_inside():
        # The second step of the first reply gets Ctrl-C half-way: it must still run to its end.
        steps_started.append(len(steps_started))
        if len(steps_started) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        outputs = real_step()
        steps_completed.append(len(outputs))
        return outputs

    def recording_encode_chat(messages):
        sent_conversations.append([dict(message) for message in messages])
        return real_encode_chat(messages)

    monkeypatch.setattr(engine, "step", step_with_ctrl_c_inside)
    monkeypatch.setattr(engine.tokenizer, "encode_chat", recording_encode_chat)
    stdout = io.StringIO()
    chat_loop(engine, PARAMS, None, io.StringIO("hello\nagain\n/exit\n"), stdout)

    assert len(steps_completed) == len(steps_started) > 2, "the interrupted step ran to its end, then the next reply"
    first_turn, second_turn = sent_conversations
    assert [message["role"] for message in second_turn] == ["user", "assistant", "user"]
    assert second_turn[0] == first_turn[0] == {"role": "user", "content": "hello"}
    cut_reply = second_turn[1]["content"]
    printed = stdout.getvalue()
    assert f"{cut_reply}{INTERRUPTED_MARK}\n> " in printed
    assert printed.count(INTERRUPTED_MARK) == 1, "the second reply ran to max_tokens"
    assert not engine.has_unfinished_requests()


def read_until(stream, marker: bytes, timeout_s: float) -> bytes:
    """Bytes from a pipe until `marker` appears (a prompt ends in no newline, so no readline)."""
    seen = b""
    deadline = time.monotonic() + timeout_s
    while marker not in seen:
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"no {marker!r} within {timeout_s} s; got {seen!r}"
        ready, _, _ = select.select([stream], [], [], remaining)
        if ready:
            chunk = os.read(stream.fileno(), 4096)
            assert chunk, f"the chat ended before {marker!r}; got {seen!r}"
            seen += chunk
    return seen


def test_sigint_at_the_prompt_ends_the_program_with_130_and_no_traceback(tiny_model):
    command = [sys.executable, "-c", "from tinyvllm.cli import main; main()", "chat", "--model", tiny_model]
    chat = subprocess.Popen(
        [*command, "--backend", "numpy"],
        cwd=REPOSITORY,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        read_until(chat.stdout, b"> ", timeout_s=120)
        chat.send_signal(signal.SIGINT)
        rest, errors = chat.communicate(timeout=60)
    finally:
        chat.kill()
    assert chat.returncode == 130
    assert rest == b"\n"
    assert b"Traceback" not in errors and b"KeyboardInterrupt" not in errors
