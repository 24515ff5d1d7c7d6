"""SIGTERM while requests run: `tinyvllm serve` (a subprocess, NumPy backend, the tiny random
model) must exit within EXIT_WITHIN_S with status 0, and each client must get an answer, never
a hang: the plain request a 503, the stream an error event and [DONE] (the server stops the
engine before it waits for the open connections)."""

import json
import signal
import threading
import time

import httpx

from tests.server_fixtures import serve_process, tiny_model_dir  # noqa: F401

EXIT_WITHIN_S = 5
LONG = 8000  # tokens: far more than the server makes before the signal
CLIENT_TIMEOUT_S = 60  # longer than the test waits: a client that hangs fails the test, not its timeout


def test_sigterm_mid_request_exits_cleanly_and_answers_or_closes(tiny_model_dir):  # noqa: F811
    args = ["--model", str(tiny_model_dir), "--backend", "numpy", "--num-blocks", "1024",
            "--max-model-len", "8192", "--disable-log-stats"]  # fmt: skip
    body = {"prompt": "Tell me everything.", "max_tokens": LONG, "ignore_eos": True, "temperature": 0}
    with serve_process(args) as (url, process):
        outcomes: dict[str, object] = {}

        def plain() -> None:
            try:
                outcomes["plain"] = httpx.post(f"{url}/v1/completions", json=body, timeout=CLIENT_TIMEOUT_S)
            except httpx.TransportError as error:  # the server closed the connection
                outcomes["plain"] = error

        def streamed() -> None:
            try:
                with httpx.stream("POST", f"{url}/v1/completions", json={**body, "stream": True},
                                  timeout=CLIENT_TIMEOUT_S) as response:  # fmt: skip
                    outcomes["streamed"] = [line for line in response.iter_lines() if line]
            except httpx.TransportError as error:
                outcomes["streamed"] = error

        clients = [threading.Thread(target=plain), threading.Thread(target=streamed)]
        for client in clients:
            client.start()
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/metrics?format=json").json()["num_requests_running"] < 2:
            assert time.monotonic() < deadline, "the two requests never ran"
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        began = time.monotonic()
        status = process.wait(EXIT_WITHIN_S)
        exited_s = time.monotonic() - began
        for client in clients:
            client.join(EXIT_WITHIN_S)
        process.log.seek(0)
        log = process.log.read().decode(errors="replace")
    assert status == 0, log
    assert exited_s < EXIT_WITHIN_S
    assert not any(client.is_alive() for client in clients), "a client still waits after the server exited"
    assert "Traceback" not in log, log
    # the engine stops first, so both are answered: a 503, and a stream that ends with an error event
    plain, lines = outcomes["plain"], outcomes["streamed"]
    assert isinstance(plain, httpx.Response) and plain.status_code == 503, plain
    assert plain.json()["error"]["message"] == "the server is shutting down"
    assert isinstance(lines, list) and lines[-1] == "data: [DONE]", lines
    assert json.loads(lines[-2].removeprefix("data: "))["error"]["message"] == "the server is shutting down"
