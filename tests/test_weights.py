"""safetensors reading and writing: the `safetensors` library and ml_dtypes are the oracles.

A checkpoint for a tiny random config (tests/safetensors_files.py) round-trips through our
writer and reader and the library's; f16 and f32 weights are rounded to bf16 like ml_dtypes.
The faults a file can have are tested in test_weights_faults.py.
"""

import ml_dtypes
import numpy as np
import pytest
import safetensors.numpy
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.safetensors_files import load_weights_strictly, random_weights, split_header, tiny_configs
from tinyvllm.model.weights import WeightsError, read_safetensors, save_safetensors, weight_shapes


@settings(max_examples=30)
@given(config=tiny_configs(), seed=st.integers(0, 2**32 - 1))
def test_round_trip_matches_the_safetensors_library(tmp_path_factory, config, seed):
    model_dir = tmp_path_factory.mktemp("model")
    tensors = random_weights(config, seed)
    save_safetensors(model_dir / "model.safetensors", tensors)
    oracle = safetensors.numpy.load_file(model_dir / "model.safetensors")
    ours = read_safetensors(model_dir / "model.safetensors")
    assert list(ours) == list(tensors)
    for name, expected in tensors.items():
        assert oracle[name].dtype == ml_dtypes.bfloat16 and ours[name].dtype == np.uint16
        np.testing.assert_array_equal(ours[name], oracle[name].view(np.uint16))
        np.testing.assert_array_equal(ours[name], expected)
    loaded = load_weights_strictly(model_dir, config)
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
    header, payload = split_header(path)
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
    for name, array in load_weights_strictly(model_dir, config).items():
        np.testing.assert_array_equal(array, stored[name].astype(ml_dtypes.bfloat16).view(np.uint16))


def test_writer_refuses_other_dtypes_and_writes_metadata(tmp_path):
    with pytest.raises(WeightsError, match="tensor 'ids': cannot write int64"):
        save_safetensors(tmp_path / "bad.safetensors", {"ids": np.arange(3)})
    save_safetensors(tmp_path / "ok.safetensors", {"w": np.zeros((2, 3), np.uint16)})
    with safetensors.safe_open(tmp_path / "ok.safetensors", framework="np") as opened:
        assert opened.metadata() == {"format": "pt"}
    assert int.from_bytes((tmp_path / "ok.safetensors").read_bytes()[:8], "little") % 8 == 0  # tensors start aligned
