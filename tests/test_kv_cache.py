"""Scattering K and V into the paged cache: exact copies to the right slots, nothing else touched."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import pick, random_bf16
from tinyvllm.kernels import reference
from tinyvllm.kernels.kv_cache import write_kv


@st.composite
def problems(draw):
    num_blocks = draw(st.integers(1, pick(4, 64)))
    block_size = draw(st.sampled_from([1, 2, 16]))
    num_kv_heads = draw(st.integers(1, pick(2, 8)))
    head_dim = 8 * draw(st.integers(1, pick(4, 16)))
    capacity = num_blocks * block_size
    tokens = draw(st.integers(1, min(capacity, pick(5, 300))))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    slots = rng.permutation(capacity)[:tokens].astype(np.int32)
    padding = rng.random(tokens) < draw(st.sampled_from([0.0, 0.3]))
    slots[padding] = -rng.integers(1, 100, padding.sum())
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    # Prior content: random bits, so a row written by mistake cannot go unnoticed.
    k_cache = rng.integers(0, 2**16, cache_shape, dtype=np.uint16)
    v_cache = rng.integers(0, 2**16, cache_shape, dtype=np.uint16)
    k = random_bf16(rng, (tokens, num_kv_heads, head_dim))
    v = random_bf16(rng, (tokens, num_kv_heads, head_dim))
    return k, v, k_cache, v_cache, slots


@given(problems())
def test_write_kv_scatters_to_the_slots_and_leaves_the_rest(problem):
    k, v, k_cache, v_cache, slots = problem
    k_cache_device, v_cache_device = cuda.to_device(k_cache), cuda.to_device(v_cache)
    write_kv(cuda.to_device(k), cuda.to_device(v), k_cache_device, v_cache_device, cuda.to_device(slots))
    expected_k, expected_v = k_cache.copy(), v_cache.copy()
    reference.write_kv(k, v, expected_k, expected_v, slots)
    np.testing.assert_array_equal(k_cache_device.copy_to_host(), expected_k)
    np.testing.assert_array_equal(v_cache_device.copy_to_host(), expected_v)


def test_slots_past_the_end_of_the_cache_write_nothing():
    rng = np.random.default_rng(7)
    k_cache = rng.integers(0, 2**16, (2, 4, 2, 16), dtype=np.uint16)
    v_cache = rng.integers(0, 2**16, (2, 4, 2, 16), dtype=np.uint16)
    k, v = random_bf16(rng, (3, 2, 16)), random_bf16(rng, (3, 2, 16))
    slots = np.array([8, 3, 2**31 - 1], np.int32)
    k_cache_device, v_cache_device = cuda.to_device(k_cache), cuda.to_device(v_cache)
    write_kv(cuda.to_device(k), cuda.to_device(v), k_cache_device, v_cache_device, cuda.to_device(slots))
    k_cache[0, 3], v_cache[0, 3] = k[1], v[1]
    np.testing.assert_array_equal(k_cache_device.copy_to_host(), k_cache)
    np.testing.assert_array_equal(v_cache_device.copy_to_host(), v_cache)


def _valid_arguments():
    rng = np.random.default_rng(8)
    return {
        "k": cuda.to_device(random_bf16(rng, (3, 2, 16))),
        "v": cuda.to_device(random_bf16(rng, (3, 2, 16))),
        "k_cache": cuda.to_device(np.zeros((4, 2, 2, 16), np.uint16)),
        "v_cache": cuda.to_device(np.zeros((4, 2, 2, 16), np.uint16)),
        "slot_mapping": cuda.to_device(np.array([0, 5, -1], np.int32)),
    }


BAD_ARGUMENTS = [
    ("k", lambda: cuda.to_device(np.zeros((3, 2, 16), np.float32))),
    ("k", lambda: cuda.to_device(np.zeros((3, 32), np.uint16))),
    ("k", lambda: cuda.to_device(np.zeros((3, 2, 32), np.uint16))[:, :, ::2]),
    ("k", lambda: cuda.to_device(np.zeros((3, 2, 12), np.uint16))),
    ("v", lambda: cuda.to_device(np.zeros((3, 1, 16), np.uint16))),
    ("v", lambda: cuda.to_device(np.zeros((3, 2, 16), np.int16))),
    ("v", lambda: cuda.to_device(np.zeros(3 * 2 * 16 + 1, np.uint16))[1:].reshape(3, 2, 16)),
    ("k_cache", lambda: cuda.to_device(np.zeros((4, 2, 1, 16), np.uint16))),
    ("k_cache", lambda: cuda.to_device(np.zeros((4, 2, 2, 16), np.float16))),
    ("k_cache", lambda: cuda.to_device(np.zeros((8, 2, 2, 16), np.uint16))[::2]),
    ("v_cache", lambda: cuda.to_device(np.zeros((5, 2, 2, 16), np.uint16))),
    ("v_cache", lambda: cuda.to_device(np.zeros((4, 2, 2, 16), np.uint32))),
    ("slot_mapping", lambda: cuda.to_device(np.array([0, 5, -1], np.int64))),
    ("slot_mapping", lambda: cuda.to_device(np.array([0, 5], np.int32))),
    ("slot_mapping", lambda: cuda.to_device(np.arange(6, dtype=np.int32))[::2]),
]


@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS)
def test_bad_arguments_are_rejected_by_name(name, make_bad):
    arguments = _valid_arguments()
    arguments[name] = make_bad()
    with pytest.raises(ValueError, match=f"^{name}:"):
        write_kv(**arguments)
