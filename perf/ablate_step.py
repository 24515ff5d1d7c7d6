"""What each operator costs the captured decode graph: the graph timed without it.

    python -m perf.ablate_step [--model llama-1b] [--context 512] [--partitions 1 8 16 32 64]

Eager per-operator times (perf/profile_step.py) overstate the small kernels: inside a graph
with programmatic dependent launch a kernel's start overlaps the one ahead of it. This
script measures each operator's share of the graph itself. One engine decodes one request
of `context` random prompt tokens (batch 1, the graph of bucket 1); then, for each backend
operator in turn, the runner's backend method is replaced by one that does nothing, the
decode graph is captured again, two engine steps restage real inputs, and the replay is
timed as profile_step times it (`graph_us`, median of three). The difference from the
full graph is what the operator costs there. The ablated graphs compute wrong tokens; only
their times are read. The same is done for split-K's merge kernel alone, and with split-K
decode attention forced to each of `--partitions` partition counts.

Results: perf/results/ablate_step.json.
"""

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

from perf.models import model_dir
from perf.profile_step import graph_us, run_prefills
from perf.timing import result_header
from tinyvllm.backends import variants
from tinyvllm.engine.llm_engine import LLMEngine
from tinyvllm.kernels import attention_split
from tinyvllm.sampling_params import SamplingParams

RESULTS = Path(__file__).resolve().parent / "results" / "ablate_step.json"
OPERATORS = ("decode_attention", "linear", "linear_silu_mul", "linear_rope_write_kv", "sample", "gather_rows")
CAPTURES = 3


def _nothing(*args, **kwargs) -> None:
    pass


class _NoLaunch:
    """Stands in for a Numba kernel: kernel[grid, block, stream](...) does nothing."""

    def __getitem__(self, launch_config):
        return _nothing


def ablated_graph_us(engine: LLMEngine) -> float:
    """Capture the decode graphs again, restage a real step's inputs, time bucket 1's replay."""
    engine.runner.capture_decode_graphs()
    for _ in range(2):
        engine.step()
    return statistics.median(graph_us(engine, 1) for _ in range(CAPTURES))


def ablate(engine: LLMEngine, partitions: list[int]) -> list[dict]:
    """(variant, graph µs) rows: the full graph, each operator left out, the merge left out,
    each forced partition count, and the full graph again (the drift between the two)."""
    backend = engine.runner.backend
    rows = [{"variant": "full graph", "graph_us": ablated_graph_us(engine)}]
    for operator in OPERATORS:
        setattr(backend, operator, _nothing)
        rows.append({"variant": f"without {operator}", "graph_us": ablated_graph_us(engine)})
        delattr(backend, operator)
    merge = attention_split._merge_partitions_kernel
    attention_split._merge_partitions_kernel = _NoLaunch()
    rows.append({"variant": "without split-K's merge", "graph_us": ablated_graph_us(engine)})
    attention_split._merge_partitions_kernel = merge
    choose = variants.decode_partitions
    for count in partitions:
        variants.decode_partitions = lambda *args, count=count: count
        rows.append({"variant": f"{count} partitions", "graph_us": ablated_graph_us(engine)})
    variants.decode_partitions = choose
    rows.append({"variant": "full graph again", "graph_us": ablated_graph_us(engine)})
    full = rows[0]["graph_us"]
    for row in rows:
        row["cost_us"] = full - row["graph_us"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--partitions", type=int, nargs="*", default=[1, 8, 16, 32, 64])
    args = parser.parse_args()

    engine = LLMEngine(model_dir(args.model), max_model_len=2048, num_blocks=2000, max_num_seqs=1)
    prompt = np.random.default_rng(0).integers(0, engine.config.vocab_size, args.context).tolist()
    engine.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=1500, ignore_eos=True), final_only=True)
    run_prefills(engine)
    rows = ablate(engine, args.partitions)
    print(f"\n{args.model}, batch 1, context {args.context}")
    print(f"{'variant':<32} {'graph us':>9} {'cost us':>8}")
    for row in rows:
        print(f"{row['variant']:<32} {row['graph_us']:>9.1f} {row['cost_us']:>8.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    payload = result_header() | {"model": args.model, "context": args.context, "rows": rows}
    RESULTS.write_text(json.dumps(payload, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
