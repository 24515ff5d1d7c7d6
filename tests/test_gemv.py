"""The GEMV kernel (x with at most MAX_ROWS rows) against the float64 reference and the tiled GEMM."""

import contextlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from numba import cuda

from tests.helpers import pick, poisoned, random_bf16, relative_error, sharded
from tests.test_gemm import (
    FLOAT32_TOLERANCE,
    OUTPUT_DTYPES,
    assert_close,
    expected,
    run,
)
from tinyvllm.kernels import gemv as gemv_module
from tinyvllm.kernels.gemm import gemm
from tinyvllm.kernels.gemv import gemv
from tinyvllm.kernels.gemv_shape import (
    BLOCKS_PER_SM,
    CHUNKS_PER_THREAD,
    LONG_ROW,
    MAX_ROWS,
    MAX_THREADS,
    MIN_THREADS,
    UNROLLED_PRODUCTS,
    WIDE_OUTPUT,
    WORD_BUDGET,
    WORDS,
    launch_shape,
)

BLOCK_EDGES = [2, 3, 4, 5]
"""N at the edges of two- and four-row blocks."""
LONG_KS = [16 * MAX_THREADS, 16 * MAX_THREADS + 8, 16 * MAX_THREADS + 3]
"""Long enough that a thread takes more than one chunk (and a ragged tail)."""


@st.composite
def problems(draw, long_ks=LONG_KS):
    """Few rows of x; N around the rows-per-block edge; K short, long, ragged or whole chunks."""
    m = draw(st.one_of(st.just(1), st.integers(1, MAX_ROWS)))
    n = draw(st.one_of(st.integers(1, pick(9, 700)), st.sampled_from(BLOCK_EDGES)))
    k = draw(st.one_of(st.integers(1, pick(64, 5000)), st.sampled_from(long_ks)))
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_bf16(rng, (m, k), scale), random_bf16(rng, (n, k))


@sharded(2)
@given(problems(), st.sampled_from(OUTPUT_DTYPES))
def test_gemv_matches_reference(shard, problem, out_dtype):
    x, weight = problem
    assert_close(run(gemv, x, weight, out_dtype), expected(x, weight), out_dtype)


@contextlib.contextmanager
def small_gpu(num_sms: int):
    """The GEMV at M = 1 launched as on a GPU of num_sms SMs holding one block each: its
    blocks loop over the row groups past the grid."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gemv_module, "multiprocessor_count", lambda: num_sms)
        patch.setattr(gemv_module, "BLOCKS_PER_SM", 1)
        yield


@given(problems(), st.integers(1, 3))
def test_gemv_blocks_loop_over_row_groups_past_the_grid(problem, num_sms):
    x, weight = problem[0][:1], problem[1]  # the grid is capped at M = 1 only
    with small_gpu(num_sms):
        assert_close(run(gemv, x, weight, np.float32), expected(x, weight), np.float32)


@sharded(2)
@given(problems(long_ks=pick([24], LONG_KS)))
def test_gemv_and_tiled_gemm_agree(shard, problem):
    """(Under the simulator with short K only: the tiled kernel is slow there.)"""
    x, weight = problem
    assert relative_error(run(gemv, x, weight, np.float32), run(gemm, x, weight, np.float32)) <= FLOAT32_TOLERANCE


def test_gemv_refuses_more_than_max_rows():
    rng = np.random.default_rng(2)
    x = cuda.to_device(random_bf16(rng, (MAX_ROWS + 1, 16)))
    weight = cuda.to_device(random_bf16(rng, (3, 16)))
    with pytest.raises(ValueError, match="^x:"):
        gemv(x, weight, poisoned((MAX_ROWS + 1, 3), np.float32))


@given(st.integers(1, 1 << 16), st.integers(1, 1 << 18), st.integers(1, MAX_ROWS), st.integers(1, 200), st.booleans())
def test_gemv_launch_shape_follows_its_rule(k, n, m, num_sms, normalize):
    threads, rows_per_block, depth, blocks = launch_shape(k, n, m, num_sms, normalize)
    assert threads & (threads - 1) == 0 and MIN_THREADS <= threads <= MAX_THREADS
    chunks = -(-k // 8)
    assert threads == MIN_THREADS or chunks >= CHUNKS_PER_THREAD * threads
    assert threads == MIN_THREADS or threads == MAX_THREADS or chunks < 2 * CHUNKS_PER_THREAD * threads
    assert rows_per_block == (4 if k > LONG_ROW or (m == 1 and n >= WIDE_OUTPUT) else 2)
    groups = -(-n // rows_per_block)
    assert blocks == (min(groups, BLOCKS_PER_SM * num_sms) if m == 1 else groups)
    assert 1 <= depth <= -(-chunks // threads)
    assert depth == 1 or (rows_per_block + m + normalize) * WORDS * depth <= WORD_BUDGET
    assert depth == 1 or depth * (rows_per_block + normalize) * m <= UNROLLED_PRODUCTS
