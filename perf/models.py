"""The models the engine benchmarks run: the embedded SmolLM2, Llama-3.2-1B shapes, and a tiny one.

`llama-1b` is a directory of seeded random BF16 weights with Llama 3.2 1B's config and
tokenizer (tests.random_llama): the compute is the real model's. `tiny` is the tests' tiny
random model (tests.random_llama.TINY_OVERRIDES, a bytes tokenizer) with room for 4,096
positions, for checking a benchmark on a CPU with the NumPy backend. Each is generated once
into the tinyvllm cache (TINYVLLM_CACHE).
"""

from pathlib import Path

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm.model.default_model import default_model_dir
from tinyvllm.model.hub import cache_dir

MODELS = ("smollm2", "llama-1b")  # what bench_decode measures by default
TINY_MAX_POSITIONS = 4096


def model_dir(name: str) -> Path:
    if name == "smollm2":
        return default_model_dir()
    if name == "llama-1b":
        target = cache_dir() / "llama-3.2-1b-random"
        if not (target / "model.safetensors").exists():
            make_random_llama_dir(target, seed=0)
        return target
    if name == "tiny":
        target = cache_dir() / "tiny-random-llama"
        if not (target / "model.safetensors").exists():
            overrides = {**TINY_OVERRIDES, "max_position_embeddings": TINY_MAX_POSITIONS}
            make_random_llama_dir(target, config_overrides=overrides, tokenizer="bytes", seed=0)
        return target
    return Path(name)
