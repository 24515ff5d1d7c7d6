"""Batch-1 decode: tinyvllm against the weight-streaming roofline and HF transformers.

    python -m perf.bench_decode [--models smollm2 llama-1b] [--new-tokens 256] [--no-peer]

Prompt 128 random tokens, 256 new tokens, greedy, EOS ignored. Decode tokens/s excludes
the prefill (tinyvllm.benchmark.decode_latency). The roofline reads every weight once per
token at the 4.25 TB/s copy ceiling. The peer is transformers' `generate` with a static
KV cache on the same weights, in the same run. Results: perf/results/bench_decode.json.
"""

import argparse
import json
import time
from pathlib import Path

from perf.models import MODELS, model_dir
from perf.timing import result_header
from tinyvllm.benchmark import decode_latency, random_workload, roofline_tok_per_s
from tinyvllm.llm import LLM
from tinyvllm.model.config import ModelConfig

RESULTS = Path(__file__).resolve().parent / "results" / "bench_decode.json"


def hf_decode_tok_per_s(directory: Path, prompt: list[int], new_tokens: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).cuda().eval()
    ids = torch.tensor([prompt], device="cuda")

    def run(model, n: int) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        model.generate(
            ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, cache_implementation="static", pad_token_id=0
        )
        torch.cuda.synchronize()
        return time.perf_counter() - start

    run(model, new_tokens)
    first = min(run(model, 1) for _ in range(2))
    full = min(run(model, new_tokens) for _ in range(2))
    del model
    torch.cuda.empty_cache()
    return (new_tokens - 1) / (full - first)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--peer-models", nargs="*", help="models to run the HF peer on (default: all)")
    parser.add_argument("--enforce-eager", action="store_true")
    args = parser.parse_args()

    rows = []
    for name in args.models:
        directory = model_dir(name)
        config = ModelConfig.from_dir(directory)
        llm = LLM(directory, max_num_seqs=8, max_model_len=2048, enforce_eager=args.enforce_eager)
        result = decode_latency(llm, args.prompt_len, args.new_tokens)
        del llm
        roofline = roofline_tok_per_s(config.num_parameters)
        result.update(
            model=name, roofline_tok_per_s=roofline, percent_of_roofline=100 * result["decode_tok_per_s"] / roofline
        )
        if not args.no_peer and (args.peer_models is None or name in args.peer_models):
            prompt = random_workload(1, (args.prompt_len, args.prompt_len), (1, 1), config.vocab_size).prompts[0]
            result["hf_static_tok_per_s"] = hf_decode_tok_per_s(directory, prompt, args.new_tokens)
            result["speedup_vs_hf"] = result["decode_tok_per_s"] / result["hf_static_tok_per_s"]
        rows.append(result)
        print(json.dumps(result), flush=True)
        # Rewritten after every model, so that a run cut short keeps the rows it measured.
        RESULTS.parent.mkdir(exist_ok=True)
        RESULTS.write_text(json.dumps({**result_header(), "results": rows}, indent=2))

    print(f"{'model':<10} {'tok/s':>8} {'ms/tok':>7} {'roofline':>9} {'%roof':>6} {'HF tok/s':>9} {'x HF':>6}")
    for r in rows:
        print(
            f"{r['model']:<10} {r['decode_tok_per_s']:8.1f} {r['decode_ms_per_token']:7.3f} "
            f"{r['roofline_tok_per_s']:9.1f} {r['percent_of_roofline']:6.1f} "
            f"{r.get('hf_static_tok_per_s', float('nan')):9.1f} {r.get('speedup_vs_hf', float('nan')):6.2f}"
        )


if __name__ == "__main__":
    main()
