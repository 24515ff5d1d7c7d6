"""safetensors reading and writing: the `safetensors` library and ml_dtypes are the oracles.

A valid checkpoint for a tiny random config is written, then mutated into each fault a
file can have; every fault must raise the specific WeightsError, naming the file and the
tensor at fault.
"""

import json
import warnings

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tests.helpers import random_bf16
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.weights import (
    DTYPE_SIZES,
    WeightsError,
    WeightsWarning,
    load_weights,
    read_safetensors,
    save_safetensors,
    weight_shapes,
)


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


def _random_weights(config: ModelConfig, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: random_bf16(rng, shape) for name, shape in weight_shapes(config).items()}


def _split(path):
    raw = path.read_bytes()
    length = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8 : 8 + length]), raw[8 + length :]


def _join(path, header_bytes: bytes, data: bytes, header_length: int | None = None):
    length = len(header_bytes) if header_length is None else header_length
    path.write_bytes(length.to_bytes(8, "little") + header_bytes + data)


def _load(model_dir, config):
    with warnings.catch_warnings():
        warnings.simplefilter("error", WeightsWarning)
        return load_weights(model_dir, config)


@settings(max_examples=30)
@given(config=tiny_configs(), seed=st.integers(0, 2**32 - 1))
def test_round_trip_matches_the_safetensors_library(tmp_path_factory, config, seed):
    model_dir = tmp_path_factory.mktemp("model")
    tensors = _random_weights(config, seed)
    save_safetensors(model_dir / "model.safetensors", tensors)
    oracle = safetensors.numpy.load_file(model_dir / "model.safetensors")
    ours = read_safetensors(model_dir / "model.safetensors")
    assert list(ours) == list(tensors)
    for name, expected in tensors.items():
        assert oracle[name].dtype == ml_dtypes.bfloat16 and ours[name].dtype == np.uint16
        np.testing.assert_array_equal(ours[name], oracle[name].view(np.uint16))
        np.testing.assert_array_equal(ours[name], expected)
    loaded = _load(model_dir, config)
    assert list(loaded) == list(weight_shapes(config)) and loaded.unexpected == ()
    for name, array in loaded.items():
        np.testing.assert_array_equal(array, tensors[name])
        assert not array.flags.owndata and not array.flags.writeable  # a view of the memory map


@settings(max_examples=30)
@given(data=st.data())
def test_reads_what_the_safetensors_library_writes(tmp_path_factory, data):
    shapes = st.lists(st.integers(0, 5), max_size=3).map(tuple)
    dtypes = st.sampled_from([np.float32, np.float16, ml_dtypes.bfloat16])
    names = st.text("abc.xyz_0123", min_size=1, max_size=8)
    specs = data.draw(st.dictionaries(names, st.tuples(shapes, dtypes), max_size=5))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    tensors = {name: rng.standard_normal(shape).astype(dtype) for name, (shape, dtype) in specs.items()}
    path = tmp_path_factory.mktemp("lib") / "x.safetensors"
    safetensors.numpy.save_file(tensors, path)
    ours = read_safetensors(path)
    assert ours.keys() == tensors.keys()
    for name, expected in tensors.items():
        bits = expected.view(np.uint16) if expected.dtype == ml_dtypes.bfloat16 else expected
        assert ours[name].shape == expected.shape
        np.testing.assert_array_equal(ours[name], bits)


@settings(max_examples=30)
@given(data=st.data())
def test_writer_output_is_read_by_the_safetensors_library(tmp_path_factory, data):
    shapes = st.lists(st.integers(0, 4), max_size=3).map(tuple)
    specs = data.draw(
        st.dictionaries(
            st.text("abc.xyz_0123", min_size=1, max_size=8),
            st.tuples(shapes, st.sampled_from([np.uint16, np.float16, np.float32]), st.booleans()),
            max_size=6,
        )
    )
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    tensors = {}
    for name, (shape, dtype, transposed) in specs.items():
        array = (rng.standard_normal(shape) * 1000).astype(dtype)
        tensors[name] = array.T if transposed else array  # non-contiguous views are written in logical order
    path = tmp_path_factory.mktemp("writer") / "x.safetensors"
    save_safetensors(path, tensors)
    oracle = safetensors.numpy.load_file(path)
    header, payload = _split(path)
    data_start = path.stat().st_size - len(payload)
    assert oracle.keys() == tensors.keys()
    for name, expected in tensors.items():
        actual = oracle[name].view(np.uint16) if expected.dtype == np.uint16 else oracle[name]
        assert actual.shape == expected.shape and actual.dtype == expected.dtype
        np.testing.assert_array_equal(actual, expected)
        assert (data_start + header[name]["data_offsets"][0]) % expected.itemsize == 0  # aligned


finite_floats = st.integers(0, 2**32 - 1).map(lambda bits: np.uint32(bits).view(np.float32)).filter(np.isfinite)


@settings(max_examples=30)
@given(config=tiny_configs(), data=st.data())
def test_f16_and_f32_are_rounded_to_bf16_like_ml_dtypes(tmp_path_factory, config, data):
    stored = {}
    for name, shape in weight_shapes(config).items():
        size = int(np.prod(shape))
        values = np.array(data.draw(st.lists(finite_floats, min_size=size, max_size=size)))
        dtype = data.draw(st.sampled_from([np.float32, np.float16]))
        with np.errstate(over="ignore"):
            stored[name] = values.astype(np.float32).astype(dtype).reshape(shape)
    model_dir = tmp_path_factory.mktemp("model")
    save_safetensors(model_dir / "model.safetensors", stored)
    for name, array in _load(model_dir, config).items():
        np.testing.assert_array_equal(array, stored[name].astype(ml_dtypes.bfloat16).view(np.uint16))


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
    save_safetensors(path, _random_weights(config, 0))
    header, payload = _split(path)
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
    tensors = _random_weights(config, 1)
    name = data.draw(st.sampled_from(list(tensors)))
    tensors[name] = random_bf16(np.random.default_rng(2), (tensors[name].shape[0] + 1, *tensors[name].shape[1:]))
    model_dir = tmp_path_factory.mktemp("model")
    save_safetensors(model_dir / "model.safetensors", tensors)
    with pytest.raises(WeightsError, match=f"{model_dir / 'model.safetensors'}: tensor '{name}' has shape"):
        load_weights(model_dir, config)


def test_integer_dtype_for_a_weight_raises(tmp_path):
    config = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 4,
            "num_attention_heads": 2,
            "intermediate_size": 4,
            "num_hidden_layers": 1,
            "vocab_size": 8,
        }
    )
    tensors = {name: np.zeros(shape, np.float32) for name, shape in weight_shapes(config).items()}
    tensors["model.norm.weight"] = np.zeros(4, np.int32)
    safetensors.numpy.save_file(tensors, tmp_path / "model.safetensors")
    with pytest.raises(WeightsError, match="tensor 'model.norm.weight' has dtype I32"):
        load_weights(tmp_path, config)


@settings(max_examples=15)
@given(config=tiny_configs(), extra=st.text("abcdefgh._", min_size=1, max_size=12))
def test_unexpected_tensors_are_listed_and_warned_about_unless_harmless(tmp_path_factory, config, extra):
    tensors = _random_weights(config, 3)
    assume(extra not in tensors)
    harmless = {"model.layers.0.self_attn.rotary_emb.inv_freq": np.ones(2, np.float32)}
    if config.tie_word_embeddings:
        harmless["lm_head.weight"] = tensors["model.embed_tokens.weight"]
    model_dir = tmp_path_factory.mktemp("model")
    save_safetensors(model_dir / "model.safetensors", tensors | harmless)
    assert set(_load(model_dir, config).unexpected) == set(harmless)
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
    tensors = _random_weights(config, 4)
    shard_of = {name: data.draw(st.integers(0, 2)) for name in tensors}
    model_dir = tmp_path_factory.mktemp("sharded")
    index = _write_sharded(model_dir, tensors, shard_of)
    loaded = _load(model_dir, config)
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
    config = ModelConfig.from_dict(
        {
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 4,
            "num_attention_heads": 2,
            "intermediate_size": 4,
            "num_hidden_layers": 1,
            "vocab_size": 8,
        }
    )
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


def test_writer_refuses_other_dtypes_and_writes_metadata(tmp_path):
    with pytest.raises(WeightsError, match="tensor 'ids': cannot write int64"):
        save_safetensors(tmp_path / "bad.safetensors", {"ids": np.arange(3)})
    save_safetensors(tmp_path / "ok.safetensors", {"w": np.zeros((2, 3), np.uint16)})
    with safetensors.safe_open(tmp_path / "ok.safetensors", framework="np") as opened:
        assert opened.metadata() == {"format": "pt"}
    assert int.from_bytes((tmp_path / "ok.safetensors").read_bytes()[:8], "little") % 8 == 0  # tensors start aligned
