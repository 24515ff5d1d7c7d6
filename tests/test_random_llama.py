"""Random Llama directories (tests.random_llama): they load in our loaders and in transformers."""

import json

import numpy as np
import pytest

from tests.random_llama import (
    LLAMA_3_2_1B_CONFIG,
    TINY_OVERRIDES,
    make_random_llama_dir,
    save_bytes_tokenizer,
)
from tinyvllm.kernels.reference import from_bf16
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.tokenizer import Tokenizer
from tinyvllm.model.weights import load_weights, weight_shapes

CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}]
# Llama 3.2's prompt format (Meta's model card) for CHAT on a fixed date.
CHAT_TEXT = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nBe brief.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nHi there!<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), config_overrides=TINY_OVERRIDES, tokenizer="bytes")


def test_default_config_is_llama_3_2_1b():
    config = ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG)
    assert config.num_parameters == 1_235_814_400  # Llama-3.2-1B's published parameter count
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads, config.num_key_value_heads) == (
        16,
        2048,
        32,
        8,
    )
    assert config.rope_scaling is not None and config.tie_word_embeddings


def test_tiny_dir_loads_in_our_loaders(tiny_dir):
    config = ModelConfig.from_dir(tiny_dir)
    for key, value in TINY_OVERRIDES.items():
        if key != "rope_scaling":
            assert getattr(config, key) == value, key
    assert config.bos_token_id == 256 and config.stop_token_ids == (257, 260, 261)
    weights = load_weights(tiny_dir, config)
    assert set(weights) == set(weight_shapes(config)) and not weights.unexpected
    assert abs(from_bf16(weights["model.layers.0.mlp.down_proj.weight"]).std() * np.sqrt(128) - 1) < 0.1
    assert abs(from_bf16(weights["model.embed_tokens.weight"]).std() - 1) < 0.05
    assert abs(from_bf16(weights["model.norm.weight"]).mean() - 1) < 0.02


def test_same_seed_same_bytes_other_seed_other_bytes(tiny_dir, tmp_path):
    again = make_random_llama_dir(tmp_path / "again", config_overrides=TINY_OVERRIDES, tokenizer="bytes")
    other = make_random_llama_dir(tmp_path / "other", config_overrides=TINY_OVERRIDES, tokenizer="bytes", seed=1)
    weights = (tiny_dir / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights


def test_tiny_dir_runs_in_transformers(tiny_dir):
    torch = pytest.importorskip("torch", reason="transformers, the oracle, needs torch (the ref extra)")
    pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    ids = tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, date_string="26 Jul 2024", return_tensors="pt", return_dict=True
    )
    assert tokenizer.decode(ids["input_ids"][0]) == CHAT_TEXT
    assert ids["input_ids"][0].tolist() == Tokenizer.from_dir(tiny_dir).encode_chat(CHAT, date_string="26 Jul 2024")
    with torch.no_grad():
        logits = model(**ids).logits
    assert logits.shape == (1, ids["input_ids"].shape[1], 512) and torch.isfinite(logits).all()
    assert tokenizer("é")["input_ids"] == [256, 0xC3, 0xA9]  # BOS, then one id per UTF-8 byte


def test_llama3_tokenizer_dir(tmp_path):
    """The real Llama 3.2 tokenizer with a small body: its special ids, no <|image|>, the chat format."""
    pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")
    from transformers import AutoTokenizer

    overrides = {key: value for key, value in TINY_OVERRIDES.items() if key != "vocab_size"}
    model_dir = make_random_llama_dir(tmp_path, config_overrides=overrides)
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (
        128256,
        128000,
        [128001, 128008, 128009],
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert len(tokenizer) == 128256
    assert (
        tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False, date_string="26 Jul 2024")
        == CHAT_TEXT
    )
    ids = Tokenizer.from_dir(model_dir).encode_chat(CHAT, date_string="26 Jul 2024")
    assert ids == tokenizer.apply_chat_template(
        CHAT, add_generation_prompt=True, date_string="26 Jul 2024", return_dict=False
    )
    assert ids[0] == 128000 and ids.count(128009) == 2


def test_tokenizer_larger_than_vocab_is_refused(tmp_path):
    with pytest.raises(ValueError, match="do not fit vocab_size 100"):
        make_random_llama_dir(tmp_path, config_overrides=TINY_OVERRIDES | {"vocab_size": 100}, tokenizer="bytes")


def test_bytes_tokenizer_cut_to_a_small_vocabulary(tmp_path):
    path = save_bytes_tokenizer(tmp_path / "tokenizer.json", 120)
    model_dir = make_random_llama_dir(tmp_path / "model", config_overrides=TINY_OVERRIDES | {"vocab_size": 128},
                                      tokenizer=path)  # fmt: skip
    tokenizer = Tokenizer.from_dir(model_dir)
    assert tokenizer.encode("hi") == [120, ord("h"), ord("i")]  # BOS is the first special token, after the bytes
    assert tokenizer.decode([ord("o"), ord("k")]) == "ok"
    with pytest.raises(ValueError, match="num_bytes: expected 1 to 256, got 0"):
        save_bytes_tokenizer(tmp_path / "none.json", 0)
