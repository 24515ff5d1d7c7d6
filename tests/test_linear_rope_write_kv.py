"""The attention block's q|k|v product with RoPE and the KV write: fused into the GEMV's
store, or unfused (product, then `rope_write_kv`).

Oracles: the float64 reference of x @ W^T, rounded to bf16 as the unfused path stores it,
then the float64 reference RoPE + KV write (HF's rotate-half pairs); and, for the fused
GEMV, the unfused GEMV + `rope_write_kv`, which must give the very same bits. Cache rows
that no token owns keep their prior random bits.
"""

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
    sharded,
    widen,
)
from tests.random_llama import LLAMA_3_2_1B_CONFIG
from tests.test_gemv import small_gpu
from tinyvllm.kernels import reference
from tinyvllm.kernels.gemv import gemv
from tinyvllm.kernels.gemv_rope import gemv_rope_write_kv
from tinyvllm.kernels.gemv_shape import MAX_ROWS
from tinyvllm.kernels.linear import linear_rope_write_kv
from tinyvllm.kernels.reference import from_bf16, to_bf16
from tinyvllm.kernels.rope import rope_write_kv
from tinyvllm.model.rope import rope_inv_freq

TARGETS = ("q", "k_cache", "v_cache")


@st.composite
def problems(draw, max_rows=MAX_ROWS, whole_vectors=False):
    """A few tokens (some padding, slot -1), their positions and distinct slots; x [M, K]
    with K short, long or ragged; W [(Hq + 2 Hkv) D, K]; caches of prior random bits."""
    m = draw(st.one_of(st.just(1), st.integers(1, max_rows)))
    head_dim = draw(st.sampled_from(pick([16], [16, 64, 128])))
    num_kv_heads = draw(st.integers(1, 2))
    num_q_heads = num_kv_heads * draw(st.sampled_from(pick([1, 2], [1, 2, 4, 8])))
    k = 8 * draw(st.integers(1, pick(8, 300)))
    if not whole_vectors:
        k = draw(st.sampled_from(pick([k, k + 3], [k, k + 3, 4104])))
    num_blocks, block_size = draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 16]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    capacity = num_blocks * block_size
    slots = np.full(m, -1, np.int32)
    written = min(m, capacity)
    slots[:written] = rng.permutation(capacity)[:written]
    slots[rng.random(m) < draw(st.sampled_from([0.0, 0.3]))] = -1
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return {
        "x": random_bf16(rng, (m, k)),
        "weight": random_bf16(rng, ((num_q_heads + 2 * num_kv_heads) * head_dim, k), scale=0.05),
        "positions": rng.integers(0, 131072, m).astype(np.int32),
        "inv_freq": rope_inv_freq(head_dim, 500000.0, LLAMA_3_2_1B_CONFIG["rope_scaling"]),
        "slot_mapping": rng.permutation(slots),
        "q": np.zeros((m, num_q_heads, head_dim), np.uint16),
        "k_cache": random_bf16(rng, cache_shape),
        "v_cache": random_bf16(rng, cache_shape),
    }


def on_device(problem: dict) -> dict:
    """The problem's arrays on the device, q poisoned (every element must be written)."""
    arguments = {name: cuda.to_device(value) for name, value in problem.items()}
    arguments["q"] = poisoned(problem["q"].shape)
    return arguments


def targets(arguments: dict) -> dict:
    return {name: arguments[name].copy_to_host() for name in TARGETS}


def run_fused(problem: dict) -> dict:
    arguments = on_device(problem)
    gemv_rope_write_kv(**arguments)
    return targets(arguments)


def run_unfused(problem: dict) -> dict:
    """The GEMV, then rope_write_kv over the product it stored."""
    arguments = on_device(problem)
    x, weight = arguments.pop("x"), arguments.pop("weight")
    qkv = poisoned((x.shape[0], weight.shape[0]))
    gemv(x, weight, qkv)
    rope_write_kv(qkv, **arguments)
    return targets(arguments)


def assert_matches_reference(actual: dict, problem: dict) -> None:
    qkv = from_bf16(to_bf16(reference.linear(widen(problem["x"]), widen(problem["weight"])))).astype(np.float64)
    expected = {name: widen(problem[name]) for name in TARGETS}
    reference.rope_write_kv(qkv, problem["positions"], problem["inv_freq"], problem["slot_mapping"], **expected)
    for token in range(qkv.shape[0]):
        error = relative_error(widen(actual["q"][token]), expected["q"][token])
        assert error < BF16_TOLERANCE, f"q of token {token}: {error}"
    slots = problem["slot_mapping"]
    written = slots[slots >= 0]
    for name in ("k_cache", "v_cache"):
        rows, expected_rows, prior_rows = (cache_rows(a[name]) for a in (actual, expected, problem))
        for slot in written:
            error = relative_error(widen(rows[slot]), expected_rows[slot])
            assert error < BF16_TOLERANCE, f"{name} row {slot}: {error}"
        untouched = np.setdiff1d(np.arange(rows.shape[0]), written)
        np.testing.assert_array_equal(rows[untouched], prior_rows[untouched])


def cache_rows(cache: np.ndarray) -> np.ndarray:
    """[blocks, block_size, Hkv, D] -> one row per slot."""
    return cache.reshape(-1, *cache.shape[2:])


@sharded(2)
@given(problems())
def test_fused_gemv_matches_reference(shard, problem):
    assert_matches_reference(run_fused(problem), problem)


@sharded(2)
@given(problems(max_rows=1), st.integers(1, 3))
def test_fused_gemv_blocks_loop_over_row_groups_past_the_grid(shard, problem, num_sms):
    with small_gpu(num_sms):
        assert_matches_reference(run_fused(problem), problem)


@sharded(2)
@given(problems(whole_vectors=True))
def test_fused_gemv_gives_the_bits_of_gemv_then_rope_write_kv(shard, problem):
    fused, unfused = run_fused(problem), run_unfused(problem)
    for name in TARGETS:
        np.testing.assert_array_equal(fused[name], unfused[name], err_msg=name)


@pytest.mark.parametrize("kernel", ["gemv", "tiled"])
def test_linear_rope_write_kv_matches_reference_on_every_backend(kernel):
    rows = 1 if kernel == "gemv" else MAX_ROWS + 1
    problem = _fixed_problem(rows)
    arguments = on_device(problem)
    qkv = poisoned((rows, problem["weight"].shape[0]))
    linear_rope_write_kv(**arguments, qkv=qkv, kernel=kernel)
    assert_matches_reference(targets(arguments), problem)


def _fixed_problem(rows: int) -> dict:
    rng = np.random.default_rng(11)
    head_dim, num_q_heads, num_kv_heads, k = 16, 4, 2, 40
    return {
        "x": random_bf16(rng, (rows, k)),
        "weight": random_bf16(rng, ((num_q_heads + 2 * num_kv_heads) * head_dim, k), scale=0.05),
        "positions": rng.integers(0, 4096, rows).astype(np.int32),
        "inv_freq": rope_inv_freq(head_dim, 10000.0, None),
        "slot_mapping": rng.permutation(rows + 3)[:rows].astype(np.int32),
        "q": np.zeros((rows, num_q_heads, head_dim), np.uint16),
        "k_cache": random_bf16(rng, (4, 4, num_kv_heads, head_dim)),
        "v_cache": random_bf16(rng, (4, 4, num_kv_heads, head_dim)),
    }


BAD_ARGUMENTS = [
    ("x", lambda p: cuda.to_device(np.zeros(p["x"].shape, np.float32))),
    ("weight", lambda p: cuda.to_device(np.ascontiguousarray(p["weight"][:, :8]))),
    ("qkv", lambda p: poisoned((p["x"].shape[0], 8))),
    ("q", lambda p: poisoned((p["x"].shape[0] + 1, *p["q"].shape[1:]))),
    ("k_cache", lambda p: poisoned((4, 4, 2, 32))),
    ("v_cache", lambda p: poisoned((4, 4, 2, 32))),
    ("positions", lambda p: cuda.to_device(p["positions"].astype(np.int64))),
    ("inv_freq", lambda p: cuda.to_device(np.ones(4, np.float32))),
    ("slot_mapping", lambda p: cuda.to_device(np.zeros(5, np.int32))),
]


@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS)
@pytest.mark.parametrize("kernel", ["gemv", "tiled"])
def test_bad_arguments_are_rejected_by_name(name, make_bad, kernel):
    problem = _fixed_problem(2)
    arguments = on_device(problem) | {"qkv": poisoned((2, problem["weight"].shape[0]))}
    arguments[name] = make_bad(problem)
    with pytest.raises(ValueError, match=f"^{name}:"):
        linear_rope_write_kv(**arguments, kernel=kernel)


@pytest.mark.parametrize("launch", [linear_rope_write_kv, gemv_rope_write_kv])
def test_a_weight_that_is_not_the_heads_q_k_v_is_rejected(launch):
    problem = _fixed_problem(2)
    problem["weight"] = problem["weight"][:-16]
    arguments = on_device(problem)
    if launch is linear_rope_write_kv:
        arguments |= {"qkv": poisoned((2, problem["weight"].shape[0])), "kernel": "gemv"}
    with pytest.raises(ValueError, match="^weight: .* q.k.v features"):
        launch(**arguments)


def test_fused_gemv_refuses_more_than_max_rows():
    arguments = on_device(_fixed_problem(MAX_ROWS + 1))
    with pytest.raises(ValueError, match="^x:"):
        gemv_rope_write_kv(**arguments)
