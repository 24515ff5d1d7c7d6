"""The bar for logprobs on a real model: SmolLM2-135M-Instruct (the default model), greedy,
against transformers' float32 log-softmax of the same tokens, teacher-forced: the prompt
logprobs and those of the generated tokens.

Our engine generates; transformers then scores prompt + generated tokens in one forward, so
a token where the two would have chosen differently still compares the same distribution.
The NumPy engine (float32 activations) must agree to a few thousandths of a nat; the CUDA
engine's bf16 activations move logprobs by a few hundredths, hence the bar of 0.08 nats,
and a top-5 set may swap one near-tied token.
"""

import numpy as np
import pytest

from tests.hub_fixtures import hub_cache, smollm2_dir  # noqa: F401  (fixtures)
from tinyvllm import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = ["What is the capital of France?", "Write a haiku about the sea."]
NEW_TOKENS = 16
TOP = 5
BAR_NATS = 0.08
MIN_TOP_AGREEMENT = 4


@pytest.fixture(scope="module")
def transformers_model(smollm2_dir):  # noqa: F811
    torch = pytest.importorskip("torch", reason="transformers, the oracle, needs torch (the ref extra)")
    pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()


def _transformers_log_softmax(model, token_ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([token_ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1).numpy()


@pytest.mark.parametrize("backend", ["numpy", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_greedy_logprobs_match_transformers(transformers_model, smollm2_dir, backend):  # noqa: F811
    llm = LLM(smollm2_dir, backend=backend, num_blocks=64, max_model_len=256)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=TOP, prompt_logprobs=TOP)
    prompts = [llm.engine.tokenizer.encode_chat([{"role": "user", "content": text}]) for text in PROMPTS]
    errors, disagreements = [], []  # every miss is gathered, so that a failure shows them all
    for prompt, output in zip(prompts, llm.generate([{"prompt_token_ids": ids} for ids in prompts], params)):
        completion = output.outputs[0]
        expected = _transformers_log_softmax(transformers_model, prompt + completion.token_ids)
        assert output.prompt_logprobs[0] is None and len(output.prompt_logprobs) == len(prompt)
        # entry k (prompt token k, or generated token k - len(prompt)) from transformers' row k - 1
        entries = output.prompt_logprobs[1:] + completion.logprobs
        for position, entry in enumerate(entries):
            row = expected[position]
            errors += [(abs(lp.logprob - row[token_id]), position, token_id) for token_id, lp in entry.items()]
            top = set(np.argsort(-row)[:TOP].tolist())
            if len(top & set(list(entry)[:TOP])) < MIN_TOP_AGREEMENT:
                disagreements.append(position)
    over = sorted((e for e in errors if e[0] > BAR_NATS), reverse=True)
    assert not over, f"{len(over)} of {len(errors)} logprobs off by more than {BAR_NATS} nats; worst {over[:5]}"
    assert not disagreements, f"top-{TOP} sets share fewer than {MIN_TOP_AGREEMENT} tokens at {disagreements}"
