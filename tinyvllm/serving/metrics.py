"""The server's Prometheus metrics (`GET /metrics`), written by hand in the text exposition format.

The names are vLLM's, so dashboards and alerts built for `vllm serve` read tinyvllm unchanged:
gauges of the scheduler (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
`vllm:kv_cache_usage_perc`), counters of tokens, preemptions, prefix-cache queries and hits
(`vllm:prefix_cache_queries_total`, `vllm:prefix_cache_hits_total`, in tokens) and finished requests
(`vllm:prompt_tokens_total`, `vllm:generation_tokens_total`, `vllm:num_preemptions_total`,
`vllm:request_success_total` by finish reason), and histograms of time to first token and
end-to-end latency. Every sample carries the `model_name` label, as vLLM's do.

Gauges and the preemption count come from the engine thread's published stats; token counts
and latencies are observed here, as each request's outputs pass through the server.
"""

import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from tinyvllm.engine.sequence import RequestOutput

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram of seconds, as Prometheus exposes one."""

    buckets: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * len(self.buckets)

    def observe(self, value: float) -> None:
        for index, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[index] += 1
        self.total += value
        self.count += 1

    def lines(self, name: str, labels: str) -> list[str]:
        rows = [f'{name}_bucket{{{labels},le="{bound}"}} {n}' for bound, n in zip(self.buckets, self.counts)]
        rows.append(f'{name}_bucket{{{labels},le="+Inf"}} {self.count}')
        return [*rows, f"{name}_sum{{{labels}}} {self.total}", f"{name}_count{{{labels}}} {self.count}"]


@dataclass
class RequestRecord:
    """One HTTP request's measurements: its start, and for a generation its first token's latency
    and its token counts so far."""

    start: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None
    prompt_tokens: int | None = None
    generation_tokens: int | None = None


class ServerMetrics:
    """Token counters and latency histograms, updated on the event loop as outputs arrive."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished = Counter()  # finish reason -> requests
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.e2e = Histogram(E2E_BUCKETS_S)

    async def track(self, outputs: AsyncIterator[RequestOutput], record: RequestRecord) -> AsyncIterator[RequestOutput]:
        """Pass `outputs` through, observing the first token's latency and, at the end, the counts."""
        async for output in outputs:
            generated = sum(len(completion.token_ids) for completion in output.outputs)
            if generated and record.first_token_s is None:
                record.first_token_s = time.perf_counter() - record.start
                self.ttft.observe(record.first_token_s)
            record.prompt_tokens = len(output.prompt_token_ids)
            record.generation_tokens = generated
            if output.finished:
                self.prompt_tokens += record.prompt_tokens
                self.generation_tokens += record.generation_tokens
                self.finished.update(completion.finish_reason for completion in output.outputs)
                self.e2e.observe(time.perf_counter() - record.start)
            yield output

    def render(self, stats: dict, model_name: str) -> str:
        """The exposition text: `stats` is AsyncEngine.stats(), the engine thread's last snapshot."""
        labels = f'model_name="{_escape(model_name)}"'
        out: list[str] = []

        def metric(name: str, kind: str, help_text: str, rows: list[str]) -> None:
            out.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *rows])

        def one(name: str, kind: str, help_text: str, value: float) -> None:
            metric(name, kind, help_text, [f"{name}{{{labels}}} {value}"])

        one("vllm:num_requests_running", "gauge", "Requests in the running batch.", stats["num_requests_running"])
        one("vllm:num_requests_waiting", "gauge", "Requests waiting to be scheduled.", stats["num_requests_waiting"])
        one("vllm:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 is full).",
            kv_cache_usage(stats))  # fmt: skip
        one("vllm:num_preemptions_total", "counter", "Preemptions since start.", stats["num_preemptions"])
        one("vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
            stats["prefix_cache_queries"])  # fmt: skip
        one("vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.",
            stats["prefix_cache_hits"])  # fmt: skip
        one("vllm:prompt_tokens_total", "counter", "Prompt tokens of finished requests.", self.prompt_tokens)
        one("vllm:generation_tokens_total", "counter", "Generated tokens of finished requests.", self.generation_tokens)
        success = [
            f'vllm:request_success_total{{{labels},finished_reason="{reason}"}} {n}'
            for reason, n in sorted(self.finished.items())
        ]
        help_text = "Finished requests by finish reason (a request with n completions counts once for each)."
        metric("vllm:request_success_total", "counter", help_text, success)
        one("tinyvllm:num_requests_aborted_total", "counter", "Requests aborted.", stats["num_requests_aborted"])
        one("tinyvllm:num_requests_rejected_total", "counter", "Requests refused.", stats["num_requests_rejected"])
        ttft = self.ttft.lines("vllm:time_to_first_token_seconds", labels)
        metric("vllm:time_to_first_token_seconds", "histogram", "Time to first token.", ttft)
        e2e = self.e2e.lines("vllm:e2e_request_latency_seconds", labels)
        metric("vllm:e2e_request_latency_seconds", "histogram", "End-to-end request latency.", e2e)
        return "\n".join(out) + "\n"


def kv_cache_usage(stats: dict) -> float:
    """The fraction of KV-cache blocks in use (1 is full) in AsyncEngine.stats()."""
    total = stats["num_total_blocks"]
    return (total - stats["num_free_blocks"]) / total if total else 0.0


def _escape(value: str) -> str:
    """A label value as the exposition format quotes it."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
