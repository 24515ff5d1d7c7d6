"""The server's Prometheus /metrics, API key and logs, in process (Starlette's TestClient), and
the API key from VLLM_API_KEY through `tinyvllm serve`.

The oracle for /metrics is the engine's own state (AsyncEngine.stats()) and the usage the
responses report; the logs are read with caplog from the `tinyvllm.serving` logger.
"""

import logging
import re

import httpx
import pytest
from starlette.testclient import TestClient

from tests.server_fixtures import serve, tiny_model_dir  # noqa: F401
from tinyvllm.engine.async_engine import AsyncEngine
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.serving.server import OpenAIServer, ServerConfig

MODEL_NAME = "tiny-test"
API_KEY = "sk-test-key"
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):  # noqa: F811
    return LLMEngine(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=256)


def make_client(engine: LLMEngine, **config) -> TestClient:
    server = OpenAIServer(
        AsyncEngine(engine), ServerConfig(served_model_name=MODEL_NAME, max_tokens_limit=32, **config)
    )
    return TestClient(server.app())


def parse_exposition(text: str) -> dict[tuple[str, str], float]:
    """(name, labels) -> value for every sample; every metric has HELP and TYPE lines first."""
    samples, typed = {}, set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
        elif not line.startswith("# HELP "):
            name, labels, value = SAMPLE.match(line).groups()
            assert re.sub(r"_(bucket|sum|count)$", "", name) in typed or name in typed, line
            samples[name, labels or ""] = float(value)
    return samples


def test_metrics_are_prometheus_text_that_agree_with_the_engine(engine):
    with make_client(engine, stats_interval_s=None) as client:
        body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 5, "temperature": 0}
        usages = [client.post("/v1/completions", json=body).json()["usage"] for _ in range(3)]
        response = client.get("/metrics")
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        samples = parse_exposition(response.text)
        stats = client.get("/metrics", params={"format": "json"}).json()
    label = f'model_name="{MODEL_NAME}"'
    assert samples["vllm:num_requests_running", label] == stats["num_requests_running"] == 0
    assert samples["vllm:num_requests_waiting", label] == stats["num_requests_waiting"] == 0
    used = stats["num_total_blocks"] - stats["num_free_blocks"]
    assert samples["vllm:kv_cache_usage_perc", label] == pytest.approx(used / stats["num_total_blocks"])
    assert samples["vllm:num_preemptions_total", label] == stats["num_preemptions"]
    # each request's prompt is looked up once at admission (nothing was preempted)
    assert samples["vllm:prefix_cache_queries_total", label] == sum(u["prompt_tokens"] for u in usages)
    assert samples["vllm:prefix_cache_hits_total", label] == stats["prefix_cache_hits"]
    assert samples["vllm:prompt_tokens_total", label] == sum(u["prompt_tokens"] for u in usages)
    assert samples["vllm:generation_tokens_total", label] == sum(u["completion_tokens"] for u in usages)
    assert samples["vllm:request_success_total", f'{label},finished_reason="length"'] == 3
    for histogram in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds"):
        assert samples[f"{histogram}_count", label] == 3
        assert samples[f"{histogram}_bucket", f'{label},le="+Inf"'] == 3
        assert samples[f"{histogram}_sum", label] > 0


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {API_KEY}", API_KEY])
def test_v1_routes_need_the_api_key(engine, header):
    headers = {} if header is None else {"Authorization": header}
    with make_client(engine, api_key=API_KEY, stats_interval_s=None) as client:
        for path in ("/v1/models", "/v1/completions"):
            response = client.request("POST" if path == "/v1/completions" else "GET", path, headers=headers, json={})
            assert response.status_code == 401
            assert response.json()["error"]["code"] == "invalid_api_key"
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200
        good = client.get("/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
        assert good.status_code == 200 and good.json()["data"][0]["id"] == MODEL_NAME


def test_each_request_is_logged_with_its_token_counts(engine, caplog):
    caplog.set_level(logging.INFO, logger="tinyvllm.serving")
    with make_client(engine, stats_interval_s=None) as client:
        body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": True}
        client.post("/v1/completions", json=body).read()
        client.get("/health")
    lines = [r.getMessage() for r in caplog.records if r.name == "tinyvllm.serving"]
    assert re.fullmatch(r"POST /v1/completions 200 [\d.]+ ms prompt_tokens=\d+ generation_tokens=4", lines[0])
    assert re.fullmatch(r"GET /health 200 [\d.]+ ms", lines[1])


def test_disabled_request_log_logs_nothing(engine, caplog):
    caplog.set_level(logging.INFO, logger="tinyvllm.serving")
    with make_client(engine, log_requests=False, stats_interval_s=None) as client:
        client.get("/health")
    assert not [r for r in caplog.records if r.name == "tinyvllm.serving"]


def test_periodic_stats_line(engine, caplog):
    caplog.set_level(logging.INFO, logger="tinyvllm.serving")
    with make_client(engine, log_requests=False, stats_interval_s=0.05) as client:
        client.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "Hi", "max_tokens": 3})
        for _ in range(100):
            if any("Avg prompt throughput" in r.getMessage() for r in caplog.records):
                break
            client.get("/health")
    line = next(r.getMessage() for r in caplog.records if "Avg prompt throughput" in r.getMessage())
    assert re.search(r"Running: \d+ reqs, Waiting: \d+ reqs, KV cache usage: [\d.]+%", line)


def test_serve_reads_the_api_key_from_vllm_api_key(tiny_model_dir, monkeypatch):  # noqa: F811
    monkeypatch.setenv("VLLM_API_KEY", API_KEY)
    args = ["--model", str(tiny_model_dir), "--backend", "numpy", "--num-blocks", "64", "--max-model-len", "256",
            "--disable-log-requests", "--disable-log-stats"]  # fmt: skip
    with serve(args) as url:
        assert httpx.get(f"{url}/v1/models").status_code == 401
        assert httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
        assert httpx.get(f"{url}/metrics").text.startswith("# HELP vllm:")
