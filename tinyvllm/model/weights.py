"""Checkpoint weights: safetensors files -> host arrays of bf16 bits, checked against the config.

A safetensors file is three parts:

    [8 bytes: N, little-endian u64] [N bytes: JSON header] [data]

The header maps each tensor name to {"dtype": "BF16", "shape": [rows, cols],
"data_offsets": [begin, end]}, offsets counted from the start of the data; an optional
"__metadata__" entry maps strings to strings. Data is little-endian and row-major. A large
checkpoint is split into shards named by `model.safetensors.index.json` ({"weight_map":
{tensor name: shard file}}).

This module parses the format itself rather than through the `safetensors` package, for
three reasons: every malformed file gets an error naming the file and the tensor (header
length past the end, header not a JSON object, unknown dtype, a shape that disagrees with
its byte span, offsets outside the data or overlapping); BF16 tensors come back as
zero-copy `uint16` views of a memory map (NumPy has no bfloat16, and `safetensors.numpy`
needs `ml_dtypes` for it); and the writer can store `uint16` arrays as BF16, which
`safetensors.numpy.save_file` cannot (it writes them as U16). Nothing is ever unpickled.

`load_weights` returns exactly the tensors a Llama of the given config needs, as bf16
bits: BF16 as stored, F16 and F32 rounded to nearest even. Tensors the model does not use
are left unread and listed in `Weights.unexpected`; a `WeightsWarning` names them, except
the ones known to be harmless: the `rotary_emb.inv_freq` buffers old HF checkpoints carry
(recomputed from the config) and `lm_head.weight` when the config ties it to the embeddings.
"""

import json
import math
import mmap
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyvllm.kernels.reference import to_bf16
from tinyvllm.model.config import ModelConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
HEADER_LENGTH_BYTES = 8
HEADER_ALIGNMENT = 8

DTYPE_SIZES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "U16": 2,
    "I16": 2,
    "F16": 2,
    "BF16": 2,
    "U32": 4,
    "I32": 4,
    "F32": 4,
    "U64": 8,
    "I64": 8,
    "F64": 8,
    "C64": 8,
}
FLOAT_DTYPES = {"BF16": np.dtype("<u2"), "F16": np.dtype("<f2"), "F32": np.dtype("<f4")}
WRITE_DTYPES = {np.dtype(np.uint16): "BF16", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
HARMLESS_SUFFIX = ".rotary_emb.inv_freq"


class WeightsError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and, where one is at fault, the tensor."""


class WeightsWarning(UserWarning):
    """The checkpoint holds tensors the model does not use."""


@dataclass(frozen=True)
class TensorInfo:
    """One header entry; `start` and `end` are absolute byte offsets in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


class Weights(dict):
    """name -> uint16 bf16 array; `unexpected` lists the checkpoint's tensors that were not loaded."""

    def __init__(self, tensors: dict[str, np.ndarray], unexpected: tuple[str, ...]):
        super().__init__(tensors)
        self.unexpected = unexpected


# --8<-- [start:read-header]
def read_header(path: str | Path) -> dict[str, TensorInfo]:
    """Parse and validate a safetensors header: every entry's dtype, shape, span and offsets."""
    path = Path(path)
    file_size = path.stat().st_size
    if file_size < HEADER_LENGTH_BYTES:
        raise WeightsError(f"{path}: {file_size} bytes is too short to hold the 8-byte header length")
    with open(path, "rb") as file:
        header_length = int.from_bytes(file.read(HEADER_LENGTH_BYTES), "little")
        if header_length > file_size - HEADER_LENGTH_BYTES:
            raise WeightsError(
                f"{path}: header length {header_length} runs past the end of the file ({file_size} bytes)"
            )
        header_bytes = file.read(header_length)
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WeightsError(f"{path}: header is not valid JSON ({error})") from None
    if not isinstance(header, dict):
        raise WeightsError(f"{path}: header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise WeightsError(f"{path}: __metadata__ must map strings to strings")
    data_start = HEADER_LENGTH_BYTES + header_length
    tensors = {name: _tensor_info(path, name, entry, data_start, file_size) for name, entry in header.items()}
    _check_no_overlap(path, tensors.values())
    return tensors


def _tensor_info(path: Path, name: str, entry, data_start: int, file_size: int) -> TensorInfo:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= entry.keys():
        raise WeightsError(f"{path}: tensor {name!r}: entry must be an object with dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise WeightsError(f"{path}: tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(_is_index(d) for d in shape):
        raise WeightsError(f"{path}: tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_index(o) for o in offsets)):
        raise WeightsError(f"{path}: tensor {name!r}: data_offsets {offsets!r} is not a pair of non-negative integers")
    begin, end = offsets
    if begin > end:
        raise WeightsError(f"{path}: tensor {name!r}: data_offsets {offsets} end before they begin")
    needed = DTYPE_SIZES[dtype] * math.prod(shape)
    if end - begin != needed:
        raise WeightsError(
            f"{path}: tensor {name!r}: shape {shape} of {dtype} needs {needed} bytes "
            f"but data_offsets span {end - begin}"
        )
    if data_start + end > file_size:
        raise WeightsError(
            f"{path}: tensor {name!r}: data_offsets {offsets} run past the end of the file "
            f"(the data holds {file_size - data_start} bytes)"
        )
    return TensorInfo(name, dtype, tuple(shape), data_start + begin, data_start + end)


# --8<-- [end:read-header]


def _is_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_no_overlap(path: Path, tensors) -> None:
    spans = sorted((t for t in tensors if t.end > t.start), key=lambda t: t.start)
    for previous, current in zip(spans, spans[1:]):
        if current.start < previous.end:
            raise WeightsError(
                f"{path}: tensors {previous.name!r} and {current.name!r} overlap "
                f"(bytes {previous.start}-{previous.end} and {current.start}-{current.end} of the file)"
            )


def _map_file(path: Path) -> mmap.mmap:
    with open(path, "rb") as file:
        return mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)


def _view(mapping: mmap.mmap, info: TensorInfo, path: Path) -> np.ndarray:
    """A read-only array over the tensor's bytes (BF16 as uint16); no copy."""
    if info.dtype not in FLOAT_DTYPES:
        raise WeightsError(f"{path}: tensor {info.name!r} has dtype {info.dtype}; expected one of BF16, F16, F32")
    dtype = FLOAT_DTYPES[info.dtype]
    count = (info.end - info.start) // dtype.itemsize
    return np.frombuffer(mapping, dtype=dtype, count=count, offset=info.start).reshape(info.shape)


def read_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of one file as a memory-mapped view in its stored dtype (BF16 as uint16).

    Tensors must be BF16, F16 or F32. The views stay valid after the file is closed.
    """
    path = Path(path)
    header = read_header(path)
    mapping = _map_file(path)
    return {name: _view(mapping, info, path) for name, info in header.items()}


# --8<-- [start:save]
def save_safetensors(path: str | Path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` as one safetensors file: uint16 as BF16, float16 as F16, float32 as F32.

    `metadata` defaults to {"format": "pt"}, which transformers requires to load the file.
    The header is padded with spaces to a multiple of 8 bytes so every tensor starts aligned.
    """
    path = Path(path)
    arrays = {}
    for name, array in tensors.items():
        array = np.asarray(array)
        if array.dtype.newbyteorder("=") not in WRITE_DTYPES:
            raise WeightsError(f"{path}: tensor {name!r}: cannot write {array.dtype} (uint16 bf16, float16, float32)")
        arrays[name] = array.astype(array.dtype.newbyteorder("<"), order="C", copy=False)
    # Wider dtypes first, as the safetensors library does, so every tensor's data is aligned to its itemsize.
    order = sorted(arrays, key=lambda name: -arrays[name].itemsize)
    header: dict[str, dict] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name in order:
        array = arrays[name]
        header[name] = {
            "dtype": WRITE_DTYPES[array.dtype.newbyteorder("=")],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + array.nbytes],
        }
        offset += array.nbytes
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-(HEADER_LENGTH_BYTES + len(header_bytes)) % HEADER_ALIGNMENT)
    with open(path, "wb") as file:
        file.write(len(header_bytes).to_bytes(HEADER_LENGTH_BYTES, "little"))
        file.write(header_bytes)
        for name in order:
            file.write(arrays[name].reshape(-1).view(np.uint8).data)


# --8<-- [end:save]


# --8<-- [start:weight-shapes]
def weight_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The tensors a Llama of this config loads, with their HF shapes ([out_features, in_features])."""
    hidden, inter = config.hidden_size, config.intermediate_size
    shapes = {"model.embed_tokens.weight": (config.vocab_size, hidden)}
    for i in range(config.num_hidden_layers):
        layer = f"model.layers.{i}"
        shapes[f"{layer}.input_layernorm.weight"] = (hidden,)
        shapes[f"{layer}.self_attn.q_proj.weight"] = (config.q_size, hidden)
        shapes[f"{layer}.self_attn.k_proj.weight"] = (config.kv_size, hidden)
        shapes[f"{layer}.self_attn.v_proj.weight"] = (config.kv_size, hidden)
        shapes[f"{layer}.self_attn.o_proj.weight"] = (hidden, config.q_size)
        shapes[f"{layer}.post_attention_layernorm.weight"] = (hidden,)
        shapes[f"{layer}.mlp.gate_proj.weight"] = (inter, hidden)
        shapes[f"{layer}.mlp.up_proj.weight"] = (inter, hidden)
        shapes[f"{layer}.mlp.down_proj.weight"] = (hidden, inter)
    shapes["model.norm.weight"] = (hidden,)
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    return shapes


# --8<-- [end:weight-shapes]


# --8<-- [start:load]
def load_weights(model_dir: str | Path, config: ModelConfig) -> Weights:
    """The model's tensors from `model.safetensors` or a sharded index, as uint16 bf16 arrays.

    BF16 tensors are read-only views of the memory-mapped files (no copy); F16 and F32
    ones are converted (a new array each). Raises WeightsError on a missing tensor, a wrong
    shape or dtype, or a malformed file.
    """
    model_dir = Path(model_dir)
    files, index, source = _checkpoint_files(model_dir)
    headers = {path: read_header(path) for path in files}
    present = {name: path for path, header in headers.items() for name in header}
    locations = present if index is None else index
    mappings = {path: _map_file(path) for path in files}
    tensors = {}
    for name, shape in weight_shapes(config).items():
        if name not in locations:
            raise WeightsError(f"{source}: tensor {name!r} is missing")
        path = locations[name]
        info = headers[path].get(name)
        if info is None:
            raise WeightsError(f"{path}: tensor {name!r} is missing (the index {source.name} places it here)")
        if info.shape != shape:
            raise WeightsError(f"{path}: tensor {name!r} has shape {info.shape}, the config expects {shape}")
        array = _view(mappings[path], info, path)
        tensors[name] = array if info.dtype == "BF16" else to_bf16(array)
    unexpected = tuple(sorted(name for name in present if name not in tensors))
    _warn_unexpected(unexpected, present, config)
    return Weights(tensors, unexpected)


# --8<-- [end:load]


def _checkpoint_files(model_dir: Path) -> tuple[list[Path], dict[str, Path] | None, Path]:
    """The safetensors files, the index's tensor -> file map (None for a single file), and the file naming them."""
    single = model_dir / SINGLE_FILE
    if single.exists():
        return [single], None, single
    index = model_dir / INDEX_FILE
    if not index.exists():
        raise WeightsError(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE} is there")
    try:
        parsed = json.loads(index.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise WeightsError(f"{index}: not valid JSON ({error})") from None
    weight_map = parsed.get("weight_map") if isinstance(parsed, dict) else None
    shards = weight_map.values() if isinstance(weight_map, dict) else [None]
    if not all(isinstance(shard, str) and Path(shard).name == shard for shard in shards):
        raise WeightsError(f"{index}: weight_map must map tensor names to shard file names in {model_dir}")
    locations = {name: model_dir / shard for name, shard in weight_map.items()}
    for name, path in locations.items():
        if not path.is_file():
            raise WeightsError(f"{index}: shard {path.name} (holding tensor {name!r}) is not in {model_dir}")
    return list(dict.fromkeys(locations.values())), locations, index


def _warn_unexpected(unexpected: tuple[str, ...], present: dict[str, Path], config: ModelConfig) -> None:
    def harmless(name: str) -> bool:
        return name.endswith(HARMLESS_SUFFIX) or (name == "lm_head.weight" and config.tie_word_embeddings)

    noted = [f"{present[name]}: {name!r}" for name in unexpected if not harmless(name)]
    if noted:
        message = f"tensors the model does not use were not loaded: {', '.join(noted)}"
        warnings.warn(message, WeightsWarning, stacklevel=3)
