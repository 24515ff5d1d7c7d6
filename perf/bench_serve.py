"""Serving benchmark: concurrent streaming clients against `tinyvllm serve`, like `vllm bench serve`.

    python -m perf.bench_serve [--concurrency 64] [--num-prompts 256] [--input-len 1024]
                               [--output-len 128] [--url URL] [tinyvllm serve flags...]

Without --url it starts `tinyvllm serve` on a free loopback port, passing it every flag it
does not know itself (e.g. `--model DIR --max-num-seqs 256`), and stops it at the end.
`--concurrency` clients each send one streaming /v1/completions request after another
until `--num-prompts` are done: random prompts of `--input-len` common words (about one
token each), `--output-len` tokens with ignore_eos (vLLM's random-dataset lengths by
default). `--warmup` requests run first, untimed, so compilation and CUDA graph capture
stay out of the numbers. The server's /metrics?format=json (preemptions, blocks) is saved with the result.

Reported, as vLLM does: requests/s, output tokens/s and total tokens/s over the timed run;
time to first token (TTFT), time per output token after the first (TPOT, per request) and
inter-token latency (ITL: the gap between streamed chunks; a chunk may carry several tokens
when the client falls behind) as mean, p50 and p99. Results go to perf/results/bench_serve.json.
"""

import argparse
import asyncio
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from perf.latency import summary
from perf.timing import result_header
from tests.server_fixtures import serve

RESULTS = Path(__file__).parent / "results" / "bench_serve.json"
SERVER_STARTUP_TIMEOUT_S = 600
WORDS = (
    "the of and to in is was for on that with as by at from his her it an were are which this be or "
    "has had not but first one their its new after who they have two been also other all time year "
    "would city some world there more many people part when into she most than school during only "
    "over where both state these may then later through about city three team up out game film use"
).split()


@dataclass
class RequestResult:
    ttft_s: float
    latency_s: float
    chunk_gaps_s: list[float]
    prompt_tokens: int
    output_tokens: int


@dataclass
class Benchmark:
    url: str
    model: str
    concurrency: int
    input_len: int
    output_len: int
    temperature: float
    results: list[RequestResult] = field(default_factory=list)

    def prompt(self, rng: random.Random) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(self.input_len))

    async def one(self, client: httpx.AsyncClient, prompt: str, output_len: int) -> RequestResult:
        body = {"model": self.model, "prompt": prompt, "max_tokens": output_len, "temperature": self.temperature,
                "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
        start = time.perf_counter()
        arrivals, usage = [], None
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code != 200:
                raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread()).decode()}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    raise RuntimeError(chunk["error"]["message"])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    arrivals.append(time.perf_counter())
                elif chunk.get("usage"):
                    usage = chunk["usage"]
        end = time.perf_counter()
        return RequestResult(
            ttft_s=(arrivals[0] if arrivals else end) - start,
            latency_s=end - start,
            chunk_gaps_s=[b - a for a, b in zip(arrivals, arrivals[1:])],
            prompt_tokens=usage["prompt_tokens"],
            output_tokens=usage["completion_tokens"],
        )

    async def run(self, num_requests: int, output_len: int, seed: int) -> float:
        """Send `num_requests` over `concurrency` clients; returns the wall time in seconds."""
        rng = random.Random(seed)
        prompts = [self.prompt(rng) for _ in range(num_requests)]
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(base_url=self.url, limits=limits, timeout=None) as client:

            async def client_loop() -> list[RequestResult]:
                done = []
                while prompts:
                    done.append(await self.one(client, prompts.pop(), output_len))
                return done

            start = time.perf_counter()
            per_client = await asyncio.gather(*(client_loop() for _ in range(self.concurrency)))
            elapsed = time.perf_counter() - start
        self.results = [result for results in per_client for result in results]
        return elapsed


def report(bench: Benchmark, elapsed_s: float) -> dict:
    results = bench.results
    output_tokens = sum(r.output_tokens for r in results)
    prompt_tokens = sum(r.prompt_tokens for r in results)
    tpots = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in results if r.output_tokens > 1]
    return {
        "num_requests": len(results),
        "duration_s": elapsed_s,
        "mean_prompt_tokens": prompt_tokens / len(results),
        "mean_output_tokens": output_tokens / len(results),
        "requests_per_s": len(results) / elapsed_s,
        "output_tokens_per_s": output_tokens / elapsed_s,
        "total_tokens_per_s": (prompt_tokens + output_tokens) / elapsed_s,
        "ttft_ms": summary([r.ttft_s for r in results]),
        "tpot_ms": summary(tpots),
        "itl_ms": summary([gap for r in results for gap in r.chunk_gaps_s]),
        "e2e_latency_ms": summary([r.latency_s for r in results]),
    }


def print_table(config: dict, result: dict) -> None:
    print(f"{'model':<28}{config['model']}")
    print(f"{'concurrency / requests':<28}{config['concurrency']} / {result['num_requests']}")
    print(f"{'tokens in / out (mean)':<28}{result['mean_prompt_tokens']:.1f} / {result['mean_output_tokens']:.1f}")
    print(f"{'duration (s)':<28}{result['duration_s']:.2f}")
    print(f"{'requests/s':<28}{result['requests_per_s']:.2f}")
    print(f"{'output tokens/s':<28}{result['output_tokens_per_s']:.1f}")
    print(f"{'total tokens/s':<28}{result['total_tokens_per_s']:.1f}")
    print(f"{'':<28}{'mean':>10}{'p50':>10}{'p99':>10}")
    for name in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_latency_ms"):
        cells = ["-" if value is None else f"{value:.2f}" for value in result[name].values()]
        print(f"{name:<28}" + "".join(f"{cell:>10}" for cell in cells))


async def benchmark(args: argparse.Namespace, url: str) -> tuple[dict, dict]:
    async with httpx.AsyncClient(base_url=url) as client:
        model = (await client.get("/v1/models")).json()["data"][0]["id"]
    bench = Benchmark(url, model, args.concurrency, args.input_len, args.output_len, args.temperature)
    if args.warmup:
        await bench.run(args.warmup, min(args.output_len, 16), seed=args.seed + 1)
    elapsed = await bench.run(args.num_prompts, args.output_len, seed=args.seed)
    async with httpx.AsyncClient(base_url=url) as client:
        server_metrics = (await client.get("/metrics", params={"format": "json"})).json()
    config = {key: getattr(args, key) for key in ("concurrency", "num_prompts", "input_len", "output_len",
                                                   "temperature", "warmup", "seed")}  # fmt: skip
    return {"model": model, **config, "server_metrics": server_metrics}, report(bench, elapsed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server (default: start `tinyvllm serve` with the unknown flags)")
    parser.add_argument("--concurrency", type=int, default=64, help="clients, each with one request in flight")
    parser.add_argument("--num-prompts", type=int, default=256)
    parser.add_argument("--input-len", type=int, default=1024, help="words per prompt (about one token each)")
    parser.add_argument("--output-len", type=int, default=128, help="tokens per answer (ignore_eos)")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--warmup", type=int, default=64, help="untimed requests first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args, server_args = parser.parse_known_args()
    if args.url:
        if server_args:
            parser.error(f"unknown arguments with --url: {server_args}")
        config, result = asyncio.run(benchmark(args, args.url.rstrip("/")))
    else:
        with serve(server_args, startup_timeout_s=SERVER_STARTUP_TIMEOUT_S) as url:
            config, result = asyncio.run(benchmark(args, url))
    config["server_args"] = server_args if not args.url else None
    print_table(config, result)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**result_header(), "config": config, "result": result}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
