"""The host cost of automatic prefix caching: the real scheduler and block manager, no model.

    python -m perf.experiments.prefix_host [--repeats 5] [--profile-top 15]

On an H200 a prefill-heavy run that shares nothing (64 prompts of 1,024 tokens, one output
token each, a budget of 4,096 tokens a step) ran at ~200k prompt tok/s with the prefix cache
on and ~240k with it off: the cache's Python competes with the kernel launches. This drives
`Scheduler` through the engine's call sequence (`LLMEngine.step`: schedule, `launched`,
then `postprocess` of the step launched before, with a fake sampled token) and times only
those calls, so what it measures is the scheduler's and the allocator's host work:

- unique: 64 requests of 1,024 random token ids (vocabulary 128,256, Llama 3.2's),
  max_tokens 1, block size 16, budget 4,096, blocks for all of them;
- shared: 256 requests of one 2,048-token prefix plus 64 unique tokens each (perf/bench_prefix's
  shared-prefix prompts), to see that hits stay cheap too, at perf/bench_prefix's budget of
  8,192 tokens a step (the engine's default), so that its first step admits 96 requests as the
  benchmark's does; before it, untimed, the same workload with another prefix, whose blocks stay
  cached with no owner, as the benchmark's warm-up leaves them. That first step's host time is
  reported apart (`first_step_us`): the GPU waits for all of it, while the later steps'
  scheduling overlaps the step before on the GPU.

Each runs with the cache on and off, `repeats` times on a fresh scheduler; the fastest run
is reported (host us per step, and the total): on a shared machine the others are slower
by whatever else ran. Then one cache-on run of each under cProfile names the functions
with the most time of their own. Results: perf/results/experiments/prefix_host.json.
"""

import argparse
import cProfile
import json
import statistics
import sys
import time
from array import array
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from perf.timing import profile_rows
from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.block_manager import BlockAllocator, blocks_needed
from tinyvllm.engine.prefix_cache import PrefixCachingAllocator
from tinyvllm.engine.scheduler import Scheduler
from tinyvllm.engine.sequence import new_sequences
from tinyvllm.provenance import run_header
from tinyvllm.sampling_params import SamplingParams

RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "prefix_host.json"
VOCAB = 128_256
BLOCK_SIZE = 16
MAX_MODEL_LEN = 4096


def unique_prompts(rng: np.random.Generator) -> list[list[int]]:
    return [rng.integers(0, VOCAB, 1024).tolist() for _ in range(64)]


def shared_prompts(rng: np.random.Generator) -> list[list[int]]:
    """Each prompt holds int objects of its own, as LLMEngine's check of a token-id prompt
    leaves them: comparing two prompts' ids then compares values, not the same objects."""
    prefix = rng.integers(0, VOCAB, 2048)
    return [np.concatenate([prefix, rng.integers(0, VOCAB, 64)]).tolist() for _ in range(256)]


WORKLOADS = {"unique": (unique_prompts, 4096, False), "shared": (shared_prompts, 8192, True)}
"""(prompts, token budget, whether a warm-up of the same workload with another seed runs first)"""
WARM_UP_SEED = 1


def make_scheduler(prompts: list[list[int]], cache: bool, budget: int, warm_up: Sequence[list[int]] = ()) -> Scheduler:
    """A scheduler with every prompt queued (max_tokens 1) and blocks for all of them at once,
    each with its ids' bytes, as add_request makes them when it checks a token-id prompt; the
    `warm_up` prompts run through it to the end first."""
    num_blocks = sum(blocks_needed(len(prompt), BLOCK_SIZE) for prompt in [*prompts, *warm_up]) + 16
    config = ResolvedEngineConfig(
        block_size=BLOCK_SIZE,
        num_blocks=num_blocks,
        max_num_batched_tokens=budget,
        max_model_len=MAX_MODEL_LEN,
        enable_prefix_caching=cache,
    )
    allocator = (PrefixCachingAllocator if cache else BlockAllocator)(num_blocks)
    scheduler = Scheduler(config, allocator)
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    for index, prompt in enumerate(warm_up):
        scheduler.add(new_sequences(f"warm-up-{index}", array("q", prompt), params))
    run(scheduler)
    for index, prompt in enumerate(prompts):
        scheduler.add(new_sequences(str(index), array("q", prompt), params))  # as add_request
    return scheduler


def run(scheduler: Scheduler) -> list[float]:
    """Step as LLMEngine.step does, a step ahead, until every request is done: the host
    seconds of each step (schedule, launched, postprocess of the step before)."""
    step_seconds = []
    in_flight = None
    while scheduler.has_unfinished() or in_flight is not None:
        start = time.perf_counter()
        batch = scheduler.schedule()
        if batch is not None:
            scheduler.launched(batch)
        previous, in_flight = in_flight, batch
        if previous is not None:
            scheduler.postprocess(previous, np.zeros(previous.num_samples, dtype=np.int64))
        step_seconds.append(time.perf_counter() - start)
    return step_seconds


def measure(prompts: list[list[int]], cache: bool, budget: int, repeats: int, warm_up: list[list[int]]) -> dict:
    """The fastest of `repeats` runs (by total host time), each on a fresh scheduler (warmed up
    on `warm_up`), and the fastest first step of them."""
    runs = []
    for _ in range(repeats):
        scheduler = make_scheduler(prompts, cache, budget, warm_up)
        warm_up_hits = scheduler.prefix_cache_hits
        runs.append(run(scheduler))
        hits = scheduler.prefix_cache_hits - warm_up_hits
    steps = min(runs, key=sum)
    prompt_tokens = sum(map(len, prompts))
    return {
        "steps": len(steps),
        "total_ms": sum(steps) * 1e3,
        "us_per_step": sum(steps) * 1e6 / len(steps),
        "max_step_us": max(steps) * 1e6,
        "first_step_us": min(run[0] for run in runs) * 1e6,
        "median_step_us": statistics.median(steps) * 1e6,
        "host_ns_per_prompt_token": sum(steps) * 1e9 / prompt_tokens,
        "hit_tokens": hits,
    }


def profile(prompts: list[list[int]], budget: int, top: int, warm_up: list[list[int]]) -> list[dict]:
    """cProfile of one cache-on run: the functions with the most time of their own, per step."""
    scheduler = make_scheduler(prompts, cache=True, budget=budget, warm_up=warm_up)
    profiler = cProfile.Profile()
    profiler.enable()
    steps = len(run(scheduler))
    profiler.disable()
    return profile_rows(profiler, steps, top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile-top", type=int, default=15)
    args = parser.parse_args()
    results, profiles = [], {}
    columns = ("steps", "total ms", "us/step", "max step us", "first step us", "ns/token")
    print(f"{'workload':<8} {'cache':<5} " + " ".join(f"{name:>{len(name)}}" for name in columns))
    for name, (make_prompts, budget, warmed_up) in WORKLOADS.items():
        prompts = make_prompts(np.random.default_rng(0))
        warm_up = make_prompts(np.random.default_rng(WARM_UP_SEED)) if warmed_up else []
        for cache in (True, False):
            row = {"workload": name, "prefix_caching": cache, "budget": budget}
            row.update(measure(prompts, cache, budget, args.repeats, warm_up))
            results.append(row)
            print(
                f"{name:<8} {'on' if cache else 'off':<5} {row['steps']:>5} {row['total_ms']:>8.2f} "
                f"{row['us_per_step']:>7.1f} {row['max_step_us']:>11.1f} {row['first_step_us']:>13.1f} "
                f"{row['host_ns_per_prompt_token']:>8.1f}"
            )
        profiles[name] = profile(prompts, budget, args.profile_top, warm_up)
    for name, rows in profiles.items():
        print(f"\ncProfile, {name}, cache on (profiler-inflated), per step")
        print(f"{'function':<62} {'calls':>7} {'own us':>8} {'total us':>9}")
        for row in rows:
            print(
                f"{row['function'][:62]:<62} {row['calls_per_step']:>7.1f} {row['own_us_per_step']:>8.1f} "
                f"{row['total_us_per_step']:>9.1f}"
            )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    header = run_header("numpy", " ".join(sys.orig_argv))  # no GPU: perf.timing's header asks CUDA for one
    RESULTS.write_text(json.dumps({**header, "results": results, "profiles": profiles}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
