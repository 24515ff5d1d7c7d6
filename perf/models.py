"""The models the engine benchmarks run: the embedded SmolLM2 and Llama-3.2-1B shapes.

`llama-1b` is a directory of seeded random BF16 weights with Llama 3.2 1B's config and
tokenizer (tests.random_llama): the compute is the real model's. It is generated once into
the tinyvllm cache (TINYVLLM_CACHE).
"""

from pathlib import Path

from tests.random_llama import make_random_llama_dir
from tinyvllm.model.default_model import default_model_dir
from tinyvllm.model.hub import cache_dir

MODELS = ("smollm2", "llama-1b")


def model_dir(name: str) -> Path:
    if name == "smollm2":
        return default_model_dir()
    if name == "llama-1b":
        target = cache_dir() / "llama-3.2-1b-random"
        if not (target / "model.safetensors").exists():
            make_random_llama_dir(target, seed=0)
        return target
    return Path(name)
