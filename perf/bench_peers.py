"""vLLM measured beside tinyvllm: the same weights, the same workloads, one GPU run.

    python -m perf.bench_peers [--models llama-1b smollm2] [--workloads W ...] [--vllm-site DIR] [--no-vllm] [--quick]

Workloads, token ids in, EOS ignored, greedy (tinyvllm.benchmark, perf/bench_prefix.py):
- decode: batch 1, prompt 128, 256 new tokens; decode tok/s without the prefill;
- nano_vllm: 256 requests, prompt and output lengths uniform in [100, 1024], all at once;
- prefill: 64 prompts of 1,024 tokens, one output token each;
- shared_prefix: 256 requests, one 2,048-token prefix plus 64 tokens of their own, 128
  output tokens, all at once (`generate`), with each engine's prefix caching on.
SmolLM2 runs the decode workload only (it is the latency model; the others are Llama's).

Each engine runs in a child process of its own, one after the other, so that each holds
the GPU's memory alone (both take 90% of it). The settings are the same where both have
them: max_model_len 4096, max_num_seqs 256, gpu_memory_utilization 0.9, prefix caching on,
CUDA graphs on. Each engine keeps its own step budget (max_num_batched_tokens) and its own
default for cascade attention (disable_cascade_attn: vLLM's True, tinyvllm's False), both
recorded in the JSON.

vLLM is a peer, never a dependency: only this script's vLLM child imports it, from
`--vllm-site` (a `pip install --no-deps --target` of ../shared/peers' wheels on the
offline GPU machine). Results: perf/results/bench_peers.json, written after each child,
so a run cut short keeps what it measured. `--quick --no-vllm --models tiny` checks the
script (tiny sizes, tinyvllm on the NumPy backend).
"""

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path

from perf.bench_prefix import FULL, QUICK, WARM_UP_SEED, Sizes, shared_prefix_workload
from perf.child import child_json
from perf.models import model_dir
from tinyvllm.benchmark import decode_latency, nano_vllm_warm_up, nano_vllm_workload, prefill_throughput, throughput
from tinyvllm.hardware import has_cuda_gpu
from tinyvllm.provenance import run_header

RESULTS = Path(__file__).resolve().parent / "results" / "bench_peers.json"
ENGINES = ("vllm", "tinyvllm")
SETTINGS = {"max_model_len": 4096, "max_num_seqs": 256, "gpu_memory_utilization": 0.9, "enable_prefix_caching": True}
WORKLOADS = {
    "llama-1b": ("decode", "nano_vllm", "prefill", "shared_prefix"),
    "smollm2": ("decode",),
    "tiny": ("decode", "nano_vllm", "prefill", "shared_prefix"),
}
FIGURE = {  # each workload's headline: the key of its result, and its unit
    "decode": ("decode_tok_per_s", "tok/s, batch 1"),
    "nano_vllm": ("output_tok_per_s", "output tok/s"),
    "prefill": ("prefill_tok_per_s", "prompt tok/s"),
    "shared_prefix": ("output_tok_per_s", "output tok/s"),
}


class VllmPeer:
    """vLLM's offline `LLM` behind the one call tinyvllm.benchmark makes: `generate` of
    token-id prompts with tinyvllm SamplingParams, returning vLLM's RequestOutputs (whose
    `outputs[i].token_ids` tinyvllm's own outputs share)."""

    def __init__(self, directory: Path) -> None:
        import vllm

        self.version = vllm.__version__
        self.llm = vllm.LLM(model=str(directory), dtype="bfloat16", seed=0, **SETTINGS)
        self._sampling_params = vllm.SamplingParams

    def settings(self) -> dict:
        """The settings vLLM chose where it was given none (its step budget, CUDA graphs)."""
        config = self.llm.llm_engine.vllm_config
        return {
            **SETTINGS,
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "enforce_eager": config.model_config.enforce_eager,
            "disable_cascade_attn": config.model_config.disable_cascade_attn,
            "vllm_version": self.version,
        }

    def generate(self, prompts: list[list[int]], params: list, use_tqdm: bool = False) -> list:
        vllm_params = [
            self._sampling_params(temperature=p.temperature, max_tokens=p.max_tokens, ignore_eos=p.ignore_eos)
            for p in params
        ]
        return self.llm.generate([{"prompt_token_ids": ids} for ids in prompts], vllm_params, use_tqdm=use_tqdm)


def tinyvllm_engine(directory: Path, backend: str):
    from tinyvllm.llm import LLM

    llm = LLM(directory, backend=backend, **SETTINGS)
    config = llm.engine.engine_config
    chosen = {"max_num_batched_tokens": config.max_num_batched_tokens, "enforce_eager": config.enforce_eager,
              "disable_cascade_attn": config.disable_cascade_attn}  # fmt: skip
    settings = {**SETTINGS, **chosen}
    return llm, settings


@dataclasses.dataclass(frozen=True)
class Scale:
    """The workloads' sizes: the issue's, or tiny ones for a CPU."""

    decode_prompt_len: int = 128
    decode_new_tokens: int = 256
    nano_requests: int = 256
    prefill_prompts: int = 64
    prefill_len: int = 1024
    prefix: Sizes = FULL


TINY = Scale(16, 8, 4, 4, 64, QUICK)


def measure(llm, workload: str, vocab: int, scale: Scale) -> dict:
    """One workload on one engine (after a warm-up on prompts the timed run does not repeat)."""
    if workload == "decode":
        return decode_latency(llm, scale.decode_prompt_len, scale.decode_new_tokens, vocab_size=vocab)
    if workload == "nano_vllm":
        throughput(llm, nano_vllm_warm_up(vocab))
        return throughput(llm, nano_vllm_workload(vocab, scale.nano_requests))
    if workload == "prefill":
        return prefill_throughput(llm, scale.prefill_prompts, scale.prefill_len, vocab_size=vocab)
    throughput(llm, shared_prefix_workload(scale.prefix, vocab, seed=WARM_UP_SEED))
    result = throughput(llm, shared_prefix_workload(scale.prefix, vocab))
    return {**result, "prefix_len": scale.prefix.prefix_len, "suffix_len": scale.prefix.suffix_len}


def child(engine: str, model: str, out: Path, scale: Scale, workloads: tuple[str, ...]) -> None:
    """Run one engine's `workloads` on one model and write {"settings", "results"} to out."""
    from tinyvllm.model.config import ModelConfig

    directory = model_dir(model)
    vocab = ModelConfig.from_dir(directory).vocab_size
    if engine == "vllm":
        llm = VllmPeer(directory)
        settings = llm.settings()
    else:
        llm, settings = tinyvllm_engine(directory, "numpy" if scale is TINY else "auto")
    results = {}
    for workload in workloads:
        print(f"{engine} {model}: {workload}", file=sys.stderr, flush=True)
        results[workload] = measure(llm, workload, vocab, scale)
    out.write_text(json.dumps({"settings": settings, "results": results}))


def run_child(engine: str, model: str, vllm_site: Path | None, quick: bool, workloads: tuple[str, ...]) -> dict:
    """One child's JSON, or its exit status and the tail of what it printed."""
    env = dict(os.environ)
    if engine == "vllm":
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"  # flashinfer's sampler JIT-builds at first use
        if vllm_site is not None:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (str(vllm_site), env.get("PYTHONPATH")) if p)

    def command(out: Path) -> list[str]:
        quick_flag = ["--quick"] if quick else []
        return [sys.executable, "-m", "perf.bench_peers", "--child", engine, model, str(out), *quick_flag,
                "--workloads", *workloads]  # fmt: skip

    done, result = child_json(command, env)
    sys.stderr.write(done.stderr[-4000:])
    if result is None:
        return {"failed": {"returncode": done.returncode, "stderr_tail": done.stderr[-3000:]}}
    return result


def headline(engines: dict, engine: str, workload: str) -> float | None:
    """One engine's FIGURE on one workload from a model's runs, None where it did not run."""
    return engines.get(engine, {}).get("results", {}).get(workload, {}).get(FIGURE[workload][0])


def ratios(runs: dict) -> dict:
    """tinyvllm over vLLM, per model and workload, where both measured it."""
    table = {}
    for model, engines in runs.items():
        for workload in FIGURE:
            vllm, ours = (headline(engines, engine, workload) for engine in ENGINES)
            if vllm and ours:
                table[f"{model}/{workload}"] = ours / vllm
    return table


def print_table(runs: dict) -> None:
    print(f"{'model':<10}{'workload':<15}{'unit':<15}{'vLLM':>11}{'tinyvllm':>11}{'ratio':>8}")
    for model, engines in runs.items():
        for workload in (w for w in WORKLOADS[model] if any(headline(engines, e, w) for e in ENGINES)):
            figures = [headline(engines, engine, workload) for engine in ENGINES]
            cells = ["-" if f is None else f"{f:.1f}" for f in figures]
            ratio = f"{figures[1] / figures[0]:.2f}x" if all(figures) else "-"
            print(f"{model:<10}{workload:<15}{FIGURE[workload][1]:<15}{cells[0]:>11}{cells[1]:>11}{ratio:>8}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["llama-1b", "smollm2"], choices=list(WORKLOADS))
    parser.add_argument("--vllm-site", type=Path, help="a directory to put first on vLLM's PYTHONPATH")
    parser.add_argument("--no-vllm", action="store_true", help="tinyvllm only (checks the script)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script on a CPU")
    parser.add_argument("--workloads", nargs="+", choices=list(FIGURE), help="only these (default: each model's all)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--child", nargs=3, metavar=("ENGINE", "MODEL", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    def chosen(model: str) -> tuple[str, ...]:
        return tuple(w for w in WORKLOADS[model] if not args.workloads or w in args.workloads)

    if args.child:
        engine, model, out = args.child
        child(engine, model, Path(out), TINY if args.quick else Scale(), chosen(model))
        return
    engines = [e for e in ENGINES if not (args.no_vllm and e == "vllm")]
    header = run_header("cuda" if has_cuda_gpu() else "numpy", " ".join(sys.orig_argv))
    runs: dict = {}
    for model in args.models:
        for engine in engines:
            runs.setdefault(model, {})[engine] = run_child(engine, model, args.vllm_site, args.quick, chosen(model))
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps({**header, "runs": runs, "tinyvllm_over_vllm": ratios(runs)}, indent=2))
    print_table(runs)


if __name__ == "__main__":
    main()
