"""bench_peers' figure and table for make_figures.py: tinyvllm beside vLLM, workload by workload."""

from pathlib import Path

import matplotlib.pyplot as plt
from result_tables import measured_by, number, table
from timelines import save  # it also makes matplotlib headless (Agg) and puts the checkout on sys.path

from perf.bench_peers import FIGURE, headline


def settings_of(data: dict, engine: str) -> dict:
    """The settings one engine ran with (the same for every model), {} if it never ran."""
    return next((runs[engine]["settings"] for runs in data["runs"].values() if "settings" in runs.get(engine, {})), {})


def measured(data: dict) -> list[tuple[str, str, str, float | None, float | None]]:
    """(model, workload, unit, vLLM's figure, tinyvllm's figure) for each workload run."""
    rows = []
    for model, engines in data["runs"].items():
        for workload in dict.fromkeys(w for e in engines.values() for w in e.get("results", {})):
            vllm, ours = (headline(engines, engine, workload) for engine in ("vllm", "tinyvllm"))
            rows.append((model, workload, FIGURE[workload][1], vllm, ours))
    return rows


def peers(data: dict, figures: Path) -> tuple[list[str], str]:
    rows = [r for r in measured(data) if r[3] and r[4]]
    figure, axis = plt.subplots(figsize=(6.5, 3.0))
    labels = [f"{model}: {workload}" for model, workload, *_ in rows]
    ratios = [ours / vllm for *_, vllm, ours in rows]
    axis.barh(labels, ratios, color=["#2980b9" if r >= 1 else "#c0392b" for r in ratios])
    axis.axvline(1.0, color="black", linewidth=1)
    axis.invert_yaxis()
    axis.set_xlabel("tinyvllm / vLLM (right of the line: tinyvllm faster)")
    axis.set_title(f"tinyvllm beside vLLM: {measured_by(data)}", fontsize=9)
    figure.tight_layout()
    names = [save(figure, figures / "peers.png")]
    vllm, ours = settings_of(data, "vllm"), settings_of(data, "tinyvllm")
    settings = (
        f"vLLM {vllm.get('vllm_version', '?')} with a step budget of {vllm.get('max_num_batched_tokens', '?')} tokens, "
        f"tinyvllm {ours.get('max_num_batched_tokens', '?')}; both max_model_len {ours.get('max_model_len', '?')}, "
        f"max_num_seqs {ours.get('max_num_seqs', '?')}, prefix caching on, CUDA graphs on.\n\n"
    )
    body = table(
        ["model", "workload", "unit", "vLLM", "tinyvllm", "tinyvllm / vLLM"],
        [[model, workload, unit, number(v, 5), number(t, 5), number(t / v if v and t else None)]
         for model, workload, unit, v, t in measured(data)],
    )  # fmt: skip
    runs = data["runs"].items()
    failed = [f"{model} {name}" for model, engines in runs for name, run in engines.items() if "failed" in run]
    return names, settings + body + (f"\n\nFailed to run: {', '.join(failed)}.\n" if failed else "")
