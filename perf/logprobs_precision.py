"""How far bf16 moves logprobs: the engine and transformers against transformers in float32.

    python -m perf.logprobs_precision [--backends numpy-bf16 numpy-float32 cuda]

The workload of issue 31's bar (tests/test_logprobs_transformers.py): SmolLM2-135M-Instruct,
two chat prompts, greedy, 16 new tokens, the top 5 logprobs of every prompt and generated
token. The engine generates; each logprob it returns is compared with transformers' float32
log-softmax of prompt + generated tokens, teacher-forced. The same entries (positions and token
ids) are then read from transformers' own bf16 model, with its bf16 logits and with float32
logits from its bf16 hidden states, so that the engine's error stands beside a standard bf16
implementation's on exactly the same numbers. `cuda` needs a GPU. Prints a table; results go
to perf/results/logprobs_precision.json.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from tests.test_logprobs_transformers import BAR_NATS, NEW_TOKENS, PROMPTS, TOP  # the bar's workload, stated once
from tinyvllm import LLM, SamplingParams
from tinyvllm.hardware import has_cuda_gpu
from tinyvllm.model.default_model import default_model_dir
from tinyvllm.provenance import run_header

RESULTS = Path(__file__).resolve().parent / "results" / "logprobs_precision.json"
BACKENDS = {"numpy-bf16": ("numpy", "bf16"), "numpy-float32": ("numpy", "float32"), "cuda": ("cuda", "float32")}


def engine_entries(directory: Path, backend: str) -> list[tuple[list[int], list[dict]]]:
    """Per prompt: prompt + generated token ids, and each position's {token id: logprob}
    (position k: the distribution after the first k + 1 tokens)."""
    engine_backend, activations = BACKENDS[backend]
    llm = LLM(directory, backend=engine_backend, activation_dtype=activations, num_blocks=64, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP, prompt_logprobs=TOP)
    prompts = [llm.engine.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in PROMPTS]
    runs = []
    for prompt, output in zip(prompts, llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)):
        completion = output.outputs[0]
        entries = output.prompt_logprobs[1:] + completion.logprobs
        runs.append((prompt + completion.token_ids, [{t: lp.logprob for t, lp in e.items()} for e in entries]))
    return runs


def errors(runs, log_softmax) -> list[float]:
    """|logprob - reference| over every entry, the reference log_softmax(token ids) -> [T, V]."""
    found = []
    for token_ids, entries in runs:
        reference = log_softmax(token_ids)
        found += [abs(lp - reference[k][t]) for k, entry in enumerate(entries) for t, lp in entry.items()]
    return found


def summary(found: list[float]) -> dict:
    values = np.asarray(found)
    return {"entries": len(values), "over_bar": int((values > BAR_NATS).sum()), "max_nats": float(values.max()),
            "mean_nats": float(values.mean())}  # fmt: skip


def transformers_log_softmax(directory: Path):
    """(float32 reference, bf16 model's bf16 logits, bf16 hidden states through a float32 LM head)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    exact = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    half = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).eval()
    head = exact.lm_head

    def run(model, ids, float_head=False):
        with torch.no_grad():
            if float_head:
                hidden = model.model(torch.tensor([ids])).last_hidden_state[0].float()
                logits = head(hidden)
            else:
                logits = model(torch.tensor([ids])).logits[0]
        return torch.log_softmax(logits.double(), dim=-1).numpy()

    return (lambda ids: run(exact, ids), lambda ids: run(half, ids), lambda ids: run(half, ids, float_head=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = ["numpy-bf16", "numpy-float32"] + (["cuda"] if has_cuda_gpu() else [])
    parser.add_argument("--backends", nargs="+", default=default, choices=list(BACKENDS))
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    directory = default_model_dir()
    exact, half, half_float_head = transformers_log_softmax(directory)
    results = {}
    for backend in args.backends:
        runs = engine_entries(directory, backend)
        results[f"tinyvllm {backend}"] = summary(errors(runs, exact))
        if backend == args.backends[0]:  # transformers' bf16 on the same entries as the first engine's
            results["transformers bf16"] = summary(errors(runs, half))
            results["transformers bf16, float32 LM head"] = summary(errors(runs, half_float_head))
    print(f"{'against transformers float32':<40}{'entries':>8}{'> 0.08':>8}{'max':>8}{'mean':>8}")
    for name, row in results.items():
        print(f"{name:<40}{row['entries']:>8}{row['over_bar']:>8}{row['max_nats']:>8.3f}{row['mean_nats']:>8.3f}")
    header = run_header("cuda" if "cuda" in args.backends else "numpy", " ".join(sys.orig_argv))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({**header, "bar_nats": BAR_NATS, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
