"""The server's Prometheus /metrics, API key and logs, in process (Starlette's TestClient), and
the API key from VLLM_API_KEY through `tinyvllm serve`.

The oracle for /metrics (parsed by prometheus_client) is the engine's own state
(AsyncEngine.stats()) and the usage the responses report; the logs are read with caplog
from the `tinyvllm.serving` logger.
"""

import json
import logging
import re

import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from tests.server_fixtures import serve, tiny_model_dir  # noqa: F401
from tinyvllm.engine.async_engine import AsyncEngine
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.serving.server import OpenAIServer, ServerConfig

MODEL_NAME = "tiny-test"
API_KEY = "sk-test-key"
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds")


@pytest.fixture(scope="module")
def engine(tiny_model_dir):  # noqa: F811
    return LLMEngine(tiny_model_dir, backend="numpy", num_blocks=64, max_model_len=256)


def make_client(engine: LLMEngine, **config) -> TestClient:
    server = OpenAIServer(
        AsyncEngine(engine), ServerConfig(served_model_name=MODEL_NAME, max_tokens_limit=32, **config)
    )
    return TestClient(server.app())


def scrape(client: TestClient) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels without model_name) -> value, parsed by prometheus_client;
    every sample carries this server's model_name."""
    samples = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        for sample in family.samples:
            labels = dict(sample.labels)
            assert labels.pop("model_name") == MODEL_NAME, sample
            samples[sample.name, tuple(sorted(labels.items()))] = sample.value
    return samples


def test_metrics_count_what_a_workload_did(engine):
    """Three greedy completions of 5 tokens and one streamed chat with n=2 of 4 tokens each:
    the token counters equal the usage the responses report, each histogram has one sample
    a request (the inter-token one, one a token after a completion's first: max_tokens - 1 a
    completion),
    and the gauges read the engine's snapshot."""
    with make_client(engine, stats_interval_s=None) as client:
        body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
        usages = [client.post("/v1/completions", json=body).json()["usage"] for _ in range(3)]
        chat = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "n": 2,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        events = client.post("/v1/chat/completions", json=chat).text.split("\n\n")
        usages.append(json.loads(events[-3].removeprefix("data: "))["usage"])
        response = client.get("/metrics")
        assert response.headers["content-type"].startswith("text/plain; version=")
        samples = scrape(client)
        stats = client.get("/metrics", params={"format": "json"}).json()
    assert usages[-1]["completion_tokens"] == 8
    prompt_tokens = sum(u["prompt_tokens"] for u in usages)
    assert samples["tinyvllm:prompt_tokens_total", ()] == prompt_tokens
    assert samples["tinyvllm:generation_tokens_total", ()] == sum(u["completion_tokens"] for u in usages) == 23
    assert samples["tinyvllm:request_success_total", (("finished_reason", "length"),)] == 3 + 2
    for name in HISTOGRAMS:
        count = 3 * 4 + 2 * 3 if name == "inter_token_latency_seconds" else 4
        assert samples[f"tinyvllm:{name}_count", ()] == count, name
        assert samples[f"tinyvllm:{name}_bucket", (("le", "+Inf"),)] == count, name
        assert samples[f"tinyvllm:{name}_sum", ()] > 0, name
    assert samples["tinyvllm:num_requests_running", ()] == stats["num_requests_running"] == 0
    assert samples["tinyvllm:num_requests_waiting", ()] == stats["num_requests_waiting"] == 0
    used = stats["num_total_blocks"] - stats["num_free_blocks"]
    assert samples["tinyvllm:kv_cache_usage_perc", ()] == pytest.approx(used / stats["num_total_blocks"])
    assert samples["tinyvllm:num_preemptions_total", ()] == stats["num_preemptions"] == 0
    # each completion's prompt is looked up once at admission (nothing was preempted): the chat's twice
    assert samples["tinyvllm:prefix_cache_queries_total", ()] == prompt_tokens + usages[-1]["prompt_tokens"]
    assert samples["tinyvllm:prefix_cache_hits_total", ()] == stats["prefix_cache_hits"]
    assert samples["tinyvllm:num_requests_aborted_total", ()] == stats["num_requests_aborted"] == 0
    assert samples["tinyvllm:num_requests_rejected_total", ()] == stats["num_requests_rejected"] == 0


def test_each_server_has_its_own_registry(engine):
    """Two servers in one process: a second starts from zero, and nothing lands in the global registry."""
    with make_client(engine, stats_interval_s=None) as first, make_client(engine, stats_interval_s=None) as second:
        body = {"model": MODEL_NAME, "prompt": "Hello", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
        first.post("/v1/completions", json=body)
        first.post("/v1/completions", json={**body, "temperature": -1})
        assert scrape(first)["tinyvllm:generation_tokens_total", ()] == 3
        assert scrape(first)["tinyvllm:num_requests_rejected_total", ()] == 0  # a bad field never reaches the engine
        assert scrape(second)["tinyvllm:generation_tokens_total", ()] == 0
    assert not [name for name in REGISTRY._names_to_collectors if name.startswith("tinyvllm:")]


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
        assert "tinyvllm:num_requests_running" in httpx.get(f"{url}/metrics").text
