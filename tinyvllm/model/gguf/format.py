"""Reading a GGUF file: its metadata, its tensor formats decoded with NumPy, its errors.

A GGUF file is a header of typed key/value pairs (`general.architecture`, `llama.block_count`,
`tokenizer.ggml.tokens`, ...) followed by tensors. `gguf.GGUFReader` memory-maps it; this
module turns the pairs into Python values and the tensors into float32 or BF16 arrays.

Quantized GGML tensors are rows of fixed-size blocks, decoded by `tinyvllm.model.gguf.quants`
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 and the K-quants Q2_K to Q6_K). F32, F16 and BF16 are plain
arrays. GGUFReader hands a quantized tensor over as uint8 rows of whole blocks,
[..., row_bytes]; the decoders work on all blocks at once.
"""

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as GGMLType
from gguf import GGUFReader

from tinyvllm.kernels.reference import from_bf16, to_bf16
from tinyvllm.model.gguf.quants import BLOCK_FORMATS

# Rows decoded per step in dequantize_to_bf16: bounds the float32 scratch to ~64 MB per step.
_CHUNK_ELEMENTS = 1 << 24


class GGUFError(ValueError):
    """A GGUF file tinyvllm cannot convert; the message names the file and the reason."""


def read_metadata(reader: GGUFReader) -> dict:
    """Every key/value pair of the file as Python values (strings, numbers, lists)."""
    return {name: field.contents() for name, field in reader.fields.items()}


def require(metadata: dict, key: str, source: Path | str):
    """metadata[key], or a GGUFError naming the file and the missing key."""
    if key not in metadata:
        raise GGUFError(f"{source}: metadata key {key!r} is missing")
    return metadata[key]


SUPPORTED_TYPES = (GGMLType.F32, GGMLType.F16, GGMLType.BF16, *BLOCK_FORMATS)


def dequantize(data: np.ndarray, tensor_type: GGMLType) -> np.ndarray:
    """GGUFReader's data of one tensor (any leading shape) -> float32 values, rows of elements."""
    if tensor_type == GGMLType.F32:
        return np.asarray(data, dtype=np.float32)
    if tensor_type == GGMLType.F16:
        return data.astype(np.float32)
    if tensor_type == GGMLType.BF16:
        return from_bf16(data.view(np.uint16))
    name = GGMLType(tensor_type).name
    if tensor_type not in BLOCK_FORMATS:
        raise GGUFError(f"GGML type {name} is not supported (supported: {', '.join(t.name for t in SUPPORTED_TYPES)})")
    block = BLOCK_FORMATS[tensor_type]
    if data.shape[-1] % block.block_bytes:
        raise GGUFError(f"{name} rows of {data.shape[-1]} bytes are not whole {block.block_bytes}-byte blocks")
    values = block.decode(np.ascontiguousarray(data).reshape(-1, block.block_bytes))
    return values.reshape(*data.shape[:-1], _elements_per_row(data.shape[-1], tensor_type))


def _elements_per_row(row_width: int, tensor_type: GGMLType) -> int:
    """GGUFReader gives F32/F16 rows in elements, BF16 and block formats in bytes."""
    if tensor_type in BLOCK_FORMATS:
        block = BLOCK_FORMATS[tensor_type]
        return row_width // block.block_bytes * block.elements
    return row_width // 2 if tensor_type == GGMLType.BF16 else row_width


def dequantize_to_bf16(data: np.ndarray, tensor_type: GGMLType) -> np.ndarray:
    """`dequantize`, rounded to BF16 (uint16 bits), a few rows at a time to bound the scratch memory."""
    if data.ndim == 1:
        return to_bf16(dequantize(data, tensor_type))
    rows = data.reshape(-1, data.shape[-1])
    row_elements = _elements_per_row(data.shape[-1], tensor_type)
    out = np.empty((rows.shape[0], row_elements), dtype=np.uint16)
    step = max(1, _CHUNK_ELEMENTS // row_elements)
    for start in range(0, rows.shape[0], step):
        out[start : start + step] = to_bf16(dequantize(rows[start : start + step], tensor_type))
    return out.reshape(*data.shape[:-1], row_elements)
