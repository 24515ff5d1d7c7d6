"""Engine benchmarks: the workloads behind `tinyvllm bench` and the perf/ scripts.

Every run feeds random token ids (a prompt's content does not change the work) and
ignores EOS, so each request computes exactly the tokens asked for. Times are wall clock
around whole `generate` calls: the engine synchronises with the GPU once per step, so
the clock sees the GPU's work.

- `decode_latency`: one request; decode tokens/s = (n - 1) / (time(n tokens) - time(1 token)),
  i.e. the prefill and the first token are subtracted out.
- `throughput`: the nano-vllm workload: prompt and output lengths uniform in [100, 1024],
  all requests submitted at once; output tokens/s over the whole run.
- `prefill_throughput`: many long prompts, one output token each; prompt tokens/s.

`decode_latency` and `throughput` report each phase as it starts through `progress`
(`tinyvllm bench` prints those lines to stderr, so a run of minutes is not silent).
"""

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tinyvllm.llm import LLM
from tinyvllm.sampling_params import SamplingParams


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]

    @property
    def output_tokens(self) -> int:
        return sum(self.output_lens)

    def params(self) -> list[SamplingParams]:
        return [SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True) for n in self.output_lens]


def random_workload(
    num_requests: int, prompt_lens: tuple[int, int], output_lens: tuple[int, int], vocab_size: int, seed: int = 0
) -> Workload:
    """Lengths uniform in the inclusive ranges; token ids uniform over the vocabulary."""
    rng = np.random.default_rng(seed)
    prompts = [
        rng.integers(0, vocab_size, int(rng.integers(prompt_lens[0], prompt_lens[1] + 1))).tolist()
        for _ in range(num_requests)
    ]
    outputs = rng.integers(output_lens[0], output_lens[1] + 1, num_requests).tolist()
    return Workload(prompts, outputs)


def quiet(message: str) -> None:
    """The default progress reporter: says nothing."""


def nano_vllm_workload(vocab_size: int, num_requests: int = 256, seed: int = 0) -> Workload:
    return random_workload(num_requests, (100, 1024), (100, 1024), vocab_size, seed)


def nano_vllm_warm_up(vocab_size: int) -> Workload:
    """Four short requests that compile and warm the engine before the nano-vllm workload,
    on prompts of their own: the prefix cache would find the timed run's first ones."""
    return Workload(nano_vllm_workload(vocab_size, 4, seed=1).prompts, [4] * 4)


def timed_generate(llm: LLM, workload: Workload) -> float:
    """Seconds to run the whole workload."""
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, workload.params(), use_tqdm=False)
    elapsed = time.perf_counter() - start
    produced = sum(len(completion.token_ids) for output in outputs for completion in output.outputs)
    if produced != workload.output_tokens:
        raise RuntimeError(f"produced {produced} tokens, expected {workload.output_tokens}")
    return elapsed


def decode_latency(
    llm: LLM,
    prompt_len: int = 128,
    new_tokens: int = 256,
    repeats: int = 3,
    progress: Callable[[str], None] = quiet,
    vocab_size: int | None = None,
) -> dict:
    """Time to first token, and the decode's rate from how much longer `new_tokens` take than
    one. `vocab_size` defaults to the tinyvllm engine's; a peer engine passes it."""
    if new_tokens < 2:
        raise ValueError(
            f"new_tokens must be at least 2 to time a decode (the first comes from the prefill); got {new_tokens}"
        )
    vocab = vocab_size or llm.engine.config.vocab_size

    def fresh(run: int, tokens: int) -> Workload:
        # each run its own prompt: with the prefix cache on, a repeated prompt would be a cache hit
        return Workload(random_workload(1, (prompt_len, prompt_len), (1, 1), vocab, seed=run).prompts, [tokens])

    progress(f"warm-up: {prompt_len} prompt tokens, {new_tokens} new")
    timed_generate(llm, fresh(0, new_tokens))
    progress(f"time to first token and {new_tokens} tokens: best of {repeats} runs each, alternating")
    # alternating, so that a busy spell on the machine slows both kinds of run alike
    first_runs, full_runs = [], []
    for run in range(repeats):
        first_runs.append(timed_generate(llm, fresh(1 + 2 * run, 1)))
        full_runs.append(timed_generate(llm, fresh(2 + 2 * run, new_tokens)))
    first_s, full_s = min(first_runs), min(full_runs)
    decode_s = full_s - first_s
    if decode_s <= 0:
        raise ValueError(
            f"{new_tokens} new tokens took no longer than one ({full_s * 1e3:.3f} against {first_s * 1e3:.3f} ms): "
            "the decode is below the timer's noise; ask for more new tokens"
        )
    return {
        "prompt_len": prompt_len,
        "new_tokens": new_tokens,
        "time_to_first_token_ms": first_s * 1e3,
        "decode_ms_per_token": decode_s / (new_tokens - 1) * 1e3,
        "decode_tok_per_s": (new_tokens - 1) / decode_s,
    }


def throughput(llm: LLM, workload: Workload, progress: Callable[[str], None] = quiet) -> dict:
    prompt_tokens = sum(len(prompt) for prompt in workload.prompts)
    requests = len(workload.prompts)
    progress(f"{requests} requests at once: {prompt_tokens} prompt tokens, {workload.output_tokens} output")
    seconds = timed_generate(llm, workload)
    return {
        "requests": len(workload.prompts),
        "output_tokens": workload.output_tokens,
        "seconds": seconds,
        "output_tok_per_s": workload.output_tokens / seconds,
    }


def prefill_throughput(llm: LLM, num_prompts: int = 64, prompt_len: int = 1024, vocab_size: int | None = None) -> dict:
    """Prompt tokens/s over num_prompts prompts of prompt_len tokens, one output token each.
    The warm-up's prompts are not the timed ones: with the prefix cache on, timed prompts found
    cached would compute less, and their chunks would straddle every step's budget."""
    vocab = vocab_size or llm.engine.config.vocab_size
    workload = random_workload(num_prompts, (prompt_len, prompt_len), (1, 1), vocab, seed=1)
    timed_generate(llm, random_workload(2, (prompt_len, prompt_len), (1, 1), vocab, seed=2))
    seconds = timed_generate(llm, workload)
    tokens = num_prompts * prompt_len
    return {"prompts": num_prompts, "prompt_len": prompt_len, "seconds": seconds, "prefill_tok_per_s": tokens / seconds}


def roofline_tok_per_s(num_parameters: int, bandwidth_bytes_per_s: float = 4.25e12) -> float:
    """Batch-1 decode reads every bf16 weight once per token: that bounds tokens/s."""
    return bandwidth_bytes_per_s / (2 * num_parameters)
