"""Tiny safetensors checkpoints for the weights tests: random configs, their random bf16
weights, a file split into its JSON header and data, and a load that turns every
WeightsWarning into an error."""

import json
import warnings

import numpy as np
from hypothesis import strategies as st

from tests.helpers import random_bf16
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.weights import WeightsWarning, load_weights, weight_shapes


@st.composite
def tiny_configs(draw) -> ModelConfig:
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 2))
    head_dim = 2 * draw(st.integers(1, 3))
    return ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": draw(st.integers(2, 8)),
            "num_attention_heads": heads,
            "num_key_value_heads": kv_heads,
            "head_dim": head_dim,
            "intermediate_size": draw(st.integers(1, 8)),
            "num_hidden_layers": draw(st.integers(1, 2)),
            "vocab_size": draw(st.integers(1, 16)),
            "tie_word_embeddings": draw(st.booleans()),
        }
    )


def random_weights(config: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: random_bf16(rng, shape) for name, shape in weight_shapes(config).items()}


def split_header(path):
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def load_weights_strictly(model_dir, config):
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightsWarning)
        return load_weights(model_dir, config)
