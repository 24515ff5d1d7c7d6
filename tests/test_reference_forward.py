"""The NumPy reference forward (the CPU backend) against transformers on the CPU.

Both run in float32 on the same bf16 weights; transformers is the independent oracle.
SmolLM2 (real weights, chat prompts through each side's own chat template) and a small
random Llama with llama3 rope scaling whose prompts run past original_max_position_embeddings.
"""

from functools import partial

import numpy as np
import pytest

pytest.importorskip("torch", reason="transformers, the oracle, needs torch (the ref extra)")
pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.helpers import next_token_logits
from tests.hub_fixtures import hub_cache, smollm2_dir  # noqa: F401  (fixtures)
from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tests.test_engine_penalties import greedy_loop
from tinyvllm import LLM, SamplingParams

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CHATS = [
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Give me two tips for learning Python.",
]


def _hf_greedy(model, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    with torch.no_grad():
        output = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
        )
    return output[0, len(prompt_ids) :].tolist()


def _hf_logits(model, prompt_ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([prompt_ids])).logits[0, -1].double().numpy()


def _assert_logits_close(ours: np.ndarray, theirs: np.ndarray) -> None:
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() <= 2e-3 * scale
    assert np.argmax(ours) == np.argmax(theirs)


def test_smollm2_matches_transformers(smollm2_dir):  # noqa: F811
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    hf_tokenizer = AutoTokenizer.from_pretrained(smollm2_dir)
    llm = LLM(smollm2_dir, backend="numpy", activation_dtype="float32", max_model_len=1024)
    for text in CHATS:
        messages = [{"role": "user", "content": text}]
        prompt_ids = llm.tokenizer.encode_chat(messages)
        rendered = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert prompt_ids == hf_tokenizer(rendered, add_special_tokens=False)["input_ids"]
        _assert_logits_close(next_token_logits(llm, prompt_ids), _hf_logits(model, prompt_ids))
        ours = llm.generate([prompt_ids], SamplingParams(temperature=0.0, max_tokens=32))[0].outputs[0].token_ids
        assert ours == _hf_greedy(model, prompt_ids, 32)


def test_llama3_rope_scaling_beyond_original_context_matches_transformers(tmp_path):
    """TINY_OVERRIDES sets original_max_position_embeddings to 64: prompts of ~100 tokens
    put every generated position in the band that llama3 scaling changes."""
    directory = make_random_llama_dir(tmp_path / "tiny", tokenizer="bytes", config_overrides=TINY_OVERRIDES)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    llm = LLM(directory, backend="numpy", activation_dtype="float32")
    rng = np.random.default_rng(0)
    for length in (70, 100, 130):
        prompt_ids = rng.integers(0, 256, length).tolist()
        _assert_logits_close(next_token_logits(llm, prompt_ids), _hf_logits(model, prompt_ids))
        ours = llm.generate([prompt_ids], SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))[0].outputs[0]
        assert ours.token_ids == _hf_greedy(model, prompt_ids, 24)[: len(ours.token_ids)]


def test_smollm2_penalized_greedy_matches_a_loop_over_transformers_logits(smollm2_dir):  # noqa: F811
    """The engine's presence, frequency and repetition penalties against the greedy loop of
    tests/test_engine_penalties.py over transformers' logits: the same tokens."""
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    llm = LLM(smollm2_dir, backend="numpy", activation_dtype="float32", max_model_len=1024)
    penalties = {"presence_penalty": 0.5, "frequency_penalty": 0.3, "repetition_penalty": 1.3}
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, **penalties)
    for text in CHATS:
        prompt_ids = llm.tokenizer.encode_chat([{"role": "user", "content": text}])
        ours = llm.generate([prompt_ids], params, use_tqdm=False)[0].outputs[0].token_ids
        theirs = greedy_loop(partial(_hf_logits, model), prompt_ids, 16, presence=0.5, frequency=0.3, repetition=1.3)
        assert ours == theirs, text
        assert theirs != greedy_loop(partial(_hf_logits, model), prompt_ids, 16), "the penalties change nothing here"
