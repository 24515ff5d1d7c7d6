"""A `tinyvllm serve` subprocess on a free loopback port, for the server tests and perf/bench_serve.py.

`serve(args)` starts the server (the repository's tinyvllm, whatever is installed), waits for
/health and yields its base URL; it stops the process on exit, and a server that dies while
starting fails with its log. `tiny_model_dir` is a random 0.1 M-parameter Llama with the
byte tokenizer and a context of 8192: its LM head is untied, so sampled and greedy outputs
vary (a tied head makes a random model repeat its last token).
"""

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir

REPO_ROOT = Path(__file__).resolve().parents[1]
LOOPBACK = "127.0.0.1"
TINY_MODEL_OVERRIDES = {**TINY_OVERRIDES, "max_position_embeddings": 8192}
STARTUP_TIMEOUT_S = 180
STOP_TIMEOUT_S = 15


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_random_llama_dir(
        tmp_path_factory.mktemp("tiny-llama"), config_overrides=TINY_MODEL_OVERRIDES, tokenizer="bytes", seed=0
    )


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def serve(args: list[str], startup_timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[str]:
    """Run `tinyvllm serve ARGS --host 127.0.0.1 --port <free>`; yield "http://127.0.0.1:<port>"."""
    with serve_process(args, startup_timeout_s) as (url, _):
        yield url


@contextlib.contextmanager
def serve_process(
    args: list[str], startup_timeout_s: float = STARTUP_TIMEOUT_S
) -> Iterator[tuple[str, subprocess.Popen]]:
    """`serve`, yielding the process too (its output goes to `process.log`, a temporary file)."""
    port = free_port()
    command = [sys.executable, "-c", "import sys; from tinyvllm.cli import main; main(sys.argv[1:])",
               "serve", *args, "--host", LOOPBACK, "--port", str(port)]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    url = f"http://{LOOPBACK}:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        process.log = log
        try:
            _wait_until_healthy(url, process, log, startup_timeout_s)
            yield url, process
        finally:
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _wait_until_healthy(url: str, process: subprocess.Popen, log, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"the server exited with {process.returncode}:\n{log.read().decode(errors='replace')}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise TimeoutError(f"the server at {url} was not healthy after {timeout_s} s")
