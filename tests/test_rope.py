"""RoPE + KV write: the fused kernel against the float64 NumPy reference (q rotated, k rotated
into the cache, v copied bit for bit, nothing else touched), and the inverse frequencies
against transformers' own implementation."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import (
    BF16_TOLERANCE,
    pick,
    poisoned,
    random_bf16,
    relative_error,
    widen,
)
from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tinyvllm.kernels import reference
from tinyvllm.kernels.rope import rope_write_kv
from tinyvllm.model.rope import rope_inv_freq

LLAMA_3_2_SCALING = LLAMA_3_2_1B_CONFIG["rope_scaling"]
MAX_POSITION = 131072


@st.composite
def llama3_scalings(draw):
    return {
        "rope_type": "llama3",
        "factor": draw(st.floats(1.0, 64.0)),
        "low_freq_factor": draw(st.floats(0.5, 2.0)),
        "high_freq_factor": draw(st.floats(2.5, 8.0)),
        "original_max_position_embeddings": draw(st.integers(512, 16384)),
    }


@st.composite
def problems(draw):
    head_dim = draw(st.sampled_from([64, 128]))
    num_kv_heads = draw(st.integers(1, pick(2, 8)))
    num_q_heads = num_kv_heads * draw(st.sampled_from([1, 3, 4, 8]))
    num_blocks = draw(st.integers(1, pick(3, 64)))
    block_size = draw(st.sampled_from([1, 2, 16]))
    tokens = draw(st.integers(1, pick(4, 300)))
    positions = draw(
        st.lists(
            st.one_of(st.integers(0, 4096), st.integers(MAX_POSITION - 40000, MAX_POSITION)),
            min_size=tokens,
            max_size=tokens,
        )
    )
    theta = draw(st.sampled_from([10000.0, 500000.0]))
    scaling = draw(st.one_of(st.none(), st.just(LLAMA_3_2_SCALING), llama3_scalings()))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    # Distinct slots in shuffled order; tokens past the capacity and a random share of the
    # others are padding (negative slots).
    capacity = num_blocks * block_size
    slots = -rng.integers(1, 100, tokens).astype(np.int32)
    written = min(tokens, capacity)
    slots[:written] = rng.permutation(capacity)[:written]
    padding = rng.random(tokens) < draw(st.sampled_from([0.0, 0.3]))
    slots[padding] = -1
    slots = rng.permutation(slots)
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return {
        "qkv": random_bf16(rng, (tokens, (num_q_heads + 2 * num_kv_heads) * head_dim)),
        "positions": np.array(positions, dtype=np.int32),
        "inv_freq": rope_inv_freq(head_dim, theta, scaling),
        "slot_mapping": slots,
        "num_q_heads": num_q_heads,
        # Prior content: other random values, so a cache row written by mistake cannot go unnoticed.
        "k_cache": random_bf16(rng, cache_shape),
        "v_cache": random_bf16(rng, cache_shape),
    }


def run_kernel(problem: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The kernel on a problem, q poisoned first: (q, k_cache, v_cache) as host bits."""
    qkv, num_q_heads = problem["qkv"], problem["num_q_heads"]
    head_dim = problem["k_cache"].shape[-1]
    q = poisoned((qkv.shape[0], num_q_heads, head_dim))
    qkv_device = cuda.to_device(qkv)
    k_cache, v_cache = cuda.to_device(problem["k_cache"]), cuda.to_device(problem["v_cache"])
    rope_write_kv(
        qkv_device,
        cuda.to_device(problem["positions"]),
        cuda.to_device(problem["inv_freq"]),
        cuda.to_device(problem["slot_mapping"]),
        q,
        k_cache,
        v_cache,
    )
    np.testing.assert_array_equal(qkv_device.copy_to_host(), qkv)
    return q.copy_to_host(), k_cache.copy_to_host(), v_cache.copy_to_host()


def cache_rows(cache: np.ndarray) -> np.ndarray:
    return cache.reshape(-1, *cache.shape[2:])


@given(problems())
def test_rope_write_kv_matches_reference(problem):
    q, k_cache, v_cache = run_kernel(problem)
    positions, slots = problem["positions"], problem["slot_mapping"]
    expected_q = np.empty(q.shape)
    expected_k, expected_v = widen(problem["k_cache"]), widen(problem["v_cache"])
    reference.rope_write_kv(
        widen(problem["qkv"]), positions, problem["inv_freq"], slots, expected_q, expected_k, expected_v
    )
    actual_q = widen(q)
    for token in range(positions.size):
        error = relative_error(actual_q[token], expected_q[token])
        assert error < BF16_TOLERANCE, f"q token {token} at position {positions[token]}: {error}"

    written = slots[slots >= 0]
    for slot in written:
        token = int(np.flatnonzero(slots == slot)[0])
        error = relative_error(widen(cache_rows(k_cache)[slot]), cache_rows(expected_k)[slot])
        assert error < BF16_TOLERANCE, f"k of token {token} at position {positions[token]}: {error}"
    # V is a copy, bit for bit; every row no token owns keeps its old bits, in both caches.
    np.testing.assert_array_equal(widen(cache_rows(v_cache)[written]), cache_rows(expected_v)[written])
    untouched = np.setdiff1d(np.arange(cache_rows(k_cache).shape[0]), written)
    np.testing.assert_array_equal(cache_rows(k_cache)[untouched], cache_rows(problem["k_cache"])[untouched])
    np.testing.assert_array_equal(cache_rows(v_cache)[untouched], cache_rows(problem["v_cache"])[untouched])


def _small_problem(rng, slots, positions=None) -> dict:
    tokens, num_q_heads, num_kv_heads, head_dim = len(slots), 4, 2, 32
    cache_shape = (2, 4, num_kv_heads, head_dim)
    return {
        "qkv": random_bf16(rng, (tokens, (num_q_heads + 2 * num_kv_heads) * head_dim)),
        "positions": np.arange(tokens, dtype=np.int32) if positions is None else positions,
        "inv_freq": rope_inv_freq(head_dim, 1e4, None),
        "slot_mapping": np.array(slots, np.int32),
        "num_q_heads": num_q_heads,
        "k_cache": random_bf16(rng, cache_shape),
        "v_cache": random_bf16(rng, cache_shape),
    }


def test_position_zero_is_a_plain_split_and_copy():
    problem = _small_problem(np.random.default_rng(4), [5, 0], positions=np.zeros(2, np.int32))
    q, k_cache, v_cache = run_kernel(problem)
    heads = problem["qkv"].reshape(2, 8, 32)
    np.testing.assert_array_equal(q, heads[:, :4])
    for token, slot in enumerate(problem["slot_mapping"]):
        np.testing.assert_array_equal(cache_rows(k_cache)[slot], heads[token, 4:6])
        np.testing.assert_array_equal(cache_rows(v_cache)[slot], heads[token, 6:])


def test_padding_and_slots_past_the_end_write_q_but_not_the_cache():
    problem = _small_problem(np.random.default_rng(7), [8, 3, -1, 2**31 - 1])
    q, k_cache, v_cache = run_kernel(problem)
    heads = widen(problem["qkv"]).reshape(4, 8, 32)
    rotated = reference.rope(heads, problem["positions"], problem["inv_freq"])
    assert relative_error(widen(q), rotated[:, :4]) < BF16_TOLERANCE
    # Only row 3 (token 1's slot) changes, in both caches.
    k_rows, v_rows = cache_rows(k_cache), cache_rows(v_cache)
    old_k, old_v = cache_rows(problem["k_cache"]), cache_rows(problem["v_cache"])
    others = np.arange(k_rows.shape[0]) != 3
    np.testing.assert_array_equal(k_rows[others], old_k[others])
    np.testing.assert_array_equal(v_rows[others], old_v[others])
    assert relative_error(widen(k_rows[3]), rotated[1, 4:6]) < BF16_TOLERANCE
    np.testing.assert_array_equal(widen(v_rows[3]), heads[1, 6:])


# rope_inv_freq against transformers.


def _transformers_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> np.ndarray:
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        max_position_embeddings=MAX_POSITION,
        rope_theta=theta,
        rope_scaling=None if scaling is None else dict(scaling),
    )
    if scaling is None:
        # transformers 5 moved the default out of ROPE_INIT_FUNCTIONS and onto the rotary module.
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

        init = ROPE_INIT_FUNCTIONS.get("default") or LlamaRotaryEmbedding.compute_default_rope_parameters
    else:
        init = ROPE_INIT_FUNCTIONS["llama3"]
    inv_freq, _ = init(config)
    return inv_freq.numpy()


@pytest.mark.parametrize("head_dim", [64, 128])
def test_llama_3_2_inv_freq_matches_transformers(head_dim):
    ours = rope_inv_freq(head_dim, 500000.0, LLAMA_3_2_SCALING)
    assert ours.dtype == np.float32 and ours.shape == (head_dim // 2,)
    np.testing.assert_allclose(ours, _transformers_inv_freq(head_dim, 500000.0, LLAMA_3_2_SCALING), rtol=1e-6)


@given(
    head_dim=st.sampled_from([16, 32, 64, 96, 128, 256]),
    theta=st.floats(1e3, 1e7),
    scaling=st.one_of(st.none(), llama3_scalings()),
)
def test_inv_freq_matches_transformers(head_dim, theta, scaling):
    # The smoothing blend can amplify a last-bit difference in torch's pow a few times.
    np.testing.assert_allclose(
        rope_inv_freq(head_dim, theta, scaling), _transformers_inv_freq(head_dim, theta, scaling), rtol=1e-5
    )


def test_legacy_type_key_and_default_type_are_understood():
    legacy = {**LLAMA_3_2_SCALING, "type": "llama3"}
    del legacy["rope_type"]
    np.testing.assert_array_equal(rope_inv_freq(64, 5e5, legacy), rope_inv_freq(64, 5e5, LLAMA_3_2_SCALING))
    np.testing.assert_array_equal(rope_inv_freq(64, 5e5, {"rope_type": "default"}), rope_inv_freq(64, 5e5, None))


@pytest.mark.parametrize("rope_type", ["yarn", "linear", "dynamic", "longrope"])
def test_unsupported_scaling_is_rejected_by_name(rope_type):
    with pytest.raises(ValueError, match=f"'{rope_type}'"):
        rope_inv_freq(64, 5e5, {"rope_type": rope_type, "factor": 2.0})


def _valid_arguments():
    rng = np.random.default_rng(5)
    return {
        "qkv": cuda.to_device(random_bf16(rng, (3, (4 + 2 * 2) * 32))),
        "positions": cuda.to_device(np.arange(3, dtype=np.int32)),
        "inv_freq": cuda.to_device(rope_inv_freq(32, 1e4, None)),
        "slot_mapping": cuda.to_device(np.array([0, 5, -1], np.int32)),
        "q": cuda.to_device(np.zeros((3, 4, 32), np.uint16)),
        "k_cache": cuda.to_device(np.zeros((4, 2, 2, 32), np.uint16)),
        "v_cache": cuda.to_device(np.zeros((4, 2, 2, 32), np.uint16)),
    }


BAD_ARGUMENTS = [
    ("qkv", lambda: cuda.to_device(np.zeros((3, 256), np.float32))),
    ("qkv", lambda: cuda.to_device(np.zeros((3, 8, 32), np.uint16))),
    ("qkv", lambda: cuda.to_device(np.zeros((3, 512), np.uint16))[:, ::2]),
    ("qkv", lambda: cuda.to_device(np.zeros((3, 224), np.uint16))),
    ("qkv", lambda: cuda.to_device(np.zeros(3 * 256 + 4, np.uint16))[4:].reshape(3, 256)),
    ("q", lambda: cuda.to_device(np.zeros((3, 4, 32), np.float32))),
    ("q", lambda: cuda.to_device(np.zeros((2, 4, 32), np.uint16))),
    ("q", lambda: cuda.to_device(np.zeros((3, 128), np.uint16))),
    ("q", lambda: cuda.to_device(np.zeros((3, 4, 64), np.uint16))[:, :, ::2]),
    ("q", lambda: cuda.to_device(np.zeros((3, 4, 24), np.uint16))),
    ("q", lambda: cuda.to_device(np.zeros((3, 1, 512), np.uint16))),
    ("k_cache", lambda: cuda.to_device(np.zeros((4, 2, 2, 16), np.uint16))),
    ("k_cache", lambda: cuda.to_device(np.zeros((4, 2, 2, 32), np.float16))),
    ("k_cache", lambda: cuda.to_device(np.zeros((8, 2, 2, 32), np.uint16))[::2]),
    ("v_cache", lambda: cuda.to_device(np.zeros((5, 2, 2, 32), np.uint16))),
    ("v_cache", lambda: cuda.to_device(np.zeros((4, 2, 1, 32), np.uint16))),
    ("v_cache", lambda: cuda.to_device(np.zeros((4, 2, 2, 32), np.uint32))),
    ("positions", lambda: cuda.to_device(np.arange(3, dtype=np.int64))),
    ("positions", lambda: cuda.to_device(np.arange(4, dtype=np.int32))),
    ("positions", lambda: cuda.to_device(np.arange(6, dtype=np.int32))[::2]),
    ("inv_freq", lambda: cuda.to_device(np.ones(16, np.float64))),
    ("inv_freq", lambda: cuda.to_device(np.ones(32, np.float32))),
    ("inv_freq", lambda: cuda.to_device(np.ones(32, np.float32))[::2]),
    ("slot_mapping", lambda: cuda.to_device(np.array([0, 5, -1], np.int64))),
    ("slot_mapping", lambda: cuda.to_device(np.array([0, 5], np.int32))),
    ("slot_mapping", lambda: cuda.to_device(np.arange(6, dtype=np.int32))[::2]),
]


@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS)
def test_bad_arguments_are_rejected_by_name(name, make_bad):
    arguments = _valid_arguments()
    arguments[name] = make_bad()
    with pytest.raises(ValueError, match=f"^{name}:"):
        rope_write_kv(**arguments)
