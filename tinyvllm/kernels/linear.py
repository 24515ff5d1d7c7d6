"""The linear layer, y = x @ W^T, on the matrix-product kernel the caller names.

    kernel    runs
    "cublas"  cuBLAS cublasGemmEx on tensor cores (kernels/cublas.py)
    "tiled"   the tiled Numba GEMM, for many rows of x (kernels/gemm.py)
    "gemv"    the Numba matrix-vector kernel, for at most gemv_shape.MAX_ROWS rows (kernels/gemv.py)

Which kernel fits a call is the variant table's choice (backends/variants.py). Two products
take the next operator with them, fused into the GEMV's store where the GEMV runs:
`linear_silu_mul` is the MLP's gate|up product with SwiGLU's activation, and
`linear_rope_write_kv` the attention block's q|k|v product with RoPE and the KV write.

Each of the three also takes the RMSNorm in front of it (`norm`): the GEMV applies it as
it multiplies, any other kernel reads the rows that `rmsnorm` writes to norm.normed first.
And `linear` adds its product to out with `accumulate`, as the o and down projections
join the residual stream: in the store of the GEMV and of the tiled kernel, through
beta = 1 in cuBLAS.
"""

import numpy as np

from tinyvllm.kernels import cublas
from tinyvllm.kernels.activation import silu_mul
from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.gemm import check_linear, gemm
from tinyvllm.kernels.gemv import gemv
from tinyvllm.kernels.gemv_rope import gemv_rope_write_kv
from tinyvllm.kernels.gemv_silu import gemv_silu_mul
from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.kernels.rmsnorm import rmsnorm
from tinyvllm.kernels.rope import check_rope_targets, rope_write_kv

LAUNCHERS = {"cublas": cublas.cublas_gemm, "tiled": gemm, "gemv": gemv}
"""The product kernels by name."""


# --8<-- [start:dispatch]
def linear(x, weight, out, *, kernel: str, norm: RMSNorm | None = None, accumulate: bool = False, stream=0) -> None:
    """out[M, N] = x[M, K] @ weight[N, K]^T (bf16 in, float32 sums, bf16 or float32 out);
    of rmsnorm(x) * norm.weight with `norm`; out += the product (bf16) with `accumulate`."""
    check_linear(x, weight, out, accumulate=accumulate)
    check_kernel(kernel)
    if kernel == "gemv":
        gemv(x, weight, out, norm=norm, accumulate=accumulate, stream=stream)
    else:
        LAUNCHERS[kernel](normed_rows(x, norm, stream), weight, out, accumulate=accumulate, stream=stream)


def check_kernel(kernel: str) -> None:
    if kernel not in LAUNCHERS:
        raise ValueError(f"kernel: expected one of {tuple(LAUNCHERS)}, got {kernel!r}")


def normed_rows(x, norm: RMSNorm | None, stream):
    """The rows a kernel that does not apply the norm itself reads: x, or norm.normed
    after `rmsnorm` has written them."""
    if norm is None:
        return x
    rmsnorm(x, norm.weight, norm.eps, norm.normed, out_name="normed", stream=stream)
    return norm.normed


# --8<-- [end:dispatch]


def linear_silu_mul(x, weight, gate_up, out, *, kernel: str, norm: RMSNorm | None = None, stream=0) -> None:
    """out[M, I] = silu(gate) * up of x @ weight^T, weight[2I, K] interleaving gate and up rows.

    The GEMV stores the activation itself (`gemv_silu.gemv_silu_mul`); the other kernels write
    the product to gate_up[M, 2I] (bf16), and `activation.silu_mul` reads it from there.
    `norm` as in `linear`.
    """
    m, k = check_array("x", x, np.uint16, (None, None))
    rows, _ = check_array("weight", weight, np.uint16, (None, k))
    if rows % 2:
        raise ValueError(f"weight: {rows} rows, expected (gate, up) pairs")
    check_array("gate_up", gate_up, np.uint16, (m, rows))
    check_array("out", out, np.uint16, (m, rows // 2))
    check_kernel(kernel)
    if kernel == "gemv":
        gemv_silu_mul(x, weight, out, norm=norm, stream=stream)
    else:
        LAUNCHERS[kernel](normed_rows(x, norm, stream), weight, gate_up, stream=stream)
        silu_mul(gate_up, out, stream=stream)


def linear_rope_write_kv(
    x,
    weight,
    qkv,
    positions,
    inv_freq,
    slot_mapping,
    q,
    k_cache,
    v_cache,
    *,
    kernel: str,
    norm: RMSNorm | None = None,
    stream=0,
) -> None:
    """q, k_cache and v_cache as `rope.rope_write_kv` writes them from qkv = x @ weight^T.

    The GEMV turns the pairs in its store (`gemv_rope.gemv_rope_write_kv`) and leaves qkv
    alone; the other kernels write the product to qkv[M, N] (bf16), and `rope_write_kv`
    reads it from there. `norm` as in `linear`.
    """
    m, n, _ = check_linear(x, weight, qkv, "qkv")
    check_array("qkv", qkv, np.uint16, (m, n))
    check_rope_targets(m, n, positions, inv_freq, slot_mapping, q, k_cache, v_cache, "weight")
    check_kernel(kernel)
    if kernel == "gemv":
        gemv_rope_write_kv(x, weight, positions, inv_freq, slot_mapping, q, k_cache, v_cache, norm=norm, stream=stream)
    else:
        LAUNCHERS[kernel](normed_rows(x, norm, stream), weight, qkv, stream=stream)
        rope_write_kv(qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache, stream=stream)
