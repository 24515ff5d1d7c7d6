"""Where a decode step's time goes: GPU time per operator, graph replay, host overhead.

    python -m perf.profile_step [--model llama-1b] [--batches 1 64 256] [--context 512]
                                [--shared-prefix N [--no-cascade]]

For each batch size B the engine admits B requests of `context` random prompt tokens (as
`LLM.generate` does: outputs reported when finished) and runs their prefills; from then
on every step is a decode step of B sequences. Then:

- per operator: one decode step run eagerly with a CUDA event before and after every
  backend call. A hold kernel (perf/timing.py) first keeps the GPU busy long enough for
  all of the step's launches to queue behind it, so the events time the kernels back to
  back, as a graph runs them, not the Python launch overhead between them. The L2 is
  warm, as it is inside a real step.
- graph: the captured decode graph of B's bucket, replayed behind a hold kernel (median).
- host overhead: the wall time of `LLMEngine.step()` minus the graph's GPU time, i.e.
  the gap between steps, while the GPU waits for the host. The engine runs a step ahead
  (it launches step n before it waits for step n-1), so the host's work for a step
  (schedule, metadata, upload, postprocess, detokenize) is hidden behind the GPU's work
  for the step before, as far as it fits. Issue bar: <= 300 us at batch 256. Then a
  cProfile of the same steps names the host functions that take the time.

With `--shared-prefix N` every prompt starts with the same N tokens, which the prefix cache
hands every request as the same blocks, and decode reads them once for all sequences where
the variant table chooses cascade attention (the engine's default); `--no-cascade` has each
sequence read them itself (`disable_cascade_attn=True`). Results: perf/results/profile_step.json.
"""

import argparse
import cProfile
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from numba import cuda

from perf.models import model_dir
from perf.timing import hold, profile_rows, result_header
from tinyvllm.backends.sampler_options import PLAIN_SAMPLER
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.sampling_params import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "profile_step.json"
OPERATORS = frozenset(
    {
        "embedding",
        "gather_rows",
        "rmsnorm",
        "linear",
        "linear_rope_write_kv",
        "linear_silu_mul",
        "prefill_attention",
        "decode_attention",
        "sample",
    }
)
HOLD_US = 100_000
REPEATS = 20


class TimedBackend:
    """The backend, with every operator call between two CUDA events."""

    def __init__(self, backend):
        self._backend = backend
        self.records: list[tuple[str, object, object]] = []

    def __getattr__(self, name: str):
        attribute = getattr(self._backend, name)
        if name not in OPERATORS:
            return attribute

        def timed(*args, **kwargs):
            start, end = cuda.event(), cuda.event()
            start.record(self._backend.stream)
            attribute(*args, **kwargs)
            end.record(self._backend.stream)
            self.records.append((_label(name, args), start, end))

        return timed


def _label(name: str, args: tuple) -> str:
    if name in ("linear", "linear_silu_mul", "linear_rope_write_kv"):
        n, k = args[1].shape
        return f"{name} {k}->{n}"
    return name


def operator_times(engine: LLMEngine) -> tuple[dict, list]:
    """Per-operator GPU microseconds of one engine step run eagerly (graphs set aside)."""
    runner = engine.runner
    graphs, runner.graphs = runner.graphs, None
    timed = TimedBackend(runner.backend)
    runner.model.backend = runner.backend = timed
    hold(timed.stream, HOLD_US)
    engine.step()
    runner.model.backend = runner.backend = timed._backend
    runner.graphs = graphs
    cuda.synchronize()
    totals = defaultdict(lambda: [0, 0.0])
    for label, start, end in timed.records:
        totals[label][0] += 1
        totals[label][1] += start.elapsed_time(end) * 1e3
    span_us = timed.records[0][1].elapsed_time(timed.records[-1][2]) * 1e3
    return {"span_us": span_us}, [
        {"operator": label, "calls": calls, "total_us": total, "us_per_call": total / calls}
        for label, (calls, total) in sorted(totals.items(), key=lambda item: -item[1][1])
    ]


def graph_us(engine: LLMEngine, batch_size: int, shared: bool) -> float:
    """Median GPU time of the decode graph replay for batch_size (its bucket), reading a
    shared prefix once (cascade attention) or not."""
    graphs, backend = engine.runner.graphs, engine.runner.backend
    bucket = next(size for size in graphs.buckets if size >= batch_size)
    times = []
    for _ in range(REPEATS):
        hold(backend.stream, HOLD_US)
        start, end = cuda.event(), cuda.event()
        start.record(backend.stream)
        backend.launch_graph(graphs.graphs[bucket, PLAIN_SAMPLER, shared])
        end.record(backend.stream)
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def step_wall_us(engine: LLMEngine) -> float:
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        engine.step()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def host_functions(engine: LLMEngine, top: int = 15, steps: int = REPEATS) -> list[dict]:
    """cProfile of `steps` engine steps: the functions with the most time of their own."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        engine.step()
    profiler.disable()
    return profile_rows(profiler, steps, top)


def print_host_functions(rows: list[dict]) -> None:
    print(f"{'host function (cProfile, per step)':<58} {'calls':>7} {'own us':>8} {'total us':>9}")
    for row in rows:
        print(
            f"{row['function'][:58]:<58} {row['calls_per_step']:>7.1f} {row['own_us_per_step']:>8.1f} "
            f"{row['total_us_per_step']:>9.1f}"
        )


def run_prefills(engine: LLMEngine) -> None:
    """Step until every admitted request has its prompt computed: each next step decodes them all."""
    scheduler = engine.scheduler
    while scheduler.waiting or any(seq.num_computed_tokens < seq.num_tokens - 1 for seq in scheduler.running):
        engine.step()


def profile_batch(engine: LLMEngine, batch_size: int, context: int, shared_prefix: int, rng) -> dict:
    params = SamplingParams(temperature=0.0, max_tokens=5 * REPEATS + 8, ignore_eos=True)
    vocab = engine.config.vocab_size
    prefix = rng.integers(0, vocab, shared_prefix).tolist()
    prompts = [prefix + rng.integers(0, vocab, context - shared_prefix).tolist() for _ in range(batch_size)]
    ids = [engine.add_request(prompt, params, final_only=True) for prompt in prompts]
    run_prefills(engine)
    summary, operators = operator_times(engine)
    engine.step()  # a step through the graphs, so that the one this step shape uses is captured
    shared = any(key[2] for key in engine.runner.graphs.graphs)
    graph = graph_us(engine, batch_size, shared)
    wall = step_wall_us(engine)
    host = host_functions(engine)
    for request_id in ids:
        engine.abort(request_id)
    return {
        "batch": batch_size,
        "context": context,
        "shared_prefix": shared_prefix,
        "cascade": shared,
        "eager_span_us": summary["span_us"],
        "graph_us": graph,
        "step_wall_us": wall,
        "host_overhead_us": wall - graph,
        "operators": operators,
        "host_functions": host,
    }


def print_operators(operators: list[dict]) -> None:
    kernel_total = sum(op["total_us"] for op in operators)
    print(f"{'operator':<24} {'calls':>5} {'total us':>9} {'us/call':>8} {'share':>6}")
    for op in operators:
        print(
            f"{op['operator']:<24} {op['calls']:>5} {op['total_us']:>9.1f} {op['us_per_call']:>8.2f} "
            f"{op['total_us'] / kernel_total:>6.1%}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64, 256])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--num-blocks", type=int, default=20000)
    parser.add_argument("--shared-prefix", type=int, default=0, help="tokens every prompt starts with")
    parser.add_argument("--no-cascade", action="store_true", help="decode reads a shared prefix once per sequence")
    args = parser.parse_args()

    if not 0 <= args.shared_prefix < args.context:
        parser.error(f"--shared-prefix must be 0 to --context - 1 ({args.context - 1}), got {args.shared_prefix}")
    engine = LLMEngine(
        model_dir(args.model),
        max_model_len=max(2048, args.context + 5 * REPEATS + 8),
        num_blocks=args.num_blocks,
        disable_cascade_attn=args.no_cascade,
    )
    rng = np.random.default_rng(0)
    runs = [profile_batch(engine, batch, args.context, args.shared_prefix, rng) for batch in args.batches]
    for run in runs:
        print(
            f"\nbatch {run['batch']} context {run['context']} (shared {run['shared_prefix']}, cascade "
            f"{run['cascade']}): graph {run['graph_us']:.0f} us, eager kernels "
            f"{run['eager_span_us']:.0f} us, engine step {run['step_wall_us']:.0f} us, host overhead "
            f"{run['host_overhead_us']:.0f} us"
        )
        print_operators(run["operators"])
        print_host_functions(run["host_functions"])
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result_header() | {"model": args.model, "runs": runs}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
