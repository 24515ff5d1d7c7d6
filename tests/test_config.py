"""ModelConfig against transformers' LlamaConfig, LlamaRotaryEmbedding and LlamaForCausalLM."""

import json
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("torch", reason="transformers, the oracle, needs torch (the ref extra)")
pytest.importorskip("transformers", reason="transformers is the oracle (the ref extra)")

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from tinyvllm.model.config import (
    ConfigError,
    GenerationDefaults,
    ModelConfig,
    load_config,
)
from tinyvllm.model.rope import rope_inv_freq

# The shape of Llama 3.2 1B Instruct as its config.json (transformers 4.x layout) publishes it.
LLAMA_3_2_1B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "mlp_bias": False,
    "hidden_act": "silu",
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 128256,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "factor": 32.0,
        "high_freq_factor": 4.0,
        "low_freq_factor": 1.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    },
    "tie_word_embeddings": True,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16",
}


@st.composite
def llama_configs(draw):
    """Valid config dicts; optional keys sometimes left out so both sides' defaults are compared."""
    kv_heads = draw(st.integers(1, 4))
    heads = kv_heads * draw(st.integers(1, 4))
    head_dim = 2 * draw(st.integers(1, 8))
    raw = {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": heads * head_dim,
        "num_attention_heads": heads,
        "intermediate_size": draw(st.integers(1, 64)),
        "num_hidden_layers": draw(st.integers(1, 3)),
        "vocab_size": draw(st.integers(1, 300)),
    }
    optional = {
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": draw(st.sampled_from([1e-5, 1e-6])),
        "rope_theta": draw(st.sampled_from([10000.0, 100000.0, 500000.0])),
        "tie_word_embeddings": draw(st.booleans()),
        "max_position_embeddings": draw(st.integers(1, 8192)),
        "bos_token_id": draw(st.integers(0, 10)),
        "eos_token_id": draw(st.integers(0, 10) | st.lists(st.integers(0, 10), min_size=1, max_size=3)),
    }
    raw |= {key: value for key, value in optional.items() if draw(st.booleans())}
    if draw(st.booleans()):
        low = draw(st.sampled_from([1.0, 2.0]))
        raw["rope_scaling"] = {
            "rope_type": "llama3",
            "factor": draw(st.sampled_from([8.0, 32.0])),
            "low_freq_factor": low,
            "high_freq_factor": low * draw(st.sampled_from([2.0, 4.0])),
            "original_max_position_embeddings": draw(st.sampled_from([64, 8192])),
        }
        raw["max_position_embeddings"] = 131072
    return raw


def _transformers_config(raw: dict) -> LlamaConfig:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return LlamaConfig(**{key: value for key, value in raw.items() if key != "architectures"})


@settings(max_examples=40)
@given(raw=llama_configs())
def test_fields_and_rope_frequencies_match_transformers(raw):
    config = ModelConfig.from_dict(raw)
    expected = _transformers_config(raw)
    for name in [
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "intermediate_size",
        "vocab_size",
        "rms_norm_eps",
        "tie_word_embeddings",
        "max_position_embeddings",
        "bos_token_id",
    ]:
        assert getattr(config, name) == getattr(expected, name), name
    eos = expected.eos_token_id
    assert config.eos_token_id == tuple(eos if isinstance(eos, list) else [eos])
    assert config.rope_theta == expected.rope_parameters["rope_theta"]
    # The normalized rope settings drive the rope kernel's frequencies to transformers' own.
    inv_freq = LlamaRotaryEmbedding(expected).inv_freq.numpy()
    ours = rope_inv_freq(config.head_dim, config.rope_theta, config.rope_scaling)
    np.testing.assert_allclose(ours, inv_freq, rtol=1e-5)
    # transformers 5 writes its rope settings into rope_parameters: the same config must come back.
    assert ModelConfig.from_dict(json.loads(expected.to_json_string())) == config


@settings(max_examples=5)
@given(raw=llama_configs())
def test_num_parameters_matches_transformers(raw):
    with torch.device("meta"):
        model = LlamaForCausalLM(_transformers_config(raw))
    assert ModelConfig.from_dict(raw).num_parameters == sum(p.numel() for p in model.parameters())


def test_llama_3_2_1b():
    config = ModelConfig.from_dict(LLAMA_3_2_1B)
    assert config.rope_scaling == {"rope_type": "llama3"} | LLAMA_3_2_1B["rope_scaling"]
    assert (config.q_size, config.kv_size, config.num_kv_groups) == (2048, 512, 4)
    assert config.eos_token_id == (128001, 128008, 128009) and config.dtype == "bfloat16"
    assert config.num_parameters == 1_235_814_400


def _without(key):
    return lambda raw: {k: v for k, v in raw.items() if k != key}


def _with(**changes):
    return lambda raw: raw | changes


FAULTS = [
    (_with(architectures=["MistralForCausalLM"]), ["architectures"]),
    (_with(architectures=None, model_type="gpt2"), ["model_type"]),
    (_with(attention_bias=True), ["attention_bias"]),
    (_with(mlp_bias=True), ["mlp_bias"]),
    (_with(hidden_act="gelu"), ["hidden_act"]),
    (_with(num_key_value_heads=3), ["num_key_value_heads", "num_attention_heads"]),
    (_without("hidden_size"), ["hidden_size"]),
    (_without("vocab_size"), ["vocab_size"]),
    (_with(hidden_size=0), ["hidden_size"]),
    (_with(intermediate_size=-8), ["intermediate_size"]),
    (_with(num_hidden_layers=2.5), ["num_hidden_layers"]),
    (_with(head_dim=63), ["head_dim"]),
    (_with(rms_norm_eps=-1e-5), ["rms_norm_eps"]),
    (_with(rope_theta=0), ["rope_theta"]),
    (_with(rms_norm_eps="1e-5"), ["rms_norm_eps"]),
    (_with(tie_word_embeddings="yes"), ["tie_word_embeddings"]),
    (_with(eos_token_id=["</s>"]), ["eos_token_id"]),
    (_with(rope_scaling={"rope_type": "yarn", "factor": 4.0}), ["rope_scaling", "yarn"]),
    (_with(rope_scaling={"type": "linear", "factor": 4.0}), ["rope_scaling", "linear"]),
    (_with(rope_scaling=None, rope_parameters={"rope_type": "dynamic", "factor": 2.0}), ["rope_scaling", "dynamic"]),
    (_with(rope_scaling={"rope_type": "llama3", "low_freq_factor": 1.0}), ["rope_scaling", "factor"]),
    (_with(rope_scaling=LLAMA_3_2_1B["rope_scaling"] | {"high_freq_factor": 0.5}), ["rope_scaling", "high_freq"]),
]


@pytest.mark.parametrize("mutate, named", FAULTS, ids=lambda f: "-".join(f) if isinstance(f, list) else "")
def test_unsupported_or_invalid_configs_raise_naming_the_key(tmp_path, mutate, named):
    (tmp_path / "config.json").write_text(json.dumps(mutate(LLAMA_3_2_1B)))
    with pytest.raises(ConfigError) as raised:
        load_config(tmp_path)
    assert str(tmp_path / "config.json") in str(raised.value)
    for word in named:
        assert word in str(raised.value)


def test_generation_config_matches_transformers(tmp_path):
    generation = {
        "bos_token_id": 128000,
        "do_sample": True,
        "eos_token_id": [128001, 128009],
        "temperature": 0.6,
        "top_p": 0.9,
        "top_k": 40,
        "max_new_tokens": 256,
    }
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_3_2_1B | {"eos_token_id": 128009}))
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    config = ModelConfig.from_dir(tmp_path)
    expected = GenerationConfig.from_pretrained(tmp_path)
    assert config.generation == GenerationDefaults(
        temperature=expected.temperature,
        top_p=expected.top_p,
        top_k=expected.top_k,
        max_new_tokens=expected.max_new_tokens,
        do_sample=expected.do_sample,
        eos_token_id=tuple(expected.eos_token_id),
    )
    assert config.stop_token_ids == (128009, 128001)
    (tmp_path / "generation_config.json").write_text(json.dumps(generation | {"top_p": 1.5}))
    with pytest.raises(ConfigError, match="top_p"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="generation_config.json: not valid JSON"):
        ModelConfig.from_dir(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    assert ModelConfig.from_dir(tmp_path).generation == GenerationDefaults()


def test_missing_config_file_is_an_error(tmp_path):
    with pytest.raises(ConfigError, match="config.json: file not found"):
        load_config(tmp_path)
