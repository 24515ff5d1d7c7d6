"""Every GGML block format tinyvllm reads, against `gguf.quants.dequantize` (llama.cpp's own
Python reference): on random blocks, on every bit pattern, and read back from files that
`gguf.GGUFWriter` wrote. Also the helpers the other GGUF tests use to make blocks."""

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, GGUFWriter
from gguf import GGMLQuantizationType as GGMLType
from gguf import quants as gguf_quants
from hypothesis import given
from hypothesis import strategies as st

from tinyvllm.model.gguf.check import open_gguf
from tinyvllm.model.gguf.format import SUPPORTED_TYPES, dequantize
from tinyvllm.model.gguf.quants import BLOCK_FORMATS

NEW_TYPES = [GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]
K_QUANTS = [GGMLType.Q2_K, GGMLType.Q3_K, GGMLType.Q4_K, GGMLType.Q5_K, GGMLType.Q6_K]
# Where each format keeps its f16 block scales (d, dmin), and the largest |integer scale * value|
# they multiply: setting d to about 0.05 / that gives weights of a trained model's size.
F16_SCALES = {
    GGMLType.Q2_K: ((80, 82), 15 * 3),
    GGMLType.Q3_K: ((108,), 32 * 4),
    GGMLType.Q4_K: ((0, 2), 63 * 15),
    GGMLType.Q5_K: ((0, 2), 63 * 31),
    GGMLType.Q6_K: ((208,), 128 * 32),
    GGMLType.IQ4_NL: ((0,), 127),
}


def random_blocks(rng: np.random.Generator, shape: tuple[int, ...], tensor_type: GGMLType) -> np.ndarray:
    """Random uint8 rows of `tensor_type` blocks for a float tensor of `shape`, with finite, model-sized scales."""
    elements, block_bytes = GGML_QUANT_SIZES[tensor_type]
    rows = rng.integers(0, 256, (*shape[:-1], shape[-1] // elements, block_bytes), dtype=np.uint8)
    offsets, largest = F16_SCALES[tensor_type]
    for offset in offsets:
        scale = (rng.uniform(0.5, 1.0, rows.shape[:-1]) * 0.05 / largest).astype(np.float16)
        rows[..., offset : offset + 2] = scale[..., None].view(np.uint8).reshape(*rows.shape[:-1], 2)
    return rows.reshape(*shape[:-1], -1)


def quantize_or_random(rng: np.random.Generator, values: np.ndarray, tensor_type: GGMLType) -> np.ndarray:
    """`gguf.quants.quantize` where gguf-py has a quantizer; random blocks for the K-quants, which it lacks."""
    if tensor_type in F16_SCALES:
        return random_blocks(rng, values.shape, tensor_type)
    return gguf_quants.quantize(values, tensor_type)


def test_every_new_type_is_supported():
    assert set(NEW_TYPES) <= set(SUPPORTED_TYPES)
    for tensor_type, block in BLOCK_FORMATS.items():
        assert (block.elements, block.block_bytes) == GGML_QUANT_SIZES[tensor_type], tensor_type.name


@given(
    tensor_type=st.sampled_from(NEW_TYPES),
    rows=st.integers(1, 3),
    blocks=st.integers(1, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_random_blocks_match_gguf_reference(tensor_type, rows, blocks, seed):
    """Every bit pattern, not only what a quantizer writes: all scales (inf/nan included), signs and bits."""
    block_bytes = GGML_QUANT_SIZES[tensor_type][1]
    stored = np.random.default_rng(seed).integers(0, 256, (rows, block_bytes * blocks), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        np.testing.assert_array_equal(dequantize(stored, tensor_type), gguf_quants.dequantize(stored, tensor_type))


@given(
    tensor_type=st.sampled_from([GGMLType.Q5_0, GGMLType.Q5_1]),
    log_scale=st.floats(-8, 8),
    seed=st.integers(0, 2**32 - 1),
)
def test_quantized_values_match_gguf_reference(tensor_type, log_scale, seed):
    """What gguf-py's own quantizer writes (it has none for the K-quants), and close to the values quantized."""
    values = (np.random.default_rng(seed).standard_normal((3, 64)) * 2.0**log_scale).astype(np.float32)
    stored = gguf_quants.quantize(values, tensor_type)
    ours = dequantize(stored, tensor_type)
    np.testing.assert_array_equal(ours, gguf_quants.dequantize(stored, tensor_type))
    step = np.abs(values).max() / 15  # a 5-bit step of the widest block, at most
    assert np.abs(ours - values).max() <= step


@pytest.mark.parametrize("tensor_type", K_QUANTS)
def test_model_sized_blocks_are_finite_and_nonzero(tensor_type):
    """The helper's blocks decode to weights of a model's size (what the conversion tests rely on)."""
    stored = random_blocks(np.random.default_rng(3), (4, 512), tensor_type)
    values = dequantize(stored, tensor_type)
    assert values.shape == (4, 512) and np.all(np.isfinite(values))
    assert 1e-3 < np.abs(values).mean() < 0.2


def test_gguf_writer_file_reads_back_every_type(tmp_path):
    """One tensor of each supported block type written by GGUFWriter; read back through open_gguf."""
    rng = np.random.default_rng(4)
    written = {}
    writer = GGUFWriter(str(tmp_path / "types.gguf"), "llama")
    for tensor_type in BLOCK_FORMATS:
        shape = (3, 512)
        stored = quantize_or_random(rng, rng.standard_normal(shape).astype(np.float32), tensor_type)
        writer.add_tensor(tensor_type.name, stored, raw_dtype=tensor_type)
        written[tensor_type.name] = (tensor_type, stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    reader = open_gguf(tmp_path / "types.gguf")
    assert {tensor.name for tensor in reader.tensors} == set(written)
    for tensor in reader.tensors:
        tensor_type, stored = written[tensor.name]
        assert tensor.tensor_type == tensor_type
        expected = gguf_quants.dequantize(stored, tensor_type)
        assert expected.shape == (3, 512)
        np.testing.assert_array_equal(dequantize(tensor.data, tensor.tensor_type), expected, err_msg=tensor.name)
    assert len(GGUFReader(tmp_path / "types.gguf").tensors) == len(written)
