"""EngineConfig: every engine option, its default, its check and its command-line help, once.

`LLM(model, **kwargs)`, `LLMEngine(model, **kwargs)` and the `tinyvllm` command's engine
flags are all this dataclass: each field's metadata carries the flag's help text (and its
choices), so a new option is one field. Every value is checked when the config is built,
and a bad one raises a ValueError that names it, before any weight is loaded.

Two defaults depend on the model: `max_model_len` (the model's max_position_embeddings,
at most DEFAULT_MAX_MODEL_LEN) and `max_num_batched_tokens` (on the GPU max_model_len, at
least MIN_BATCHED_TOKENS; on the NumPy backend NUMPY_BATCHED_TOKENS, so that a long prompt
is prefilled in chunks of seconds each and a server's other requests get steps in between).
`resolve` fills them in against the ModelConfig once; the scheduler and the model runner
read the `ResolvedEngineConfig` it returns.

This module imports neither Numba nor the engine, so the command line can build its
parser from it without paying for them.
"""

import types
from dataclasses import Field, dataclass, field, fields
from typing import Any, get_args

from tinyvllm.hardware import has_cuda_gpu
from tinyvllm.model.config import ModelConfig

MODES = ("continuous", "static")
BACKENDS = ("auto", "cuda", "numpy")
LINEAR_BACKENDS = ("auto", "numba", "cublas", "tiled", "gemv")
"""The `linear_backend` choices; the variant table (backends/variants.py) maps each to a product kernel."""
ACTIVATION_DTYPES = ("bf16", "float32")
DTYPES = ("auto", "bfloat16")
"""vLLM's `dtype`: the kernels compute in bfloat16 only, so `auto` means it too."""
DEFAULT_MAX_MODEL_LEN = 8192
MIN_BATCHED_TOKENS = 8192
"""On the GPU, the default token budget of a step is never below this: vLLM's default for its
server on GPUs of 70 GiB and more (16,384 for its LLM class there), and for its LLM class on
smaller ones. A step's kernel launches cost the host about the same whatever its token count,
so a budget of 4,096 left an H200's prefill waiting on Python."""
NUMPY_BATCHED_TOKENS = 256
"""The NumPy backend's default token budget: a few seconds of prefill on two CPU cores
(an 8,190-token prompt in one step held a server for 13 minutes)."""


def option(default: Any, help: str, *, choices: tuple[str, ...] | None = None, minimum: int | None = None) -> Any:
    """A config field whose metadata is its command-line help (and its flag's choices, or
    the least number it takes; without one it takes any positive number)."""
    return field(default=default, metadata={"help": help, "choices": choices, "minimum": minimum})


# --8<-- [start:engine-args]
@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The engine's options, by the names `LLM(model, **kwargs)` takes (vLLM's where it has one).

    Attributes:
        mode: the batching policy, "continuous" (the batch re-formed every step) or "static".
        backend: where the operators run: "cuda", "numpy", or "auto" (cuda if a GPU is present).
        block_size: tokens per KV-cache block, a power of two.
        gpu_memory_utilization: the fraction of the GPU's memory the engine may hold, in (0, 1].
        num_blocks: KV-cache blocks; None sizes the cache from the memory free after a warm-up.
        max_num_seqs: the most sequences in one batch.
        max_num_batched_tokens: the most tokens one step computes; None: on the GPU
            max_model_len, at least MIN_BATCHED_TOKENS; on the NumPy backend NUMPY_BATCHED_TOKENS.
        max_model_len: the longest prompt plus output, in tokens; None: the model's
            max_position_embeddings, at most DEFAULT_MAX_MODEL_LEN.
        linear_backend: with the cuda backend, which kernels run the matrix products (one of
            LINEAR_BACKENDS; "auto" picks by the step's shape).
        enforce_eager: run every step eagerly, capturing no CUDA graphs.
        enable_prefix_caching: reuse the KV blocks of prompt prefixes computed before.
        disable_cascade_attn: vLLM's option. False (the default here; vLLM 0.26 defaults to
            True, for caution): the variant table may have decode attention read a prefix that
            many decode sequences share once for all of them (cascade attention), which it
            chooses only where it was measured to win, from 192 sequences sharing 256 tokens
            (backends/variants.py); it moves tokens only at near-ties. True: each decode
            sequence reads its whole context.
        activation_dtype: with the numpy backend, how activations are stored: "bf16" or "float32".
        cpu_kv_cache_gib: with the numpy backend, the KV cache's size in GiB of host memory.
        dtype: the dtype of weights and activations, vLLM's option: "bfloat16", the only one
            the kernels compute in, or "auto", which is the same.
        seed: the seed from which requests that give none draw theirs, so that a run repeats
            itself; None: each such request gets a random seed.
    """

    mode: str = option("continuous", "batching policy", choices=MODES)
    backend: str = option("auto", "cuda, numpy, or auto (cuda if a GPU is present)", choices=BACKENDS)
    block_size: int = option(16, "tokens per KV-cache block, a power of two")
    gpu_memory_utilization: float = option(0.9, "fraction of the GPU's memory the engine may hold")
    num_blocks: int | None = option(None, "KV-cache blocks (default: sized from free memory)")
    max_num_seqs: int = option(256, "most sequences in one batch")
    max_num_batched_tokens: int | None = option(
        None,
        f"most tokens in one step (default: cuda max_model_len, at least {MIN_BATCHED_TOKENS}; "
        f"numpy {NUMPY_BATCHED_TOKENS})",
    )
    max_model_len: int | None = option(
        None, f"longest prompt + output, in tokens (default: the model's, at most {DEFAULT_MAX_MODEL_LEN})"
    )
    linear_backend: str = option("auto", "cuda: the matrix-product kernels", choices=LINEAR_BACKENDS)
    enforce_eager: bool = option(False, "no CUDA graphs")
    enable_prefix_caching: bool = option(True, "reuse the KV blocks of prompt prefixes seen before")
    disable_cascade_attn: bool = option(
        False, "cuda: decode reads a prefix many sequences share once per sequence, never once for all"
    )
    activation_dtype: str = option("float32", "numpy: how activations are stored", choices=ACTIVATION_DTYPES)
    cpu_kv_cache_gib: float = option(1.0, "numpy: KV-cache size in GiB of host memory")
    dtype: str = option(
        "auto", "dtype of weights and activations: bfloat16, the one the kernels take (auto is it)", choices=DTYPES
    )
    seed: int | None = option(None, "seed of the requests that give none, for reproducible runs", minimum=0)
    # --8<-- [end:engine-args]

    def __post_init__(self) -> None:
        for spec in fields(EngineConfig):
            value = getattr(self, spec.name)
            if value is None and spec.default is None:
                continue
            choices = spec.metadata["choices"]
            if choices is not None and value not in choices:
                raise ValueError(f"{spec.name}: expected one of {choices}, got {value!r}")
            if choices is None:
                _check_value(spec, value)
        if self.block_size & (self.block_size - 1):
            # The attention kernels split a position into block and row with a shift and a mask.
            raise ValueError(f"block_size: must be a power of two, got {self.block_size}")
        if self.gpu_memory_utilization > 1:
            raise ValueError(f"gpu_memory_utilization: must be in (0, 1], got {self.gpu_memory_utilization}")

    def resolve(self, model: ModelConfig) -> "ResolvedEngineConfig":
        """This config with the model-dependent defaults filled in and checked against `model`.

        Args:
            model: the model's config (its max_position_embeddings bounds max_model_len).
        """
        limit = model.max_position_embeddings
        max_model_len = self.max_model_len or min(limit, DEFAULT_MAX_MODEL_LEN)
        if max_model_len > limit:
            raise ValueError(f"max_model_len: {max_model_len} exceeds the model's max_position_embeddings {limit}")
        on_gpu = self.backend == "cuda" or (self.backend == "auto" and has_cuda_gpu())
        default_budget = max(max_model_len, MIN_BATCHED_TOKENS) if on_gpu else NUMPY_BATCHED_TOKENS
        max_num_batched_tokens = self.max_num_batched_tokens or default_budget
        options = {spec.name: getattr(self, spec.name) for spec in fields(EngineConfig)}
        options.update(max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens)
        return ResolvedEngineConfig(**options)


@dataclass(frozen=True, kw_only=True)
class ResolvedEngineConfig(EngineConfig):
    """An EngineConfig whose model-dependent options are set: what the scheduler and runner read."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_model_len", "max_num_batched_tokens"):
            if getattr(self, name) is None:
                raise ValueError(f"{name}: a resolved config needs a value (EngineConfig.resolve gives one)")

    @property
    def max_blocks_per_seq(self) -> int:
        """The width of a block table: blocks for max_model_len tokens."""
        return -(-self.max_model_len // self.block_size)


def option_type(spec: Field) -> type:
    """The type an option's value has when it is given: `int` for `int | None`."""
    if isinstance(spec.type, types.UnionType):
        (kind,) = (arg for arg in get_args(spec.type) if arg is not type(None))
        return kind
    return spec.type


def _check_value(spec: Field, value: Any) -> None:
    """The value is of the option's type (an int where an int is due, never a bool) and at
    least the option's minimum (positive, unless it says otherwise)."""
    kind = option_type(spec)
    if kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{spec.name}: expected True or False, got {value!r}")
        return
    allowed = (int, float) if kind is float else (int,)
    minimum = spec.metadata["minimum"]
    numeric = isinstance(value, allowed) and not isinstance(value, bool)
    if not numeric or not (value > 0 if minimum is None else value >= minimum):
        noun = "number" if kind is float else "integer"
        wanted = f"a positive {noun}" if minimum is None else f"an {noun} >= {minimum}"
        raise ValueError(f"{spec.name}: must be {wanted}, got {value!r}")
