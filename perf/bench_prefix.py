"""Automatic prefix caching (issue 30): three workloads with the cache on and off, in one run.

    python -m perf.bench_prefix [--model llama-1b] [--backend auto] [--quick]

- shared prefix: 256 requests, one 2,048-token prefix plus a unique 64-token suffix each,
  128 output tokens, EOS ignored, all submitted at once: output tok/s, and each request's
  time to first token (TTFT: from the submission until the request first shows up in a
  step's outputs, as a streaming client sees it) as p50 and p99;
- multi-turn chat: 64 conversations of 8 turns running concurrently; a turn's prompt is the
  conversation so far plus 64 new tokens, 64 output tokens a turn, and turn k + 1 is
  submitted when turn k finishes: total time;
- the nano-vllm workload (tinyvllm.benchmark.nano_vllm_workload; nothing shared), run twice
  with different prompts and counted over both: what the cache costs when it finds nothing.

Each workload reports the prefix-cache hit rate (the scheduler's prefix_cache_hits over
prefix_cache_queries, prompt tokens, over that workload), and the run the issue's bars as
ratios of cache on to off. Both engines take the engine's defaults, cascade attention
allowed among them; the shared prefix runs a third time with the cache on and cascade
attention off (`disable_cascade_attn=True`): what reading the shared prefix once for all
decoding sequences is worth. Each engine runs in a child process of its own (CONFIGURATIONS).
`--quick` runs tiny sizes (with `--model tiny` and the NumPy backend it checks the script on
a CPU). Results: perf/results/bench_prefix.json.
"""

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perf.child import child_json
from perf.latency import CollectorTime, summary
from perf.models import model_dir
from tinyvllm.benchmark import Workload, nano_vllm_workload, throughput
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.hardware import has_cuda_gpu
from tinyvllm.llm import LLM
from tinyvllm.provenance import run_header
from tinyvllm.sampling_params import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "bench_prefix.json"
MAX_MODEL_LEN = 4096


@dataclass(frozen=True)
class Sizes:
    shared_requests: int = 256
    prefix_len: int = 2048
    suffix_len: int = 64
    shared_output_len: int = 128
    conversations: int = 64
    turns: int = 8
    turn_len: int = 64  # new tokens each turn adds to the conversation
    turn_output_len: int = 64
    nano_requests: int = 256
    max_num_batched_tokens: int | None = None  # the engine's default (max_model_len)


FULL = Sizes()
# A step's budget below two prompts, as the full sizes' is, so that most requests join after
# the first one's prefix is computed (requests admitted in one step each compute their own).
QUICK = Sizes(16, 256, 16, 16, 4, 4, 16, 16, 4, max_num_batched_tokens=384)
# The shared prefix warms up on the whole workload with prompts of its own (another prefix), so
# that the timed run's steps (a prefill behind a cached prefix, a prefill beside many decodes)
# have all run once: the first full-size run on an engine is slower than the next ones
# (perf/LOG.md, 2026-12-06).
WARM_UP_SEED = 99
FIRST_STEPS = 12
NANO_SEEDS = (0, 2)  # seed 1 is the warm-up's (tinyvllm.benchmark.nano_vllm_warm_up)


# --8<-- [start:workloads]
def shared_prefix_workload(sizes: Sizes, vocab_size: int, seed: int = 0) -> Workload:
    """`shared_requests` prompts: one random prefix, then a random suffix of each its own."""
    rng = np.random.default_rng(seed)
    prefix = rng.integers(0, vocab_size, sizes.prefix_len).tolist()
    prompts = [prefix + rng.integers(0, vocab_size, sizes.suffix_len).tolist() for _ in range(sizes.shared_requests)]
    return Workload(prompts, [sizes.shared_output_len] * sizes.shared_requests)


@dataclass(frozen=True)
class Conversations:
    """The tokens each turn of each conversation adds; a turn's prompt is the history before it
    (every earlier turn's new tokens and answer) followed by them."""

    new_tokens: list[list[list[int]]]  # [conversation][turn]
    output_len: int

    def prompt(self, history: list[int], conversation: int, turn: int) -> list[int]:
        return history + self.new_tokens[conversation][turn]

    @property
    def output_tokens(self) -> int:
        return sum(len(turns) for turns in self.new_tokens) * self.output_len


def multi_turn_conversations(sizes: Sizes, vocab_size: int, seed: int = 1) -> Conversations:
    rng = np.random.default_rng(seed)
    new_tokens = [
        [rng.integers(0, vocab_size, sizes.turn_len).tolist() for _ in range(sizes.turns)]
        for _ in range(sizes.conversations)
    ]
    return Conversations(new_tokens, sizes.turn_output_len)


# --8<-- [end:workloads]


def output_token_ids(output) -> list[int]:
    """A RequestOutput's completion tokens (the one place this script reads its shape)."""
    return output.outputs[0].token_ids


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)


def check_produced(produced: int, expected: int) -> None:
    if produced != expected:
        raise RuntimeError(f"produced {produced} tokens, expected {expected}")


def run_shared_prefix(engine: LLMEngine, workload: Workload) -> dict:
    """All requests at once, streamed: output tok/s, each request's TTFT, the wall time of
    admitting them all (the `add_request` calls, before the first step) and of the first
    FIRST_STEPS engine steps (where the prefills are), and the garbage collector's part of
    the admission and of the whole run (`CollectorTime`)."""
    start = time.perf_counter()
    with CollectorTime() as run_gc:
        with CollectorTime() as admission_gc:
            for prompt, params in zip(workload.prompts, workload.params()):
                engine.add_request(prompt, params)
        first_token_s: dict[str, float] = {}
        step_ends = [time.perf_counter() - start]
        produced = 0
        while engine.has_unfinished_requests():
            outputs = engine.step()
            now = time.perf_counter() - start
            step_ends.append(now)
            for output in outputs:
                first_token_s.setdefault(output.request_id, now)
                if output.finished:
                    produced += len(output_token_ids(output))
    seconds = time.perf_counter() - start
    check_produced(produced, workload.output_tokens)
    return {
        "requests": len(workload.prompts),
        "output_tokens": produced,
        "seconds": seconds,
        "output_tok_per_s": produced / seconds,
        "ttft_ms": summary(list(first_token_s.values())),
        "admission_ms": 1e3 * step_ends[0],
        "admission_gc": admission_gc.summary(),
        "gc": run_gc.summary(),
        "first_steps_ms": [1e3 * (b - a) for a, b in zip(step_ends, step_ends[1 : FIRST_STEPS + 1])],
    }


def run_conversations(engine: LLMEngine, chats: Conversations) -> dict:
    """Every conversation's first turn at once; each next turn when the one before finishes.
    Also counts the engine steps and the host time spent submitting turns (`add_request`),
    during which the GPU waits when a turn's last step has run."""
    histories = [[] for _ in chats.new_tokens]
    turn_of: dict[str, tuple[int, int]] = {}
    submit_seconds = 0.0

    def submit(conversation: int, turn: int) -> None:
        nonlocal submit_seconds
        began = time.perf_counter()
        histories[conversation] = chats.prompt(histories[conversation], conversation, turn)
        request_id = engine.add_request(histories[conversation], greedy(chats.output_len), final_only=True)
        turn_of[request_id] = (conversation, turn)
        submit_seconds += time.perf_counter() - began

    start = time.perf_counter()
    for conversation in range(len(chats.new_tokens)):
        submit(conversation, 0)
    produced, steps = 0, 0
    while engine.has_unfinished_requests():
        steps += 1
        for output in engine.step():
            if not output.finished:
                continue
            conversation, turn = turn_of.pop(output.request_id)
            answer = output_token_ids(output)
            produced += len(answer)
            histories[conversation] += answer
            if turn + 1 < len(chats.new_tokens[conversation]):
                submit(conversation, turn + 1)
    seconds = time.perf_counter() - start
    check_produced(produced, chats.output_tokens)
    return {"conversations": len(histories), "output_tokens": produced, "seconds": seconds, "steps": steps,
            "submit_seconds": submit_seconds}  # fmt: skip


def nano_vllm_runs(llm: LLM, vocab: int, requests: int) -> dict:
    """The nano-vllm workload twice (seeds NANO_SEEDS: prompts the cache has not seen), as one
    run: tok/s over both. One run's tok/s varies by several percent between engines, about
    the size of the bar's margin; each run's figure is kept too."""
    runs = [throughput(llm, nano_vllm_workload(vocab, requests, seed)) for seed in NANO_SEEDS]
    tokens, seconds = sum(r["output_tokens"] for r in runs), sum(r["seconds"] for r in runs)
    return {"requests": sum(r["requests"] for r in runs), "output_tokens": tokens, "seconds": seconds,
            "output_tok_per_s": tokens / seconds, "runs": runs}  # fmt: skip


def with_hit_rate(engine: LLMEngine, run: Callable[[], dict]) -> dict:
    """run()'s result and the prefix-cache hit rate over it (None with the cache off)."""
    scheduler = engine.scheduler
    queries, hits = scheduler.prefix_cache_queries, scheduler.prefix_cache_hits
    result = run()
    queried = scheduler.prefix_cache_queries - queries
    result["prefix_cache_queries"] = queried
    result["prefix_cache_hit_rate"] = (scheduler.prefix_cache_hits - hits) / queried if queried else None
    return result


CONFIGURATIONS = {
    "cache_on": (True, True, True),
    "cache_off": (False, True, True),
    "cache_on_cascade_off": (True, False, False),
}
"""The run's engines: name -> (prefix caching, cascade attention allowed, every workload or
the shared prefix only). Each runs in a process of its own, one after the other: in one
process the first engine's host work was slower than the later ones', which favoured whichever
configuration came later (perf/LOG.md, 2026-12-07)."""
CASCADE_ONLY = {"cascade_on": (True, True, False), "cascade_off": (True, False, False)}


def run_all(
    directory: Path, backend: str, sizes: Sizes, num_blocks: int | None, caching: bool, cascade: bool, every: bool
) -> dict:
    """One engine's workloads: the shared prefix, and with `every` the chat and nano-vllm too."""
    llm = LLM(directory, backend=backend, max_model_len=MAX_MODEL_LEN, enable_prefix_caching=caching,
              num_blocks=num_blocks, max_num_batched_tokens=sizes.max_num_batched_tokens,
              disable_cascade_attn=not cascade)  # fmt: skip
    engine, vocab = llm.engine, llm.engine.config.vocab_size
    run_shared_prefix(engine, shared_prefix_workload(sizes, vocab, seed=WARM_UP_SEED))
    results = {
        "shared_prefix": with_hit_rate(engine, lambda: run_shared_prefix(engine, shared_prefix_workload(sizes, vocab)))
    }
    if every:
        results["multi_turn"] = with_hit_rate(
            engine, lambda: run_conversations(engine, multi_turn_conversations(sizes, vocab))
        )
        results["nano_vllm"] = with_hit_rate(engine, lambda: nano_vllm_runs(llm, vocab, sizes.nano_requests))
    return results


def run_child(name: str, argv: list[str]) -> dict:
    """Configuration `name`'s results from a child process given this run's arguments (the
    child runs only `name` and writes to the file `--child` names, not to `--out`)."""
    done, result = child_json(lambda out: [sys.executable, "-m", "perf.bench_prefix", *argv, "--child", name, str(out)])
    if result is None:
        raise RuntimeError(f"configuration {name} failed ({done.returncode}): {done.stderr[-3000:]}")
    return result


def bars(on: dict, off: dict) -> dict:
    """The issue's bars: each ratio of cache on to off, its bar and whether it is met."""
    ratios = {
        "shared_prefix_tok_per_s_on_over_off": (
            on["shared_prefix"]["output_tok_per_s"] / off["shared_prefix"]["output_tok_per_s"], 2.5),
        "shared_prefix_ttft_p50_off_over_on": (
            off["shared_prefix"]["ttft_ms"]["p50"] / on["shared_prefix"]["ttft_ms"]["p50"], 10.0),
        "multi_turn_seconds_off_over_on": (off["multi_turn"]["seconds"] / on["multi_turn"]["seconds"], 2.0),
        "nano_vllm_tok_per_s_on_over_off": (
            on["nano_vllm"]["output_tok_per_s"] / off["nano_vllm"]["output_tok_per_s"], 0.98),
    }  # fmt: skip
    return {name: {"ratio": ratio, "bar": bar, "met": ratio >= bar} for name, (ratio, bar) in ratios.items()}


def print_table(results: dict) -> None:
    """The workloads' rows, TTFT's mean beside its p50: with all requests submitted at once the
    median request can sit at a step's edge, where one more request in a step moves it a step."""
    print(f"{'workload':<15}{'cache':>15}{'seconds':>9}{'tok/s':>10}{'TTFT mean':>10}{'p50':>8}{'p99':>8}"
          f"{'hit rate':>10}")  # fmt: skip
    rows = [(workload, cache, results[f"cache_{cache}"][workload])
            for workload in ("shared_prefix", "multi_turn", "nano_vllm") for cache in ("on", "off")]  # fmt: skip
    rows.append(("shared_prefix", "on, no cascade", results["cache_on_cascade_off"]["shared_prefix"]))
    for workload, cache, r in rows:
        tok_s = r.get("output_tok_per_s", r["output_tokens"] / r["seconds"])
        ttft = r.get("ttft_ms", {})
        cells = ["-" if ttft.get(key) is None else f"{ttft[key]:.1f}" for key in ("mean", "p50", "p99")]
        rate = r.get("prefix_cache_hit_rate")
        rate = "-" if rate is None else f"{rate:.1%}"
        print(f"{workload:<15}{cache:>15}{r['seconds']:9.2f}{tok_s:10.1f}{cells[0]:>10}{cells[1]:>8}{cells[2]:>8}"
              f"{rate:>10}")  # fmt: skip
    for name, bar in results["bars"].items():
        print(f"{name:<40}{bar['ratio']:8.2f}x  bar {bar['bar']}x  {'met' if bar['met'] else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b", help="llama-1b, smollm2, tiny, or a directory")
    parser.add_argument("--backend", default="auto", choices=("auto", "cuda", "numpy"))
    parser.add_argument("--quick", action="store_true", help=f"tiny sizes: {QUICK}")
    parser.add_argument("--num-blocks", type=int, help="KV blocks (16 tokens each); default: sized from memory")
    parser.add_argument(
        "--cascade-only", action="store_true", help="only the shared prefix, cache on, cascade attention on and off"
    )
    parser.add_argument("--max-num-batched-tokens", type=int, help="a step's token budget (default: the engine's)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=2, metavar=("NAME", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    backend = args.backend if args.backend != "auto" else ("cuda" if has_cuda_gpu() else "numpy")
    sizes = QUICK if args.quick else FULL
    if args.max_num_batched_tokens is not None:
        sizes = dataclasses.replace(sizes, max_num_batched_tokens=args.max_num_batched_tokens)
    configurations = CASCADE_ONLY if args.cascade_only else CONFIGURATIONS
    if args.child:
        name, out = args.child
        run = run_all(model_dir(args.model), backend, sizes, args.num_blocks, *configurations[name])
        Path(out).write_text(json.dumps(run))
        return
    results = {"model": args.model, "backend": backend, "sizes": dataclasses.asdict(sizes)}
    for name in configurations:
        results[name] = run_child(name, sys.argv[1:])
        if args.cascade_only:
            shared = results[name]["shared_prefix"]
            print(f"{name}: {shared['output_tok_per_s']:.1f} tok/s, TTFT p50 {shared['ttft_ms']['p50']:.1f} ms")
    if not args.cascade_only:
        results["bars"] = bars(results["cache_on"], results["cache_off"])
        print_table(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    header = run_header(backend, " ".join(sys.orig_argv))
    args.out.write_text(json.dumps({**header, **results}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
