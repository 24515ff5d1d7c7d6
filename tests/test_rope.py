"""RoPE: the kernel against the float64 NumPy reference, and the inverse frequencies
against transformers' own implementation."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import BF16_TOLERANCE, pick, random_bf16, relative_error, widen
from tinyvllm.kernels import reference
from tinyvllm.kernels.rope import rope, rope_inv_freq
from tinyvllm.testing import LLAMA_3_2_1B_CONFIG

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
    num_q_heads = num_kv_heads * draw(st.integers(1, pick(2, 4)))
    tokens = draw(st.integers(1, pick(3, 100)))
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
    q = random_bf16(rng, (tokens, num_q_heads, head_dim))
    k = random_bf16(rng, (tokens, num_kv_heads, head_dim))
    return q, k, np.array(positions, dtype=np.int32), rope_inv_freq(head_dim, theta, scaling)


@given(problems())
def test_rope_matches_reference(problem):
    q, k, positions, inv_freq = problem
    q_device, k_device = cuda.to_device(q), cuda.to_device(k)
    rope(q_device, k_device, cuda.to_device(positions), cuda.to_device(inv_freq))
    for name, rotated, original in (("q", q_device, q), ("k", k_device, k)):
        expected = reference.rope(widen(original), positions, inv_freq)
        actual = widen(rotated)
        for token in range(positions.size):
            error = relative_error(actual[token], expected[token])
            assert error < BF16_TOLERANCE, f"{name} token {token} at position {positions[token]}: {error}"


def test_position_zero_is_the_identity():
    rng = np.random.default_rng(4)
    q, k = random_bf16(rng, (2, 4, 64)), random_bf16(rng, (2, 2, 64))
    q_device, k_device = cuda.to_device(q), cuda.to_device(k)
    rope(q_device, k_device, cuda.to_device(np.zeros(2, np.int32)), cuda.to_device(rope_inv_freq(64, 1e4, None)))
    np.testing.assert_array_equal(q_device.copy_to_host(), q)
    np.testing.assert_array_equal(k_device.copy_to_host(), k)


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
        "q": cuda.to_device(random_bf16(rng, (3, 4, 32))),
        "k": cuda.to_device(random_bf16(rng, (3, 2, 32))),
        "positions": cuda.to_device(np.arange(3, dtype=np.int32)),
        "inv_freq": cuda.to_device(rope_inv_freq(32, 1e4, None)),
    }


BAD_ARGUMENTS = [
    ("q", lambda: cuda.to_device(np.zeros((3, 4, 32), np.float32))),
    ("q", lambda: cuda.to_device(np.zeros((3, 128), np.uint16))),
    ("q", lambda: cuda.to_device(np.zeros((3, 4, 64), np.uint16))[:, :, ::2]),
    ("q", lambda: cuda.to_device(np.zeros((3, 4, 24), np.uint16))),
    ("k", lambda: cuda.to_device(np.zeros((2, 2, 32), np.uint16))),
    ("k", lambda: cuda.to_device(np.zeros((3, 2, 16), np.uint16))),
    ("k", lambda: cuda.to_device(np.zeros((3, 4, 32), np.uint16))[:, ::2]),
    ("k", lambda: cuda.to_device(np.zeros(3 * 2 * 32 + 4, np.uint16))[4:].reshape(3, 2, 32)),
    ("positions", lambda: cuda.to_device(np.arange(3, dtype=np.int64))),
    ("positions", lambda: cuda.to_device(np.arange(4, dtype=np.int32))),
    ("positions", lambda: cuda.to_device(np.arange(6, dtype=np.int32))[::2]),
    ("inv_freq", lambda: cuda.to_device(np.ones(16, np.float64))),
    ("inv_freq", lambda: cuda.to_device(np.ones(32, np.float32))),
    ("inv_freq", lambda: cuda.to_device(np.ones(32, np.float32))[::2]),
]


@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS)
def test_bad_arguments_are_rejected_by_name(name, make_bad):
    arguments = _valid_arguments()
    arguments[name] = make_bad()
    with pytest.raises(ValueError, match=f"^{name}:"):
        rope(**arguments)
