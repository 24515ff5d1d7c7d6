"""The model's shape, read from a Hugging Face model directory.

`config.json` describes a `LlamaForCausalLM`: sizes, grouped-query attention (GQA: several
query heads share one key/value head), RoPE's base frequency and its optional "llama3"
rescaling, whether the LM head is the embedding table (tied), and the end-of-sequence ids.
`generation_config.json`, when present, carries the sampling defaults the model was
released with.

Optional keys default as transformers' `LlamaConfig` does. Anything this engine would
compute differently from the model it describes is refused with a `ConfigError` that names
the key: biases, another activation, another architecture or RoPE scaling type.

RoPE settings sit in one of two places: transformers 4.x writes `rope_theta` and
`rope_scaling` at the top level; 5.x writes both into `rope_parameters`
(`rope_type: "default"` meaning no scaling). Both are read, and `rope_scaling` comes out
as None or one normalized dict, {"rope_type": "llama3", "factor", "low_freq_factor",
"high_freq_factor", "original_max_position_embeddings"}, which is what
`tinyvllm.model.rope.rope_inv_freq` takes.
"""

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_ARCHITECTURE = "LlamaForCausalLM"
DEFAULT_ROPE_THETA = 10000.0


class ConfigError(ValueError):
    """A config this engine cannot run; the message names the file and the key."""


@dataclass(frozen=True)
class GenerationDefaults:
    """`generation_config.json`: the sampling settings the model ships with (None: not given)."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    do_sample: bool | None = None
    eos_token_id: tuple[int, ...] = ()


@dataclass(frozen=True)
class ModelConfig:
    """A validated Llama config; build it with `ModelConfig.from_dir(path)` or `load_config(path)`."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # None or the normalized llama3 dict (module docstring)
    tie_word_embeddings: bool
    max_position_embeddings: int
    bos_token_id: int | None
    eos_token_id: tuple[int, ...]
    dtype: str | None
    generation: GenerationDefaults = field(default_factory=GenerationDefaults)

    @classmethod
    def from_dir(cls, path: str | Path) -> "ModelConfig":
        """Read `config.json` (and `generation_config.json` if present) from a model directory."""
        path = Path(path)
        raw = _read_json(path / "config.json")
        generation_path = path / "generation_config.json"
        generation = GenerationDefaults()
        if generation_path.exists():
            generation = _generation_defaults(_read_json(generation_path), generation_path)
        return cls.from_dict(raw, generation=generation, source=str(path / "config.json"))

    @classmethod
    def from_dict(
        cls, raw: dict, generation: GenerationDefaults | None = None, source: str = "config.json"
    ) -> "ModelConfig":
        """Validate a parsed `config.json`; `source` names it in error messages."""
        keys = _Keys(raw, source)
        _check_supported(keys)
        hidden_size = keys.integer("hidden_size")
        num_heads = keys.integer("num_attention_heads")
        num_kv_heads = keys.integer("num_key_value_heads", num_heads)
        if num_heads % num_kv_heads:
            raise ConfigError(
                f"{source}: num_attention_heads ({num_heads}) is not a multiple of num_key_value_heads ({num_kv_heads})"
            )
        if raw.get("head_dim") is None and hidden_size % num_heads:
            raise ConfigError(
                f"{source}: head_dim is missing and hidden_size ({hidden_size}) is not a multiple of "
                f"num_attention_heads ({num_heads})"
            )
        head_dim = keys.integer("head_dim", hidden_size // num_heads)
        if head_dim % 2:
            raise ConfigError(f"{source}: head_dim ({head_dim}) must be even for RoPE")
        rope_theta, rope_scaling = _rope(keys)
        # An explicit null bos/eos means "none" (as in transformers); only an absent key takes the default.
        default_bos = 1 if "bos_token_id" not in raw else None
        default_eos = 2 if "eos_token_id" not in raw else None
        return cls(
            hidden_size=hidden_size,
            num_hidden_layers=keys.integer("num_hidden_layers"),
            num_attention_heads=num_heads,
            num_key_value_heads=num_kv_heads,
            head_dim=head_dim,
            intermediate_size=keys.integer("intermediate_size"),
            vocab_size=keys.integer("vocab_size"),
            rms_norm_eps=keys.number("rms_norm_eps", 1e-6),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_word_embeddings=keys.boolean("tie_word_embeddings", False),
            max_position_embeddings=keys.integer("max_position_embeddings", 2048),
            bos_token_id=keys.integer("bos_token_id", default_bos, minimum=0),
            eos_token_id=keys.token_ids("eos_token_id", default_eos),
            dtype=keys.string("dtype", keys.string("torch_dtype", None)),
            generation=generation or GenerationDefaults(),
        )

    @property
    def q_size(self) -> int:
        """Width of the query projection's output: all query heads side by side."""
        return self.num_attention_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        """Width of the key (or value) projection's output."""
        return self.num_key_value_heads * self.head_dim

    @property
    def num_kv_groups(self) -> int:
        """Query heads per key/value head."""
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def num_parameters(self) -> int:
        """Parameters stored in the checkpoint (the tied LM head counted once)."""
        attention = self.hidden_size * (2 * self.q_size + 2 * self.kv_size)
        mlp = 3 * self.hidden_size * self.intermediate_size
        layer = attention + mlp + 2 * self.hidden_size
        embeddings = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
        return self.num_hidden_layers * layer + embeddings + self.hidden_size

    @property
    def stop_token_ids(self) -> tuple[int, ...]:
        """Every id that ends generation: the config's and the generation config's, in order, deduplicated."""
        return tuple(dict.fromkeys(self.eos_token_id + self.generation.eos_token_id))


def load_config(path: str | Path) -> ModelConfig:
    """`ModelConfig.from_dir`: the config of the model directory at `path`."""
    return ModelConfig.from_dir(path)


class _Keys:
    """Typed reads from one parsed JSON object, each error naming the source and the key.

    A key that is absent or null takes `default`; `REQUIRED` as the default makes it an error.
    """

    REQUIRED = object()

    def __init__(self, raw: dict, source: str):
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a JSON object, got {type(raw).__name__}")
        self.raw = raw
        self.source = source

    def fail(self, key: str, problem: str):
        raise ConfigError(f"{self.source}: {key} {problem} (got {self.raw.get(key)!r})")

    def _get(self, key: str, default):
        value = self.raw.get(key)
        if value is not None:
            return value
        if default is self.REQUIRED:
            raise ConfigError(f"{self.source}: missing required key {key!r}")
        return default

    def integer(self, key: str, default=REQUIRED, minimum: int = 1) -> int | None:
        value = self._get(key, default)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < minimum):
            self.fail(key, f"must be an integer >= {minimum}")
        return value

    def number(
        self, key: str, default, low: float = 0.0, high: float = math.inf, low_inclusive: bool = False
    ) -> float | None:
        value = self._get(key, default)
        if value is None:
            return None
        is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not is_number or not ((value >= low if low_inclusive else value > low) and value <= high):
            self.fail(key, f"must be a number in {'[' if low_inclusive else '('}{low}, {high}]")
        return float(value)

    def boolean(self, key: str, default: bool | None) -> bool | None:
        value = self._get(key, default)
        if value is not None and not isinstance(value, bool):
            self.fail(key, "must be true or false")
        return value

    def string(self, key: str, default: str | None) -> str | None:
        value = self._get(key, default)
        if value is not None and not isinstance(value, str):
            self.fail(key, "must be a string")
        return value

    def token_ids(self, key: str, default: int | None) -> tuple[int, ...]:
        """An id or a list of ids (eos_token_id comes both ways) -> a tuple."""
        value = self._get(key, default)
        values = [] if value is None else value if isinstance(value, list) else [value]
        if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in values):
            self.fail(key, "must be a token id or a list of token ids")
        return tuple(values)


def _check_supported(keys: _Keys) -> None:
    raw = keys.raw
    architectures = raw.get("architectures")
    if architectures is None:
        if raw.get("model_type") != "llama":
            keys.fail("model_type", "must be 'llama' when architectures is absent")
    elif architectures != [SUPPORTED_ARCHITECTURE]:
        keys.fail("architectures", f"must be [{SUPPORTED_ARCHITECTURE!r}]")
    if raw.get("attention_bias", False):
        keys.fail("attention_bias", "is not supported (Llama projections have no bias)")
    if raw.get("mlp_bias", False):
        keys.fail("mlp_bias", "is not supported (Llama projections have no bias)")
    if raw.get("hidden_act", "silu") != "silu":
        keys.fail("hidden_act", "must be 'silu'")


def _rope(keys: _Keys) -> tuple[float, dict | None]:
    parameters = keys.raw.get("rope_parameters") or {}
    if not isinstance(parameters, dict):
        keys.fail("rope_parameters", "must be an object")
    theta = keys.number("rope_theta", parameters.get("rope_theta", DEFAULT_ROPE_THETA))
    scaling = keys.raw.get("rope_scaling")
    if scaling is None and parameters.get("rope_type", parameters.get("type", "default")) != "default":
        scaling = parameters
    if scaling is None:
        return theta, None
    if not isinstance(scaling, dict):
        keys.fail("rope_scaling", "must be an object or null")
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise ConfigError(f"{keys.source}: rope_scaling type {rope_type!r} is not supported (only 'llama3')")
    scaling_keys = _Keys(scaling, f"{keys.source}: rope_scaling")
    result = {
        "rope_type": "llama3",
        "factor": scaling_keys.number("factor", _Keys.REQUIRED),
        "low_freq_factor": scaling_keys.number("low_freq_factor", _Keys.REQUIRED),
        "high_freq_factor": scaling_keys.number("high_freq_factor", _Keys.REQUIRED),
        "original_max_position_embeddings": scaling_keys.integer("original_max_position_embeddings"),
    }
    if result["high_freq_factor"] <= result["low_freq_factor"]:
        scaling_keys.fail("high_freq_factor", "must exceed low_freq_factor")
    return theta, result


def _generation_defaults(raw: dict, path: Path) -> GenerationDefaults:
    keys = _Keys(raw, str(path))
    return GenerationDefaults(
        temperature=keys.number("temperature", None, low_inclusive=True),
        top_p=keys.number("top_p", None, high=1.0),
        top_k=keys.integer("top_k", None, minimum=0),
        max_new_tokens=keys.integer("max_new_tokens", None),
        do_sample=keys.boolean("do_sample", None),
        eos_token_id=keys.token_ids("eos_token_id", None),
    )


def _read_json(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: file not found") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path}: not valid JSON ({error})") from None
