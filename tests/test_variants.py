"""The variant table's choices, and the kernel list against what the kernels really launch."""

import argparse
import functools

import numpy as np
import pytest

from tests.helpers import SIMULATOR, random_bf16
from tests.random_llama import LLAMA_3_2_1B_CONFIG, TINY_OVERRIDES
from tinyvllm.backends import kernel_list, variants
from tinyvllm.backends.base import ModelOperators, SamplerOperators, methods
from tinyvllm.backends.cuda_backend import CudaBackend
from tinyvllm.backends.variants import (
    AUTO_GEMV_ROWS,
    GEMV_ROWS,
    LINEAR_BACKENDS,
    MIN_PARTITION_TOKENS,
    VariantTable,
    product_kernel,
)
from tinyvllm.config import EngineConfig
from tinyvllm.engine.model_runner import ModelRunner
from tinyvllm.kernels.attention_split import BLOCKS_PER_SM, MAX_PARTITIONS
from tinyvllm.kernels.device.multiprocessors import multiprocessor_count
from tinyvllm.model.config import ModelConfig
from tinyvllm.model.weights import weight_shapes

LLAMA_1B = ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG)
TINY = ModelConfig.from_dict(LLAMA_3_2_1B_CONFIG | TINY_OVERRIDES)


def test_linear_backend_modes_pick_their_kernels():
    for cublas in (True, False):
        for rows in (1, 2, GEMV_ROWS, GEMV_ROWS + 1, 4096):
            assert product_kernel("cublas", rows, cublas) == "cublas"
            assert product_kernel("tiled", rows, cublas) == "tiled"
            assert product_kernel("gemv", rows, cublas) == "gemv"
            assert product_kernel("numba", rows, cublas) == ("gemv" if rows <= GEMV_ROWS else "tiled")
    assert [product_kernel("auto", rows, True) for rows in (1, AUTO_GEMV_ROWS + 1, 64)] == ["gemv", "cublas", "cublas"]
    assert [product_kernel("auto", rows, False) for rows in (1, GEMV_ROWS, GEMV_ROWS + 1)] == ["gemv", "gemv", "tiled"]


def test_an_unknown_linear_backend_is_refused_by_name():
    with pytest.raises(ValueError, match="linear_backend"):
        product_kernel("cutlass", 1, True)
    with pytest.raises(ValueError, match="linear_backend"):
        VariantTable("cutlass", 132, True)
    with pytest.raises(ValueError, match="num_sms"):
        VariantTable("auto", 0, True)
    assert EngineConfig().linear_backend in LINEAR_BACKENDS


def test_decode_split_fills_the_gpu_as_the_table_says():
    table = VariantTable("auto", 132, True)
    assert table.decode_partitions(1, 8, 8192) == MAX_PARTITIONS
    assert table.decode_partitions(2, 8, 8192) == BLOCKS_PER_SM * 132 // 16
    assert table.decode_partitions(1, 8, 2 * MIN_PARTITION_TOKENS - 1) == 1
    assert table.decode_partitions(64, 8, 2048) == 1
    assert [str(k) for k in table.decode_launches(1, 8, 8192)] == [
        f"split_decode_attention ({MAX_PARTITIONS} partitions)",
        "merge_partitions",
    ]
    assert [k.name for k in table.decode_launches(64, 8, 2048)] == ["paged_decode_attention"]


def test_llama_1b_decode_step_launches_the_measured_kernel_counts():
    """102 kernels at batch 1 (the GEMV's fused products, split decode) and 167 at batch 2
    (cuBLAS and the norm, activation and RoPE kernels), as counted on the H200 on 2026-12-02."""
    assert kernel_list.decode_kernel_count(LLAMA_1B, 1) == 102
    assert kernel_list.decode_kernel_count(LLAMA_1B, 2) == 167


def test_a_batch_runs_its_graph_bucket_replayed_or_eager():
    """Batch 3 runs padded to the graph bucket of 4 rows, replayed or eager: its split is the
    one of 4 sequences both ways, so that the two give the same tokens."""

    def split(batch, **options):
        calls = kernel_list.decode_step_kernels(TINY, batch, num_sms=8, max_model_len=512, **options)
        return next(call.kernels[0].partitions for call in calls if call.operator == "decode_attention")

    four = BLOCKS_PER_SM * 8 // (4 * TINY.num_key_value_heads)
    assert four != BLOCKS_PER_SM * 8 // (3 * TINY.num_key_value_heads)
    assert split(3) == split(3, enforce_eager=True) == split(4) == four


def test_kernels_command_prints_the_list_per_layer_and_in_total(tmp_path, capsys):
    config = tmp_path / "config.json"
    config.write_text(__import__("json").dumps(LLAMA_3_2_1B_CONFIG | TINY_OVERRIDES))
    parser = argparse.ArgumentParser()
    kernel_list.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["kernels", "--model", str(config), "--batch", "2", "--linear-backend", "numba"])
    args.handler(args)
    out = capsys.readouterr().out
    assert f"each of the {TINY.num_hidden_layers} layers: 6 kernels" in out
    assert "linear_silu_mul        gemv_silu_mul" in out
    expected = kernel_list.decode_kernel_count(TINY, 2, linear_backend="numba")
    assert out.rstrip().endswith(f"total: {expected} kernels")
    assert expected == 2 + 6 * TINY.num_hidden_layers + 4


KERNEL_FUNCTIONS = {
    "embedding": "_embedding_kernel",
    "feed_sampled_tokens": "_feed_kernel",
    "rmsnorm": "_rmsnorm_kernel",
    "gemv": ("gemv", "gemv_normalized"),
    "gemv_silu_mul": ("gemv", "gemv_normalized"),
    "gemv_rope_write_kv": ("gemv", "gemv_normalized"),
    "gemm": "gemm",
    "silu_mul": "_silu_mul_kernel",
    "rope_write_kv": "_rope_write_kv_kernel",
    "paged_decode_attention": "decode",
    "split_decode_attention": "decode",
    "merge_partitions": "_merge_partitions_kernel",
    "cascade_prefix_attention": "shared_prefix",
    "merge_cascade": "_merge_cascade_kernel",
    "sample_parts": "_part_kernel",
    "sample": "_sample_kernel",
    "apply_penalties": "_penalty_kernel",
    "apply_min_p": "_min_p_kernel",
    "count_sampled_tokens": "_count_kernel",
}
"""The `@cuda.jit` function behind each kernel the table names (the GEMV's is named for
whether it applies the norm)."""


def _launched_per_call(backend: CudaBackend, patch: pytest.MonkeyPatch) -> list:
    """Wrap the simulator's launches and the backend's operators: each call's launches,
    as (operator, [(kernel function, grid), ...]). A launch is recorded, not run: what the
    kernels compute is other tests' work, and simulating them took minutes a case."""
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    calls, launches = [], []

    def recorded(kernel, configuration):
        launches.append((kernel.fn.__name__, tuple(np.atleast_1d(configuration[0]))))
        return lambda *arguments: None

    def operator(name, method, *args, **kwargs):
        launches.clear()
        method(*args, **kwargs)
        calls.append((name, list(launches)))

    patch.setattr(FakeCUDAKernel, "__getitem__", recorded)
    for name in methods(ModelOperators) | methods(SamplerOperators):
        patch.setattr(backend, name, functools.partial(operator, name, getattr(backend, name)))
    return calls


@pytest.mark.skipif(not SIMULATOR, reason="counts launches in Numba's simulator")
@pytest.mark.parametrize(
    "batch, linear_backend, max_model_len, shared", [(1, "numba", 256, 0), (2, "tiled", 64, 0), (2, "tiled", 64, 32)]
)
def test_kernel_list_is_what_the_kernels_launch(batch, linear_backend, max_model_len, shared, monkeypatch):
    """A tiny model's decode step through the real launchers (the simulator's launches
    recorded): the fused GEMV path with a split decode, the tiled path, whose norm, activation
    and RoPE run apart, unsplit, and the tiled path with cascade attention (its thresholds
    lowered to the step's)."""
    monkeypatch.setattr(variants, "CASCADE_MIN_SEQS", batch)
    monkeypatch.setattr(variants, "CASCADE_MIN_TOKENS", 32)
    options = {"linear_backend": linear_backend, "max_model_len": max_model_len, "enforce_eager": True,
               "disable_cascade_attn": False}  # fmt: skip
    expected = kernel_list.decode_step_kernels(
        TINY, batch, shared=shared, num_sms=multiprocessor_count(), cublas_available=False, **options
    )
    rng = np.random.default_rng(0)
    weights = {name: random_bf16(rng, shape, 0.1) for name, shape in weight_shapes(TINY).items()}
    backend = CudaBackend(linear_backend)
    runner = ModelRunner(TINY, weights, backend, EngineConfig(**options).resolve(TINY))
    step = kernel_list.prepare_decode_step(
        runner, batch, kernel_list.DEFAULT_CONTEXT, shared=shared, capture_graphs=False
    )
    with pytest.MonkeyPatch.context() as patch:
        actual = _launched_per_call(backend, patch)
        runner.execute(step)
    assert [name for name, _ in actual] == [call.operator for call in expected]
    for (name, launched), call in zip(actual, expected):
        assert len(launched) == len(call.kernels), name
        for (function, _), kernel in zip(launched, call.kernels):
            assert function in np.atleast_1d(KERNEL_FUNCTIONS[kernel.name]), (name, kernel.name)
        for (_, grid), kernel in zip(launched, call.kernels):
            if kernel.name in ("split_decode_attention", "cascade_prefix_attention"):
                assert grid[2] == kernel.partitions, (name, kernel.name)
    kernels = {k.name for call in expected for k in call.kernels}
    assert ("cascade_prefix_attention" in kernels) == (shared > 0)
    assert ("split_decode_attention" in kernels) == (batch == 1 or shared > 0)
