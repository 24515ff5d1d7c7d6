"""Watch the real Scheduler batch five requests, static against continuous, with no model at all.

Run it from the repository root: python docs/examples/batching.py
Every sampled token is 0 and EOS is ignored, so each request runs for exactly max_tokens.
"""

import numpy as np

from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.block_manager import BlockAllocator
from tinyvllm.engine.scheduler import Scheduler
from tinyvllm.engine.sequence import Sequence
from tinyvllm.sampling_params import SamplingParams

PROMPTS = [8, 4, 12, 4, 6]  # prompt tokens of requests A to E
OUTPUTS = [6, 2, 3, 5, 2]  # tokens each generates


def run(mode: str) -> int:
    config = ResolvedEngineConfig(mode=mode, num_blocks=64, block_size=4, max_num_seqs=2,
                                  max_num_batched_tokens=16, max_model_len=32)  # fmt: skip
    scheduler = Scheduler(config, BlockAllocator(config.num_blocks))
    for name, prompt, output in zip("ABCDE", PROMPTS, OUTPUTS):
        scheduler.add(Sequence(name, [1] * prompt, SamplingParams(max_tokens=output, ignore_eos=True)))
    print(f"{mode}: at most {config.max_num_seqs} sequences a step")
    steps = 0
    while (batch := scheduler.schedule()) is not None:
        kinds = ["decode"] * batch.num_decodes + ["prefill"] * (len(batch.seqs) - batch.num_decodes)
        print(f"  step {steps:2}: " + " ".join(f"{seq.request_id}:{kind}" for seq, kind in zip(batch.seqs, kinds)))
        scheduler.launched(batch)
        scheduler.postprocess(batch, np.zeros(batch.num_samples, dtype=np.int64))  # every token sampled is 0
        steps += 1
    return steps


static, continuous = run("static"), run("continuous")
print(f"static batching took {static} steps, continuous {continuous}")
assert continuous < static  # a finished request's place is refilled at the next step
