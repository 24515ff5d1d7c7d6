"""Offline throughput on the nano-vllm workload, static against continuous batching, with
HF transformers as the peer; plus prefill throughput.

    python -m perf.bench_throughput [--model llama-1b] [--requests 256] [--no-peer]
                                    [--no-enable-prefix-caching]

Workload: 256 requests, prompt and output lengths uniform in [100, 1024], seed 0, EOS
ignored (tinyvllm.benchmark.nano_vllm_workload). The peer runs `generate` on a
64-request subset as one left-padded batch, greedy, until the longest output; its useful
tokens are the subset's requested output lengths. Prefill: 64 prompts x 1024 tokens, one
output token each, on the engine that ran the continuous workload (with the prefix cache
on, its arena is then full of cached blocks, which the prefill's allocations evict).
Results: perf/results/bench_throughput.json.
"""

import argparse
import json
import time
from pathlib import Path

from perf.models import model_dir
from perf.timing import result_header
from tinyvllm.benchmark import (
    Workload,
    nano_vllm_warm_up,
    nano_vllm_workload,
    prefill_throughput,
    throughput,
)
from tinyvllm.llm import LLM
from tinyvllm.model.config import ModelConfig

RESULTS = Path(__file__).resolve().parent / "results" / "bench_throughput.json"
PEER_REQUESTS = 64


def hf_throughput(directory: Path, workload: Workload) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16).cuda().eval()
    longest = max(len(p) for p in workload.prompts)
    ids = torch.zeros((len(workload.prompts), longest), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(workload.prompts):
        ids[row, longest - len(prompt) :] = torch.tensor(prompt)
        mask[row, longest - len(prompt) :] = 1
    new_tokens = max(workload.output_lens)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(
        ids.cuda(),
        attention_mask=mask.cuda(),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )
    torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    del model
    torch.cuda.empty_cache()
    return {
        "requests": len(workload.prompts),
        "useful_output_tokens": workload.output_tokens,
        "seconds": seconds,
        "useful_output_tok_per_s": workload.output_tokens / seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument(
        "--num-blocks", type=int, help="KV blocks (16 tokens each); default: sized by gpu_memory_utilization 0.9"
    )
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    args = parser.parse_args()

    directory = model_dir(args.model)
    config = ModelConfig.from_dir(directory)
    workload = nano_vllm_workload(config.vocab_size, args.requests)
    results = {
        "model": args.model,
        "enable_prefix_caching": args.enable_prefix_caching,
        "workload": {"requests": args.requests, "output_tokens": workload.output_tokens},
    }
    for mode in ("continuous", "static"):
        llm = LLM(
            directory,
            mode=mode,
            max_model_len=4096,
            enforce_eager=args.enforce_eager,
            num_blocks=args.num_blocks,
            enable_prefix_caching=args.enable_prefix_caching,
        )
        throughput(llm, nano_vllm_warm_up(config.vocab_size))
        results[mode] = throughput(llm, workload)
        if mode == "continuous":
            results["prefill"] = prefill_throughput(llm)
        del llm
    if not args.no_peer:
        subset = Workload(workload.prompts[:PEER_REQUESTS], workload.output_lens[:PEER_REQUESTS])
        results["hf_generate_subset"] = hf_throughput(directory, subset)
        results["continuous_vs_hf"] = (
            results["continuous"]["output_tok_per_s"] / results["hf_generate_subset"]["useful_output_tok_per_s"]
        )

    print(f"{'run':<22} {'tokens':>9} {'seconds':>8} {'tok/s':>10}")
    for mode in ("continuous", "static"):
        r = results[mode]
        print(f"{mode:<22} {r['output_tokens']:9d} {r['seconds']:8.2f} {r['output_tok_per_s']:10.1f}")
    p = results["prefill"]
    print(
        f"{'prefill 64x1024':<22} {p['prompts'] * p['prompt_len']:9d} "
        f"{p['seconds']:8.2f} {p['prefill_tok_per_s']:10.1f}"
    )
    if "hf_generate_subset" in results:
        h = results["hf_generate_subset"]
        print(
            f"{'HF generate (64 req)':<22} {h['useful_output_tokens']:9d} {h['seconds']:8.2f} "
            f"{h['useful_output_tok_per_s']:10.1f}   continuous/HF = {results['continuous_vs_hf']:.1f}x"
        )
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({**result_header(), **results}, indent=2))


if __name__ == "__main__":
    main()
