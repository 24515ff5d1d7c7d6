"""The matrix product y = x @ W^T: tiled GEMM, cuBLAS and the `linear` entry point.

Every variant is checked against the float64 NumPy reference and against the others; the
GEMV kernel's own properties are in test_gemv.py, which shares this module's helpers.
"""

import functools

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
from tinyvllm.backends.variants import GEMV_ROWS, product_kernel
from tinyvllm.kernels import cublas, reference
from tinyvllm.kernels.cublas import cublas_gemm
from tinyvllm.kernels.gemm import BLOCK_K, BLOCK_M, BLOCK_N, gemm
from tinyvllm.kernels.gemv import gemv
from tinyvllm.kernels.linear import linear

FLOAT32_TOLERANCE = 2e-5
"""float32 sums of bf16 products: the only error is float32 rounding, ~sqrt(K) ulps."""

OUTPUT_DTYPES = (np.uint16, np.float32)
MAX_M, MAX_N, MAX_K = pick(20, 600), pick(20, 600), pick(40, 3000)


@st.composite
def problems(draw, max_m=MAX_M, max_n=MAX_N, max_k=MAX_K):
    """(x, weight) bf16 bits: any shape, tile multiples and ragged edges alike, M = 1 often."""
    m = draw(st.one_of(st.just(1), st.integers(1, max_m), st.sampled_from(pick([1], [BLOCK_M, BLOCK_M + 1]))))
    n = draw(st.one_of(st.integers(1, max_n), st.sampled_from(pick([1, 8], [BLOCK_N, 2 * BLOCK_N - 1]))))
    k = draw(st.one_of(st.integers(1, max_k), st.sampled_from([8, BLOCK_K, BLOCK_K + 8, 3 * BLOCK_K])))
    scale = draw(st.sampled_from([1e-3, 1.0, 50.0]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    return random_bf16(rng, (m, k), scale), random_bf16(rng, (n, k))


def expected(x, weight) -> np.ndarray:
    return reference.linear(widen(x), widen(weight))


def run(launcher, x, weight, out_dtype, **options) -> np.ndarray:
    """Launch on a poisoned output and return it as float64 on the host."""
    out = poisoned((x.shape[0], weight.shape[0]), out_dtype)
    launcher(cuda.to_device(x), cuda.to_device(weight), out, **options)
    return widen(out) if out_dtype == np.uint16 else out.copy_to_host().astype(np.float64)


def assert_close(actual, expected_values, out_dtype):
    tolerance = BF16_TOLERANCE if out_dtype == np.uint16 else FLOAT32_TOLERANCE
    assert relative_error(actual, expected_values) <= tolerance


@given(problems(), st.sampled_from(OUTPUT_DTYPES))
def test_tiled_gemm_matches_reference(problem, out_dtype):
    x, weight = problem
    assert_close(run(gemm, x, weight, out_dtype), expected(x, weight), out_dtype)


def test_tiled_gemm_fills_every_warp_of_a_tile():
    """Larger than the simulator's drawn shapes: two tiles each way, every warp's piece of the
    first inside Y (each warp's ldmatrix offsets and stores), the others cut by the edges."""
    rng = np.random.default_rng(13)
    x, weight = random_bf16(rng, (BLOCK_M + 2, 24)), random_bf16(rng, (BLOCK_N + 8, 24))
    assert_close(run(gemm, x, weight, np.float32), expected(x, weight), np.float32)


@pytest.mark.parametrize("linear_backend", ["auto", "numba"])
@given(problem=problems(max_m=pick(12, 64)))
def test_linear_matches_reference(linear_backend, problem):
    x, weight = problem
    kernel = product_kernel(linear_backend, x.shape[0], cublas.available())
    assert_close(run(linear, x, weight, np.float32, kernel=kernel), expected(x, weight), np.float32)


def test_numba_backend_crosses_to_the_tiled_kernel_past_gemv_rows():
    rng = np.random.default_rng(7)
    for m in (GEMV_ROWS, GEMV_ROWS + 1):
        x, weight = random_bf16(rng, (m, 24)), random_bf16(rng, (5, 24))
        kernel = product_kernel("numba", m, cublas.available())
        assert_close(run(linear, x, weight, np.uint16, kernel=kernel), expected(x, weight), np.uint16)


def test_misaligned_rows_take_the_element_wise_path():
    """A view starting 2 bytes into an allocation cannot be read in 16-byte chunks."""
    rng = np.random.default_rng(11)
    m, n, k = 3, 5, 16
    x_buffer = cuda.to_device(random_bf16(rng, (m * k + 1,)))
    x = x_buffer[1:].reshape(m, k)
    weight = cuda.to_device(random_bf16(rng, (n, k)))
    for launcher in (gemm, gemv):
        out = poisoned((m, n), np.float32)
        launcher(x, weight, out)
        reference_out = reference.linear(widen(x_buffer)[1:].reshape(m, k), widen(weight))
        assert relative_error(out.copy_to_host(), reference_out) <= FLOAT32_TOLERANCE


@pytest.mark.gpu
@given(problems(max_m=pick(20, 512), max_n=pick(20, 1024), max_k=pick(40, 4096)), st.sampled_from(OUTPUT_DTYPES))
def test_cublas_matches_reference(problem, out_dtype):
    x, weight = problem
    assert_close(run(cublas_gemm, x, weight, out_dtype), expected(x, weight), out_dtype)


@pytest.mark.gpu
@given(problems())
def test_every_backend_computes_the_same_product(problem):
    x, weight = problem
    results = {"tiled": run(gemm, x, weight, np.float32), "cublas": run(cublas_gemm, x, weight, np.float32)}
    if x.shape[0] <= GEMV_ROWS:
        results["gemv"] = run(gemv, x, weight, np.float32)
    for name, result in results.items():
        assert relative_error(result, results["cublas"]) <= FLOAT32_TOLERANCE, name


# --8<-- [start:capture]
@pytest.mark.gpu
def test_cublas_is_captured_in_a_cuda_graph():
    import cupy

    rng = np.random.default_rng(5)
    x = cuda.to_device(random_bf16(rng, (4, 64)))
    weight = cuda.to_device(random_bf16(rng, (48, 64)))
    out = poisoned((4, 48), np.float32)
    capture_stream = cupy.cuda.Stream(non_blocking=True)
    stream = cuda.external_stream(capture_stream.ptr)
    cublas_gemm(x, weight, out, stream=stream)
    capture_stream.synchronize()
    out.copy_to_device(np.full((4, 48), np.nan, np.float32))
    capture_stream.begin_capture()
    cublas_gemm(x, weight, out, stream=stream)
    graph = capture_stream.end_capture()
    graph.launch(capture_stream)
    capture_stream.synchronize()
    assert relative_error(out.copy_to_host(), expected(x.copy_to_host(), weight.copy_to_host())) <= FLOAT32_TOLERANCE


# --8<-- [end:capture]


def _valid_arguments():
    rng = np.random.default_rng(3)
    return {
        "x": cuda.to_device(random_bf16(rng, (3, 16))),
        "weight": cuda.to_device(random_bf16(rng, (5, 16))),
        "out": poisoned((3, 5), np.float32),
    }


BAD_ARGUMENTS = [
    ("x", lambda: cuda.to_device(np.zeros((3, 16), np.float32))),
    ("x", lambda: cuda.to_device(np.zeros((3, 16, 1), np.uint16))),
    ("x", lambda: cuda.to_device(np.zeros((3, 32), np.uint16))[:, ::2]),
    ("x", lambda: cuda.to_device(np.zeros((0, 16), np.uint16))),
    ("weight", lambda: cuda.to_device(np.zeros((5, 24), np.uint16))),
    ("weight", lambda: cuda.to_device(np.zeros((5, 16), np.float32))),
    ("weight", lambda: cuda.to_device(np.zeros(80, np.uint16))),
    ("out", lambda: poisoned((3, 6), np.float32)),
    ("out", lambda: poisoned((5, 3), np.float32)),
    ("out", lambda: cuda.to_device(np.zeros((3, 5), np.float16))),
    ("out", lambda: cuda.to_device(np.zeros((3, 5), np.float64))),
]


@pytest.mark.parametrize(
    "launcher", [gemm, gemv, functools.partial(linear, kernel="tiled")], ids=["tiled", "gemv", "linear"]
)
@pytest.mark.parametrize("name, make_bad", BAD_ARGUMENTS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(BAD_ARGUMENTS)])
def test_bad_arguments_raise_before_launch(launcher, name, make_bad):
    arguments = _valid_arguments()
    arguments[name] = make_bad()
    out = arguments["out"]
    before = out.copy_to_host()
    with pytest.raises(ValueError, match=r"^(x|weight|out|linear)\b"):
        launcher(arguments["x"], arguments["weight"], out)
    np.testing.assert_array_equal(out.copy_to_host().view(np.uint8), before.view(np.uint8))


def test_linear_rejects_an_unknown_kernel():
    arguments = _valid_arguments()
    with pytest.raises(ValueError, match="kernel"):
        linear(arguments["x"], arguments["weight"], arguments["out"], kernel="cutlass")
