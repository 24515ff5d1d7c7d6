"""The host cost of admitting requests: `LLMEngine.add_request` for the shared-prefix prompts.

    python -m perf.experiments.admission [--repeats 7]

A request's time to first token starts at its submission, and `perf/bench_prefix.py`'s
shared-prefix workload submits 256 prompts of 2,112 token ids at once, before the first step:
every microsecond of admission is in every request's TTFT. This times those 256 calls alone
(checks, sequence, scheduler queue, detokenizer state; no step runs) on an engine with the
NumPy backend over a tiny random model with Llama 3.2's vocabulary size (the prompt checks
read it), fresh for each repeat; the fastest repeat is reported, with cProfile's top functions
of one more. Results: perf/results/experiments/admission.json.
"""

import argparse
import cProfile
import json
import sys
import tempfile
import time
from pathlib import Path

from perf.bench_prefix import FULL, shared_prefix_workload
from perf.timing import profile_rows
from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.provenance import run_header

RESULTS = Path(__file__).resolve().parents[1] / "results" / "experiments" / "admission.json"
VOCAB = 128_256
NUM_BLOCKS = 40_000  # room for every prompt: admission never waits for blocks


def admit_all(model: Path, workload, profiler: cProfile.Profile | None = None) -> float:
    """Seconds of the workload's add_request calls on a fresh engine (built before the clock starts)."""
    engine = LLMEngine(str(model), backend="numpy", max_model_len=4096, num_blocks=NUM_BLOCKS)
    params = workload.params()
    if profiler is not None:
        profiler.enable()
    start = time.perf_counter()
    for prompt, sampling in zip(workload.prompts, params):
        engine.add_request(prompt, sampling)
    seconds = time.perf_counter() - start
    if profiler is not None:
        profiler.disable()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--profile-top", type=int, default=8)
    args = parser.parse_args()
    workload = shared_prefix_workload(FULL, VOCAB)
    with tempfile.TemporaryDirectory() as folder:
        overrides = {**TINY_OVERRIDES, "vocab_size": VOCAB, "max_position_embeddings": 4096}
        model = make_random_llama_dir(Path(folder), config_overrides=overrides, seed=0)
        seconds = min(admit_all(model, workload) for _ in range(args.repeats))
        profiler = cProfile.Profile()
        admit_all(model, workload, profiler)
    requests = len(workload.prompts)
    rows = profile_rows(profiler, requests, args.profile_top)
    print(f"{requests} requests of {len(workload.prompts[0])} token ids: {seconds * 1e3:.1f} ms, "
          f"{seconds * 1e6 / requests:.0f} us a request (fastest of {args.repeats})")  # fmt: skip
    print(f"\ncProfile (profiler-inflated), per request\n{'function':<62} {'calls':>6} {'own us':>8}")
    for row in rows:
        print(f"{row['function'][:62]:<62} {row['calls_per_step']:>6.1f} {row['own_us_per_step']:>8.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    header = run_header("numpy", " ".join(sys.orig_argv))
    result = {"requests": requests, "prompt_tokens": len(workload.prompts[0]), "ms": seconds * 1e3,
              "us_per_request": seconds * 1e6 / requests, "repeats": args.repeats,
              "profile_per_request": rows}  # fmt: skip
    RESULTS.write_text(json.dumps({**header, **result}, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
