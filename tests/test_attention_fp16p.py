"""Flash attention with P V in one float16 pass (`p_precision="fp16"`, `attention_fp16.py`):
against a float64 reference within a derived bound, and its fallback to the two bf16 passes
for V tiles that float16 cannot hold."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.attention_batch import paged_batch, shared_prefix_batch, small_blocks  # noqa: F401 (the autouse fixture)
from tests.helpers import pick, poisoned, widen
from tests.test_attention_cascade import cascade_batches
from tests.test_attention_prefill import prefill_batches
from tinyvllm.kernels import attention_tiles
from tinyvllm.kernels.attention_cascade import cascade_decode_attention, cascade_workspace_rows
from tinyvllm.kernels.attention_common import LOG2_E
from tinyvllm.kernels.attention_fp16 import out_of_f16_range
from tinyvllm.kernels.attention_prefill import prefill_attention
from tinyvllm.kernels.reference import from_bf16, gather_kv, to_bf16

P_ROUNDING = 2.0**-11
"""float16's unit roundoff: a probability in [2^-14, 1] moves by at most this much of itself."""
BELOW_NORMAL = 2.0**-25
"""Half float16's subnormal spacing: the most a probability or a value below 2^-14 moves."""
FLOAT32_STEP = 2.0**-22
"""What one float32 operation of the kernel may add, relative: two units of roundoff, for the
tensor core's unspecified accumulation order and rounding and for ex2.approx."""
OUTPUT_ROUNDING = 2.0**-8
"""bf16's unit roundoff, of the stored output."""


def reference_and_bound(batch) -> tuple[np.ndarray, np.ndarray]:
    """(float64 attention, a bound on |fp16 mode - it|), both [T, Hq, D].

    The derivation, per output element o_d = sum_j w_j v_jd of a row that sees keys J (N of them),
    with A_d = sum_j w_j |v_jd| and B_d = sum_j |v_jd|:

    - P rounding: the kernel's p_j = 2^(s_j - m) against its running max m are in [0, 1]; float16
      rounding moves each by at most P_ROUNDING p_j, or BELOW_NORMAL below 2^-14. Later tiles
      only scale p_j down (the max only grows), so in the final output this is at most
      P_ROUNDING A_d + BELOW_NORMAL B_d / l, and l >= 1 (the max key's weight is 2^0).
    - V conversion: bf16 -> float16 is exact from 2^-14 to 2^16 (bf16's 8 significant bits fit
      in float16's 11), and moves a smaller value by at most BELOW_NORMAL: BELOW_NORMAL sum_j p_j / l
      <= 2 BELOW_NORMAL. A tile past 2^16 falls back to the two bf16 passes, whose P is good to
      2^-16 p_j (bf16's rounding of what bf16 rounding left), inside the P term above.
    - Scores: S = Q K^T sums D products in float32 (16 at a time in the tensor core), then is
      scaled and has the max taken off: |error of s_j| <= delta = (D / 16 + 4) FLOAT32_STEP / 2 x
      scale x max_j sum_d |q_d k_jd| (base 2). Weights 2^(s_j + e_j) renormalised move by at most
      (2^(2 delta) - 1) w_j.
    - The rest of float32: l's sum and O's accumulation over N keys, the tiles' rescales and
      exp2: at most (N + D) FLOAT32_STEP of A_d.
    - The output's bf16 rounding: OUTPUT_ROUNDING of the computed value, |o| + the error above.
    """
    q = widen(batch.q)
    k_cache, v_cache = widen(batch.k_cache), widen(batch.v_cache)
    head_dim = q.shape[2]
    group = q.shape[1] // k_cache.shape[2]
    scale = 1.0 / np.sqrt(head_dim)
    expected, bound = np.empty_like(q), np.empty_like(q)
    cu = batch.cu_seqlens_q
    for s, (start, end) in enumerate(zip(cu[:-1], cu[1:])):
        length = int(batch.context_lens[s])
        k, v = (np.repeat(gather_kv(c, batch.block_tables[s], length), group, axis=1) for c in (k_cache, v_cache))
        rows = q[start:end]
        visible = np.arange(length)[None, :] <= np.arange(length - len(rows), length)[:, None]  # [row, key]
        scores = np.where(visible, np.einsum("qhd,khd->hqk", rows, k) * scale, -np.inf)
        weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
        weights /= weights.sum(axis=-1, keepdims=True)
        products = np.where(visible, np.einsum("qhd,khd->hqk", np.abs(rows), np.abs(k)), 0.0).max(axis=-1)
        delta = (head_dim / 16 + 4) * FLOAT32_STEP / 2 * LOG2_E * scale * products.T[:, :, None]
        seen = visible.sum(axis=1)[:, None, None]
        relative = P_ROUNDING + (2.0 ** (2 * delta) - 1) + (seen + head_dim) * FLOAT32_STEP
        spread = np.einsum("hqk,khd->qhd", weights, np.abs(v))
        total = np.einsum("qk,khd->qhd", visible.astype(np.float64), np.abs(v))
        error = relative * spread + BELOW_NORMAL * (total + 2)
        expected[start:end] = np.einsum("hqk,khd->qhd", weights, v)
        bound[start:end] = error * (1 + OUTPUT_ROUNDING) + OUTPUT_ROUNDING * np.abs(expected[start:end])
    return expected, bound


def run_prefill(batch, p_precision: str, padding_rows: int = 0) -> np.ndarray:
    """The output's bf16 bits; rows past cu_seqlens_q[-1] must stay poisoned."""
    rows, num_heads, head_dim = batch.q.shape
    q = np.concatenate([batch.q, np.zeros((padding_rows, num_heads, head_dim), np.uint16)])
    out = poisoned(q.shape)
    arrays = (q, batch.k_cache, batch.v_cache, batch.block_tables, batch.cu_seqlens_q, batch.context_lens)
    prefill_attention(*[cuda.to_device(a) for a in arrays], out, p_precision=p_precision)
    bits = out.copy_to_host()
    assert np.isnan(from_bf16(bits[rows:])).all(), "prefill wrote past cu_seqlens_q[-1]"
    return bits[:rows]


def assert_within(bits: np.ndarray, expected: np.ndarray, bound: np.ndarray) -> None:
    actual = widen(bits)
    assert np.isfinite(actual).all(), "NaN or inf in the output (unwritten rows stay NaN)"
    excess = np.abs(actual - expected) - bound
    assert (excess <= 0).all(), f"{(excess > 0).sum()} elements past the bound, worst by {excess.max():.3g}"


@given(prefill_batches(max_query=pick(12, 100), max_cached=pick(12, 200)))
def test_fp16_prefill_within_the_derived_bound(case):
    """On the GPU shorter than test_attention_prefill's draws: the bound takes four float64
    einsums over (row, key, dimension), a few seconds a sequence at 300 x 900."""
    batch, padding_rows = case
    assert_within(run_prefill(batch, "fp16", padding_rows), *reference_and_bound(batch))


@pytest.mark.parametrize("head_dim", [64, 128])
def test_fp16_prefill_at_model_head_dims(head_dim):
    rng = np.random.default_rng(head_dim)
    batch = paged_batch(rng, [5, 1], [9, 3], 2, 4, head_dim, 4)
    assert_within(run_prefill(batch, "fp16", 1), *reference_and_bound(batch))


def set_value(batch, sequence: int, position: int, value: float) -> None:
    """V[position] of a sequence = value in column 0 of every KV head (so every block that
    reads that key's tile meets it)."""
    block_size = batch.v_cache.shape[1]
    block = batch.block_tables[sequence, position // block_size]
    batch.v_cache[block, position % block_size, :, 0] = to_bf16(np.float64(value))


def short_and_long(seed: int):
    """Sequence 0 (3 new of 7 tokens) fits in one tile of keys; sequence 1 spans several."""
    keys = attention_tiles.tile_shape(32, "fp16")[1]
    return paged_batch(np.random.default_rng(seed), [3, 5], [7, 3 * keys + 5], 2, 3, 32, 4)


@pytest.mark.parametrize("value", [2.0**16, -3e38, np.inf, np.nan])
def test_a_tile_float16_cannot_hold_takes_the_two_bf16_passes(value):
    """Sequence 0's only tile holds a value past float16's range: its rows come out bit for bit
    as the bf16x2 kernel's (even where a non-finite V makes them NaN or inf: 0 x inf in P V).
    Sequence 1's rows, all float16 tiles, stay within the bound."""
    batch = short_and_long(7)
    set_value(batch, 0, 5, value)
    fp16, bf16x2 = run_prefill(batch, "fp16"), run_prefill(batch, "bf16x2")
    first = slice(0, batch.cu_seqlens_q[1])
    np.testing.assert_array_equal(fp16[first], bf16x2[first])
    second = slice(batch.cu_seqlens_q[1], None)
    expected, bound = reference_and_bound(batch)
    assert_within(fp16[second], expected[second], bound[second])


def test_tiles_past_float16_range_mixed_with_tiles_in_it():
    """Sequence 1's second tile falls back, its others do not: every row, sequence 0's too (a
    finite 2^17 in its tile), within the bound, which covers both paths."""
    batch = short_and_long(8)
    keys = attention_tiles.tile_shape(32, "fp16")[1]
    set_value(batch, 0, 2, 2.0**17)
    set_value(batch, 1, keys + 3, -(2.0**20))
    assert_within(run_prefill(batch, "fp16", 2), *reference_and_bound(batch))


def test_the_float16_fold_walks_longer_tiles_than_the_two_pass_one():
    """Each fold takes its own key tile (`tile_shape`): with the two-pass fold capped below the
    float16 one, a sequence spanning several tiles of either comes out within the bound both ways."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(attention_tiles, "MAX_KEYS", 32)
        patch.setattr(attention_tiles, "BF16X2_MAX_KEYS", 16)
        assert attention_tiles.tile_shape(32, "fp16")[1] == 32
        assert attention_tiles.tile_shape(32, "bf16x2")[1] == 16
        batch = paged_batch(np.random.default_rng(9), [3, 2], [40, 2], 2, 2, 32, 4)
        expected, bound = reference_and_bound(batch)
        for p_precision in ("fp16", "bf16x2"):
            assert_within(run_prefill(batch, p_precision), expected, bound)


@cuda.jit
def range_kernel(words, flags):
    for i in range(cuda.threadIdx.x, words.shape[0], cuda.blockDim.x):
        flags[i] = 1 if out_of_f16_range(words[i]) else 0


def test_out_of_range_is_exactly_what_float16_cannot_hold():
    """Over every bf16 value: flagged exactly when float16 has no finite value for it (2^16 and
    up, infinity, NaN); 65280, bf16's largest below 2^16, is held."""
    bits = np.arange(1 << 16, dtype=np.uint32)
    words = bits[0::2] | (bits[1::2] << np.uint32(16))
    flags = cuda.device_array(len(words), np.uint8)
    range_kernel[1, 32](cuda.to_device(words), flags)
    with np.errstate(invalid="ignore"):  # bf16's signalling NaNs
        values = from_bf16(bits.astype(np.uint16)).astype(np.float64)
    unholdable = ~(np.abs(values) < 2.0**16)
    np.testing.assert_array_equal(flags.copy_to_host().astype(bool), unholdable[0::2] | unholdable[1::2])
    assert not unholdable[to_bf16(np.float64(65280.0))]


@given(cascade_batches(), st.integers(1, 2))
def test_fp16_cascade_within_the_derived_bound(case, shared_partitions):
    batch, shared_len = case
    num_seqs, num_heads, head_dim = batch.q.shape
    workspace = poisoned((cascade_workspace_rows(num_seqs, num_heads, 1, shared_partitions), head_dim + 2), np.float32)
    out = poisoned(batch.q.shape)
    arrays = (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.context_lens)
    shared = cuda.to_device(np.array([shared_len], np.int32))
    cascade_decode_attention(*[cuda.to_device(a) for a in arrays], shared, out, workspace, 1, shared_partitions,
                             p_precision="fp16")  # fmt: skip
    assert_within(out.copy_to_host(), *reference_and_bound(batch))


def test_unknown_p_precision_raises():
    batch = short_and_long(9)
    with pytest.raises(ValueError, match="p_precision"):
        run_prefill(batch, "fp8")
    rng = np.random.default_rng(9)
    decode = shared_prefix_batch(rng, [5, 6], 1, 1, 2, 16, 4)
    arrays = (decode.q, decode.k_cache, decode.v_cache, decode.block_tables, decode.context_lens)
    shared, out, workspace = (
        cuda.to_device(np.array([4], np.int32)),
        poisoned(decode.q.shape),
        poisoned((8, 18), np.float32),
    )
    with pytest.raises(ValueError, match="p_precision"):
        cascade_decode_attention(*[cuda.to_device(a) for a in arrays], shared, out, workspace, 1, 1, p_precision="fp8")
