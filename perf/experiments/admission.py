"""The host cost of admitting requests: `LLMEngine.add_request` for the shared-prefix prompts.

    python -m perf.experiments.admission [--repeats 7]

A request's time to first token starts at its submission, and `perf/bench_prefix.py`'s
shared-prefix workload submits 256 prompts of 2,112 token ids at once, before the first step:
every microsecond of admission is in every request's TTFT. This times those 256 calls alone
(checks, sequence, scheduler queue, detokenizer state; no step runs) on an engine with the
NumPy backend over a tiny random model with Llama 3.2's vocabulary size (the prompt checks
read it), fresh for each repeat, with prompts made just before it as the benchmark makes
them; the fastest repeat is reported, then every repeat with the garbage collector's part of it
(a collection of the older young generation visits every id of the young prompt lists, the
workload's own since the sequences hold theirs in arrays, and costs a repeat milliseconds where
it falls), and cProfile's top functions of one more.
Results: perf/results/experiments/admission.json.
"""

import argparse
import cProfile
import json
import sys
import tempfile
import time
from pathlib import Path

from perf.bench_prefix import FULL, shared_prefix_workload
from perf.latency import CollectorTime
from perf.timing import profile_rows
from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.provenance import run_header

RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "admission.json"
VOCAB = 128_256
NUM_BLOCKS = 40_000  # room for every prompt: admission never waits for blocks


def admit_all(model: Path, seed: int, profiler: cProfile.Profile | None = None) -> tuple[float, dict]:
    """Seconds of the add_request calls of the workload of `seed` (its prompts made just before,
    as the benchmark makes them) on a fresh engine (built before the clock starts), and the
    garbage collector's part of them (`CollectorTime`)."""
    engine = LLMEngine(str(model), backend="numpy", max_model_len=4096, num_blocks=NUM_BLOCKS)
    workload = shared_prefix_workload(FULL, VOCAB, seed=seed)
    params = workload.params()
    if profiler is not None:
        profiler.enable()
    start = time.perf_counter()
    with CollectorTime() as collector:
        for prompt, sampling in zip(workload.prompts, params):
            engine.add_request(prompt, sampling)
    seconds = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
    return seconds, collector.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile-top", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        overrides = {**TINY_OVERRIDES, "vocab_size": VOCAB, "max_position_embeddings": 4096}
        model = make_random_llama_dir(Path(folder), config_overrides=overrides, seed=0)
        repeats = [admit_all(model, seed) for seed in range(args.repeats)]
        profiler = cProfile.Profile()
        admit_all(model, args.repeats, profiler)
    seconds = min(took for took, _ in repeats)
    requests, prompt_tokens = FULL.shared_requests, FULL.prefix_len + FULL.suffix_len
    rows = profile_rows(profiler, requests, args.profile_top)
    print(f"{requests} requests of {prompt_tokens} token ids: {seconds * 1e3:.1f} ms, "
          f"{seconds * 1e6 / requests:.0f} us a request (fastest of {args.repeats})")  # fmt: skip
    print("each repeat, ms (of it the garbage collector's, and its collections by generation): "
          + ", ".join(f"{took * 1e3:.1f} ({gc['ms']:.1f}, {gc['collections']})" for took, gc in repeats))  # fmt: skip
    print(f"\ncProfile (profiler-inflated), per request\n{'function':<62} {'calls':>6} {'own us':>8}")
    for row in rows:
        print(f"{row['function'][:62]:<62} {row['calls_per_step']:>6.1f} {row['own_us_per_step']:>8.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    header = run_header("numpy", " ".join(sys.orig_argv))
    result = {"requests": requests, "prompt_tokens": prompt_tokens, "ms": seconds * 1e3,
              "us_per_request": seconds * 1e6 / requests, "repeats": args.repeats,
              "repeat_ms": [took * 1e3 for took, _ in repeats], "repeat_gc": [gc for _, gc in repeats],
              "profile_per_request": rows}  # fmt: skip
    RESULTS.write_text(json.dumps({**header, **result}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
