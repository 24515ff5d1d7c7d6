"""safetensors checkpoints with faults: every fault must raise the specific WeightsError,
naming the file and the tensor at fault.

A valid checkpoint for a tiny random config (tests/safetensors_files.py) is written, then
mutated into each fault a file can have; also weights of the wrong shape or dtype, unexpected
tensors, sharded checkpoints with a shard or a tensor missing, and bad index files.
"""

import json

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.helpers import random_bf16
from tests.safetensors_files import load_weights_strictly, random_weights, split_header, tiny_configs
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.weights import (
    DTYPE_SIZES,
    WeightsError,
    WeightsWarning,
    load_weights,
    save_safetensors,
    weight_shapes,
)

SMALLEST_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4,
    "num_attention_heads": 2,
    "intermediate_size": 4,
    "num_hidden_layers": 1,
    "vocab_size": 8,
}
"""A one-layer Llama config.json of width 4, for the checks that need a model but no weights of note."""


def _join(path, header_bytes: bytes, data: bytes, header_length: int | None = None):
    length = len(header_bytes) if header_length is None else header_length
    path.write_bytes(length.to_bytes(8, "little") + header_bytes + data)


def _header_json(header) -> bytes:
    return json.dumps(header).encode()


def _fault(kind: str, path, header: dict, data: bytes, draw):
    """Rewrite the file with one fault; return (message fragment, tensor name the message must name)."""
    names = [name for name in header if name != "__metadata__"]
    name = draw(st.sampled_from(names))
    entry = header[name]
    begin, end = entry["data_offsets"]
    header_bytes = _header_json(header)
    if kind == "truncate":
        raw = path.read_bytes()
        data_start = 8 + int.from_bytes(raw[:8], "little")
        cut = draw(st.integers(0, len(raw) - 1))
        path.write_bytes(raw[:cut])
        if cut < 8:
            return "too short", None
        if cut < data_start:
            return "header length", None
        first_outside = next(n for n in names if data_start + header[n]["data_offsets"][1] > cut)
        return "run past the end of the file", first_outside
    if kind == "header_length":
        _join(path, header_bytes, data, draw(st.integers(len(header_bytes) + len(data) + 1, 2**64 - 1)))
        return "runs past the end of the file", None
    if kind == "not_json":
        garbage = b"{{" + draw(st.binary(min_size=len(header_bytes) - 2, max_size=len(header_bytes) - 2))
        _join(path, garbage, data)
        return "header is not valid JSON", None
    if kind == "not_object":
        _join(path, json.dumps([names, 1]).encode(), data)
        return "not an object", None
    if kind == "bad_metadata":
        header["__metadata__"] = {"format": draw(st.integers() | st.none())}
        _join(path, _header_json(header), data)
        return "__metadata__ must map strings to strings", None
    if kind == "malformed_entry":
        del entry[draw(st.sampled_from(["dtype", "shape", "data_offsets"]))]
        fragment = "entry must be an object with dtype, shape and data_offsets"
    elif kind == "unknown_dtype":
        entry["dtype"] = draw(st.text("ABFQ0123_", min_size=1, max_size=6).filter(lambda d: d not in DTYPE_SIZES))
        fragment = "unknown dtype"
    elif kind == "wrong_span":
        entry["shape"] = draw(st.sampled_from([entry["shape"] + [2], [entry["shape"][0] + 1] + entry["shape"][1:]]))
        fragment = "data_offsets span"
    elif kind == "out_of_file":
        shift = draw(st.integers(len(data) - begin + 1, 2**40))
        entry["data_offsets"] = [begin + shift, end + shift]
        fragment = "run past the end of the file"
    elif kind == "overlap":
        other = header[draw(st.sampled_from([n for n in names if n != name]))]["data_offsets"]
        span = end - begin
        start = draw(st.integers(max(0, other[0] - span + 1), min(other[1] - 1, len(data) - span)))
        entry["data_offsets"] = [start, start + span]
        fragment = "overlap"
    elif kind == "missing":
        del header[name]
        fragment = "is missing"
    _join(path, _header_json(header), data)
    return fragment, name


FAULTS = [
    "truncate",
    "header_length",
    "not_json",
    "not_object",
    "bad_metadata",
    "malformed_entry",
    "unknown_dtype",
    "wrong_span",
    "out_of_file",
    "overlap",
    "missing",
]


@pytest.mark.parametrize("kind", FAULTS)
@settings(max_examples=15)
@given(config=tiny_configs(), data=st.data())
def test_each_fault_raises_naming_the_file_and_the_tensor(tmp_path_factory, kind, config, data):
    model_dir = tmp_path_factory.mktemp("model")
    path = model_dir / "model.safetensors"
    save_safetensors(path, random_weights(config, 0))
    header, payload = split_header(path)
    assume(kind != "overlap" or len(header) > 2)
    fragment, tensor = _fault(kind, path, header, payload, data.draw)
    with pytest.raises(WeightsError) as raised:
        load_weights(model_dir, config)
    message = str(raised.value)
    assert fragment in message and str(path) in message
    assert tensor is None or repr(tensor) in message


@settings(max_examples=15)
@given(config=tiny_configs(), data=st.data())
def test_wrong_shape_for_the_config_raises_naming_the_tensor(tmp_path_factory, config, data):
    tensors = random_weights(config, 1)
    name = data.draw(st.sampled_from(list(tensors)))
    tensors[name] = random_bf16(np.random.default_rng(2), (tensors[name].shape[0] + 1, *tensors[name].shape[1:]))
    model_dir = tmp_path_factory.mktemp("model")
    save_safetensors(model_dir / "model.safetensors", tensors)
    with pytest.raises(WeightsError, match=f"{model_dir / 'model.safetensors'}: tensor '{name}' has shape"):
        load_weights(model_dir, config)


def test_integer_dtype_for_a_weight_raises(tmp_path):
    config = ModelConfig.from_dict(SMALLEST_CONFIG)
    tensors = {name: np.zeros(shape, np.float32) for name, shape in weight_shapes(config).items()}
    tensors["model.norm.weight"] = np.zeros(4, np.int32)
    safetensors.numpy.save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(WeightsError, match="tensor 'model.norm.weight' has dtype I32"):
        load_weights(tmp_path, config)


@settings(max_examples=15)
@given(config=tiny_configs(), extra=st.text("abcdefgh._", min_size=1, max_size=12))
def test_unexpected_tensors_are_listed_and_warned_about_unless_harmless(tmp_path_factory, config, extra):
    tensors = random_weights(config, 3)
    assume(extra not in tensors)
    harmless = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(2, np.float32)}
    if config.tie_word_embeddings:
        harmless["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    model_dir = tmp_path_factory.mktemp("model")
    save_safetensors(model_dir / "model.safetensors", tensors | harmless)
    assert set(load_weights_strictly(model_dir, config).unexpected) == set(harmless)
    save_safetensors(model_dir / "model.safetensors", tensors | harmless | {extra: np.zeros(3, np.float16)})
    with pytest.warns(WeightsWarning) as caught:
        loaded = load_weights(model_dir, config)
    assert len(caught) == 1 and f"{model_dir / 'model.safetensors'}: {extra!r}" in str(caught[0].message)
    assert not any(name in str(caught[0].message) for name in harmless)
    assert set(loaded.unexpected) == set(harmless) | {extra} and extra not in loaded


def _write_sharded(model_dir, tensors, shard_of):
    shards = sorted(set(shard_of.values()))
    files = {shard: f"model-{shard + 1:05d}-of-{len(shards):05d}.safetensors" for shard in shards}
    for shard in shards:
        save_safetensors(model_dir / files[shard], {n: t for n, t in tensors.items() if shard_of[n] == shard})
    index = {"metadata": {"total_size": 0}, "weight_map": {name: files[shard_of[name]] for name in tensors}}
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    return index


@settings(max_examples=20)
@given(config=tiny_configs(), data=st.data())
def test_sharded_checkpoints_load_like_a_single_file(tmp_path_factory, config, data):
    tensors = random_weights(config, 4)
    shard_of = {name: data.draw(st.integers(0, 2)) for name in tensors}
    model_dir = tmp_path_factory.mktemp("sharded")
    index = _write_sharded(model_dir, tensors, shard_of)
    loaded = load_weights_strictly(model_dir, config)
    assert loaded.keys() == tensors.keys()
    for name, array in loaded.items():
        np.testing.assert_array_equal(array, tensors[name])
    name = data.draw(st.sampled_from(list(tensors)))
    shard = model_dir / index["weight_map"][name]
    del index["weight_map"][name]
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError, match=f"model.safetensors.index.json: tensor '{name}' is missing"):
        load_weights(model_dir, config)
    index["weight_map"][name] = shard.name
    (model_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    save_safetensors(shard, {n: t for n, t in tensors.items() if shard_of[n] == shard_of[name] and n != name})
    with pytest.raises(WeightsError, match=f"{shard}: tensor '{name}' is missing"):
        load_weights(model_dir, config)
    shard.unlink()
    with pytest.raises(WeightsError, match=f"shard {shard.name} .holding tensor '.*'. is not in"):
        load_weights(model_dir, config)


def test_bad_index_and_empty_directory_are_errors(tmp_path):
    config = ModelConfig.from_dict(SMALLEST_CONFIG)
    with pytest.raises(WeightsError, match="neither model.safetensors nor model.safetensors.index.json"):
        load_weights(tmp_path, config)
    index = tmp_path / "model.safetensors.index.json"
    index.write_text("{oops")
    with pytest.raises(WeightsError, match="index.json: not valid JSON"):
        load_weights(tmp_path, config)
    for weight_map in (["a"], {"model.norm.weight": "../elsewhere.safetensors"}):
        index.write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(WeightsError, match="weight_map must map tensor names to shard file names"):
            load_weights(tmp_path, config)
