"""Malformed GGUF files: every one is refused with one GGUFError naming the file and the problem,
never an IndexError, a reshape ValueError or a UnicodeDecodeError from deep inside the reader,
and leaves no output directory behind.

The corpus is built from one valid tiny file: truncated at many offsets, a byte flipped at
many header offsets, and counts, lengths, dimensions and types overwritten with values that
cannot be true. Offsets come from GGUFReader's own parse of the valid file.
"""

import struct

import numpy as np
import pytest
from gguf import GGUFReader

from tests.gguf_files import write_llama_gguf
from tinyvllm.model.gguf.convert import GGUFError, convert_gguf


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    """(the valid file's bytes, GGUFReader's parse of it)."""
    path = tmp_path_factory.mktemp("valid") / "tiny.gguf"
    write_llama_gguf(path)
    return path.read_bytes(), GGUFReader(path)


def _convert(tmp_path, data: bytes, name: str = "bad.gguf"):
    """Convert `data` written as a file; returns the GGUFError (None when it converted) and checks the output."""
    source, out = tmp_path / name, tmp_path / f"{name}.hf"
    source.write_bytes(data)
    try:
        convert_gguf(source, out, progress=False)
    except GGUFError as error:
        message = str(error)
        assert message.startswith(f"{source}: ") and "\n" not in message, message
        assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
        return error
    assert (out / "model.safetensors").is_file()
    return None


def _tensor_data_end(reader: GGUFReader) -> int:
    return max(int(tensor.data_offset) + int(tensor.n_bytes) for tensor in reader.tensors)


def test_valid_file_converts(tmp_path, valid):
    data, _ = valid
    assert _convert(tmp_path, data) is None


def test_truncations_name_the_byte(tmp_path, valid):
    data, reader = valid
    header_end, data_end = reader.data_offset, _tensor_data_end(reader)
    cuts = sorted(
        {*range(40), *np.linspace(40, header_end, 40, dtype=int), *np.linspace(header_end, data_end - 1, 20, dtype=int)}
    )
    for cut in cuts:
        error = _convert(tmp_path, data[:cut])
        assert error is not None, cut
        message = str(error)
        if cut < header_end - 31:  # inside the header proper (the last bytes may be alignment padding)
            assert f"truncated at byte {cut} of " in message or "truncated: it needs" in message, (cut, message)
            assert f"byte {cut}" in message, (cut, message)
        else:
            assert "past the end of the file" in message or f"truncated at byte {cut}" in message, (cut, message)


def test_flipped_header_bytes_give_clean_errors(tmp_path, valid):
    data, reader = valid
    positions = sorted({*range(32), *np.random.default_rng(0).integers(32, reader.data_offset, 80).tolist()})
    refused = 0
    for position in positions:
        corrupt = bytearray(data)
        corrupt[position] ^= 0xFF
        refused += _convert(tmp_path, bytes(corrupt), f"flip{position}.gguf") is not None
    assert refused >= len(positions) // 2  # most flips break the structure; a flip inside a string may not


def _field_value_offset(reader: GGUFReader, key: str) -> int:
    """Byte offset of a key/value pair's value (after its key string and its u32 value type)."""
    field = reader.fields[key]
    return field.offset + 8 + len(key.encode()) + 4


def _overwritten(data: bytes, offset: int, fmt: str, value) -> bytes:
    corrupt = bytearray(data)
    struct.pack_into(fmt, corrupt, offset, value)
    return bytes(corrupt)


def _impossible_cases(data: bytes, reader: GGUFReader) -> dict[str, tuple[bytes, str]]:
    """name -> (corrupt bytes, what the error must say)."""
    tokens = _field_value_offset(reader, "tokenizer.ggml.tokens")
    tensor = reader.tensors[0].field
    name_length = len(reader.tensors[0].name.encode())
    dims_at = tensor.offset + 8 + name_length + 4
    type_at = dims_at + 8 * len(reader.tensors[0].shape)
    return {
        "magic": (b"GGML" + data[4:], "not a GGUF file"),
        "version": (_overwritten(data, 4, "<I", 7), "GGUF version 7"),
        "tensor count": (_overwritten(data, 8, "<Q", 1 << 40), "tensor count of 1099511627776 cannot be true"),
        "kv count": (_overwritten(data, 16, "<Q", 1 << 62), "cannot be true"),
        "key length": (_overwritten(data, 24, "<Q", 1 << 63), "truncated at byte"),
        "value type": (_overwritten(data, tokens - 4, "<I", 77), "unknown value type 77"),
        "array item type": (_overwritten(data, tokens, "<I", 99), "unknown item type 99"),
        "array length": (_overwritten(data, tokens + 4, "<Q", 1 << 61), "'tokenizer.ggml.tokens': a count of"),
        "dimension count": (_overwritten(data, dims_at - 4, "<I", 9), "9 dimensions, which cannot be true"),
        "dimension": (_overwritten(data, dims_at, "<Q", 1 << 50), "past the end of the file"),
        "tensor type": (_overwritten(data, type_at, "<I", 250), "unknown GGML type id 250"),
        "tensor offset": (_overwritten(data, type_at + 4, "<Q", 1 << 40), "past the end of the file"),
        "head count": (
            _overwritten(data, _field_value_offset(reader, "llama.attention.head_count"), "<I", 0),
            "llama.attention.head_count is 0, which cannot be true",
        ),
        "bos id": (
            _overwritten(data, _field_value_offset(reader, "tokenizer.ggml.bos_token_id"), "<I", 10**6),
            "tokenizer.ggml.bos_token_id is 1000000, not a token id",
        ),
        "rms epsilon": (
            _overwritten(
                data, _field_value_offset(reader, "llama.attention.layer_norm_rms_epsilon"), "<f", float("nan")
            ),
            "layer_norm_rms_epsilon is nan, which cannot be true",
        ),
    }


def test_impossible_values_are_named(tmp_path, valid):
    data, reader = valid
    for case, (corrupt, expected) in _impossible_cases(data, reader).items():
        error = _convert(tmp_path, corrupt)
        assert error is not None and expected in str(error), (case, str(error))


def test_empty_and_missing_files(tmp_path):
    assert "truncated at byte 0 of 4" in str(_convert(tmp_path, b""))
    with pytest.raises(GGUFError, match=r"nothing\.gguf: cannot be read"):
        convert_gguf(tmp_path / "nothing.gguf", tmp_path / "out", progress=False)


def test_cli_says_it_in_one_line(tmp_path, valid):
    from tinyvllm.cli import main

    data, _ = valid
    (tmp_path / "cut.gguf").write_bytes(data[:1000])
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(tmp_path / "cut.gguf"), str(tmp_path / "out")])
    message = str(exit_info.value.code)
    assert message.startswith(f"tinyvllm convert: {tmp_path / 'cut.gguf'}: ")
    assert "truncated" in message and "ends at byte 1000" in message
    assert "\n" not in message and not (tmp_path / "out").exists()


def test_existing_output_directory_is_filled(tmp_path, valid):
    """default_model converts into a directory it made itself; nothing of the scratch directory stays beside it."""
    data, _ = valid
    (tmp_path / "ok.gguf").write_bytes(data)
    (tmp_path / "made").mkdir()
    convert_gguf(tmp_path / "ok.gguf", tmp_path / "made", progress=False)
    assert {path.name for path in (tmp_path / "made").iterdir()} == {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "model.safetensors",
    }
    assert sorted(path.name for path in tmp_path.iterdir()) == ["made", "ok.gguf"]
