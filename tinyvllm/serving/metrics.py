"""The server's Prometheus metrics (`GET /metrics`), through prometheus_client.

vLLM's metric names under the `tinyvllm:` prefix, so a dashboard built for `vllm serve` reads
tinyvllm once its queries name the prefix: gauges of the scheduler (`tinyvllm:num_requests_running`,
`tinyvllm:num_requests_waiting`, `tinyvllm:kv_cache_usage_perc`), counters of preemptions and of
prefix-cache queries and hits (in tokens), counters of finished requests' tokens
(`tinyvllm:prompt_tokens_total`, `tinyvllm:generation_tokens_total`) and of finished requests by
finish reason (`tinyvllm:request_success_total`), and histograms of time to first token,
inter-token latency and end-to-end latency with vLLM's bucket edges. tinyvllm's own counters of
aborted and refused requests sit beside them. Every sample carries the `model_name` label.

The gauges and the engine's counters are read from the engine thread's published snapshot
(AsyncEngine.stats()) when /metrics is scraped; tokens and latencies are observed here, as each
request's outputs pass through the server. Each server has its own CollectorRegistry, so two
servers in one process keep apart.
"""

import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tinyvllm.engine.async_engine import RequestStream
from tinyvllm.engine.sequence import RequestOutput

CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "tinyvllm:"
# vLLM's bucket edges (vllm/v1/metrics/loggers.py, PrometheusStatLogger)
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
INTER_TOKEN_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                         20.0, 40.0, 80.0)  # fmt: skip
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
                 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ENGINE_GAUGES = {"num_requests_running": "Requests in the running batch.",
                 "num_requests_waiting": "Requests waiting to be scheduled."}  # fmt: skip
"""AsyncEngine.stats() keys exposed as gauges of the same name."""
ENGINE_COUNTERS = {
    "num_preemptions": "Preemptions since start.",
    "prefix_cache_queries": "Prompt tokens looked up in the prefix cache.",
    "prefix_cache_hits": "Prompt tokens found in the prefix cache.",
    "num_requests_aborted": "Requests aborted (their client left).",
    "num_requests_rejected": "Requests refused with an error.",
}
"""AsyncEngine.stats() keys exposed as counters of the same name (with `_total`)."""


@dataclass
class RequestRecord:
    """One HTTP request's measurements: its start, and for a generation its first token's latency
    and its token counts so far."""

    start: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    prompt_tokens: int | None = None
    generation_tokens: int | None = None


class _EngineCollector:
    """The engine thread's snapshot as gauges and counters, read at each scrape."""

    def __init__(self, stats: Callable[[], dict], model_name: str) -> None:
        self.stats = stats
        self.model_name = model_name

    def collect(self) -> Iterator[Metric]:
        stats = self.stats()
        for key, help_text in ENGINE_GAUGES.items():
            yield self._family(GaugeMetricFamily, key, help_text, stats[key])
        yield self._family(GaugeMetricFamily, "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 is full).",
                           kv_cache_usage(stats))  # fmt: skip
        for key, help_text in ENGINE_COUNTERS.items():
            yield self._family(CounterMetricFamily, key, help_text, stats[key])

    def _family(self, kind: type, name: str, help_text: str, value: float) -> Metric:
        family = kind(PREFIX + name, help_text, labels=["model_name"])
        family.add_metric([self.model_name], value)
        return family


class ServerMetrics:
    """The server's registry: token counters and latency histograms updated on the event loop
    as outputs arrive, and the engine's snapshot (`stats`, AsyncEngine.stats) read at scrape time."""

    def __init__(self, model_name: str, stats: Callable[[], dict]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.labels = {"model_name": model_name}
        self.registry.register(_EngineCollector(stats, model_name))

        def counter(name: str, help_text: str) -> Counter:
            return Counter(PREFIX + name, help_text, ["model_name"], registry=self.registry).labels(model_name)

        def histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(PREFIX + name, help_text, ["model_name"], buckets=buckets, registry=self.registry)
            return metric.labels(model_name)

        self._prompt_tokens = counter("prompt_tokens", "Prompt tokens of finished requests.")
        self._generation_tokens = counter("generation_tokens", "Generated tokens of finished requests.")
        success_help = "Finished requests by finish reason (a request with n completions counts once for each)."
        self._success = Counter(PREFIX + "request_success", success_help, ["model_name", "finished_reason"],
                                registry=self.registry)  # fmt: skip
        self._ttft = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS_S)
        inter_token_help = "Time between successive tokens of a completion (the ends of the steps that made them)."
        self._inter_token = histogram("inter_token_latency_seconds", inter_token_help, INTER_TOKEN_BUCKETS_S)
        self._e2e = histogram("e2e_request_latency_seconds", "End-to-end request latency.", E2E_BUCKETS_S)

    @property
    def prompt_tokens(self) -> float:
        return self.registry.get_sample_value(f"{PREFIX}prompt_tokens_total", self.labels)

    @property
    def generation_tokens(self) -> float:
        return self.registry.get_sample_value(f"{PREFIX}generation_tokens_total", self.labels)

    async def track(self, stream: RequestStream, record: RequestRecord) -> AsyncIterator[RequestOutput]:
        """Pass the stream's outputs through, observing its token latencies as they come (from
        the engine thread's step times, `stream.token_times`) and, at the end, its counts."""
        observed: list[int] = []  # by completion: its token times observed so far
        counted = (0, 0)  # this stream's prompt and generation tokens in the record (a batch adds its prompts')
        async for output in stream:
            times = stream.token_times
            observed = observed or [0] * len(times)
            if record.first_token_s is None and any(times):
                record.first_token_s = min(t[0] for t in times if t) - record.start
                self._ttft.observe(record.first_token_s)
            for index, completion_times in enumerate(times):
                for position in range(max(observed[index], 1), len(completion_times)):
                    self._inter_token.observe(completion_times[position] - completion_times[position - 1])
                observed[index] = len(completion_times)
            prompt, generation = len(output.prompt_token_ids), sum(len(c.token_ids) for c in output.outputs)
            record.prompt_tokens = (record.prompt_tokens or 0) + prompt - counted[0]
            record.generation_tokens = (record.generation_tokens or 0) + generation - counted[1]
            counted = (prompt, generation)
            if output.finished:
                self._prompt_tokens.inc(prompt)
                self._generation_tokens.inc(generation)
                for completion in output.outputs:
                    self._success.labels(self.labels["model_name"], completion.finish_reason).inc()
                self._e2e.observe(time.perf_counter() - record.start)
            yield output

    def render(self) -> bytes:
        """The exposition text of every metric."""
        return generate_latest(self.registry)


def kv_cache_usage(stats: dict) -> float:
    """The fraction of KV-cache blocks in use (1 is full) in AsyncEngine.stats()."""
    total = stats["num_total_blocks"]
    return (total - stats["num_free_blocks"]) / total if total else 0.0
