"""The docs' figures and result tables: from perf/results/*.json, and a simulated schedule.

    python docs/scripts/make_figures.py [--results perf/results] [--figures docs/figures]
                                        [--tables docs/generated/perf]

For each benchmark whose JSON is in --results it draws the figure(s) into --figures and writes
docs/generated/perf/<bench>.md: who measured it (device, date, git revision), the command,
the figures and a table of the numbers; the performance page includes those files. A
benchmark without a JSON is skipped with a message, and its table file says that the numbers
are pending. The batching and preemption timelines need no GPU (`timelines.py`: the real
Scheduler over a fake model), nor does the prefix cache's hash chain (`prefix_cache_figure.py`),
nor the chapters' concept figures, computed by the engine's own code on the CPU
(`model_figures.py`, `inference_figures.py`).
Matplotlib runs headless (Agg). Each benchmark's figures and
table are drawn in `kernel_figures.py`, `engine_figures.py` or `peer_figures.py`.
"""

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling modules
from engine_figures import ablation, decode, profile, registers, serve, throughput, timeline  # noqa: E402
from inference_figures import inference_figures  # noqa: E402
from kernel_figures import attention, elementwise, gemm, sampling  # noqa: E402
from model_figures import model_figures  # noqa: E402
from peer_figures import peers  # noqa: E402
from prefix_cache_figure import hash_chain_figure  # noqa: E402
from timelines import ROOT, simulated_figures  # noqa: E402


@dataclass(frozen=True)
class Benchmark:
    name: str
    command: str
    draw: Callable[[dict, Path], tuple[list[str], str]]


BENCHMARKS = (
    Benchmark("bench_gemm", "python -m perf.bench_gemm", gemm),
    Benchmark("bench_elementwise", "python -m perf.bench_elementwise", elementwise),
    Benchmark("bench_attention", "python -m perf.bench_attention", attention),
    Benchmark("bench_sampling", "python -m perf.bench_sampling", sampling),
    Benchmark("bench_decode", "python -m perf.bench_decode", decode),
    Benchmark("bench_throughput", "python -m perf.bench_throughput", throughput),
    Benchmark("bench_serve", "python -m perf.bench_serve", serve),
    Benchmark("bench_peers", "python -m perf.bench_peers --vllm-site DIR", peers),
    Benchmark("profile_step", "python -m perf.profile_step", profile),
    Benchmark("ablate_step", "python -m perf.ablate_step", ablation),
    Benchmark("timeline_step", "python -m perf.timeline_step", timeline),
    Benchmark("kernel_registers", "python -m perf.kernel_registers", registers),
)


def pending(bench: Benchmark) -> str:
    return (
        '!!! warning "Numbers pending the H200 run"\n'
        f"    `perf/results/{bench.name}.json` is not there yet. On the GPU: `{bench.command}`;\n"
        "    then `python docs/scripts/make_figures.py` fills this section with the figures and the table.\n"
    )


def results_page(bench: Benchmark, data: dict, names: list[str], body: str) -> str:
    """The provenance line and the figures in view, the numbers folded (pymdownx.details)."""
    images = "\n\n".join(f"![{bench.name}: {name}](figures/{name})" for name in names)
    note = f" {data['note']}" if "note" in data else ""
    folded = "\n".join(f"    {line}" if line else "" for line in body.splitlines())
    return (
        f"Measured on **{data['device']}**, {data['date']}, git `{data['git_rev']}`, by\n"
        f'`{data["command"]}`.{note}\n\n{images}\n\n??? note "The numbers of {bench.name}"\n\n{folded}\n'
    )


def run(results: Path, figures: Path, tables: Path) -> None:
    """The timelines, then each benchmark's figures and table (or its pending note)."""
    tables.mkdir(parents=True, exist_ok=True)
    simulated_figures(figures)
    hash_chain_figure(figures)
    model_figures(figures)
    inference_figures(figures)
    for bench in BENCHMARKS:
        path = results / f"{bench.name}.json"
        if not path.exists():
            print(f"skipping {bench.name}: {path} not found (run `{bench.command}` on the GPU)")
            page = pending(bench)
        else:
            data = json.loads(path.read_text())
            names, body = bench.draw(data, figures)
            page = results_page(bench, data, names, body)
        (tables / f"{bench.name}.md").write_text(page)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=ROOT / "perf" / "results")
    parser.add_argument("--figures", type=Path, default=ROOT / "docs" / "figures")
    parser.add_argument("--tables", type=Path, default=ROOT / "docs" / "generated" / "perf")
    args = parser.parse_args()
    run(args.results, args.figures, args.tables)


if __name__ == "__main__":
    main()
