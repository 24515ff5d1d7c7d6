"""The variant table: which kernels each operator call launches on the GPU, and with what split.

Which kernels the CUDA backend runs for each operator, and how decode attention splits,
is decided here (each launcher still sizes its own grid), from the shape of the call
(rows of x, sequences, the block table's width) and of the GPU (its SM count, whether
cuBLAS runs there), and from the `linear_backend` engine option:

    linear_backend  matrix-product kernel for x of M rows
    "cublas"        cuBLAS cublasGemmEx on tensor cores (kernels/cublas.py)
    "tiled"         the tiled Numba GEMM (kernels/gemm.py)
    "gemv"          the Numba matrix-vector kernel, M <= gemv_shape.MAX_ROWS (kernels/gemv.py)
    "numba"         gemv up to GEMV_ROWS rows, tiled above
    "auto"          with cuBLAS available (a real GPU, CuPy installed): gemv up to
                    AUTO_GEMV_ROWS rows, cuBLAS above; else "numba"

The product is arithmetic-bound only when x has many rows; for a handful of rows (decode)
it is bound by reading W, which is what the GEMV kernel is built for. Where the GEMV runs
it also applies the RMSNorm in front of the product and the operator after it (SwiGLU's
activation, RoPE and the KV write) in its store; any other product kernel reads the rows
the norm's own kernel wrote and leaves the next operator to its own kernel.

Decode attention splits each context into parts (flash-decoding) when the batch alone
cannot fill the GPU (`decode_partitions`). Every such choice depends only on shapes, so a
captured CUDA graph replays the choice it was captured with. One depends on the step:
when many decode sequences share a long prefix in the same KV blocks (the prefix cache
gave them), decode attention reads that prefix once for all of them (cascade attention,
`cascade`), and the decode graphs are keyed by that choice too.

`VariantTable` answers both questions the backend asks (which product kernel, how many
partitions) and, from the same answers, the names of the kernels each operator call
launches: the CUDA backend runs what the first two say, and the kernel list
(`kernel_list.py`) prints what the last one says.
"""

from dataclasses import dataclass

from tinyvllm.config import LINEAR_BACKENDS
from tinyvllm.kernels.attention_cascade import cascade_shared_partitions
from tinyvllm.kernels.attention_split import BLOCKS_PER_SM, MAX_PARTITIONS
from tinyvllm.kernels.gemv_shape import MAX_ROWS

GEMV_ROWS = MAX_ROWS
""""numba" uses the GEMV kernel up to this many rows of x (confirm with perf/bench_gemm.py)."""
AUTO_GEMV_ROWS = 1
""""auto" uses the GEMV kernel up to this many rows: at M = 1 it reads the weights as fast
as cuBLAS or faster on every Llama 3.2 1B layer (H200, perf/bench_gemm.py), above it
cuBLAS pulls ahead."""
MIN_PARTITION_TOKENS = 64
"""Split-K cuts a block table's width into parts no shorter than this (one loop step of a
block at D = 64), so that a full-length context gives every block a step of work."""
CASCADE_MIN_SEQS = 192
CASCADE_MIN_TOKENS = 256
"""Cascade attention runs for at least this many decode sequences sharing at least this
many tokens: below them the shared kernel and the merge it adds cost more than the prefix
reads they save. On the H200, at Llama 3.2 1B's heads with 2,048 of 2,112 tokens shared,
one layer took 0.168 against 0.082 ms plain at 64 sequences, 0.179 against 0.158 at 128 and
0.216 against 0.229 at 192 (`perf/bench_attention.py`, 2026-12-04); vLLM's 8 sequences
would choose it where it loses."""
FUSED = {"linear": "gemv", "linear_silu_mul": "gemv_silu_mul", "linear_rope_write_kv": "gemv_rope_write_kv"}
"""The GEMV kernel of each product operator, with its epilogue fused into the store."""
EPILOGUES = {"linear": (), "linear_silu_mul": ("silu_mul",), "linear_rope_write_kv": ("rope_write_kv",)}
"""The kernels that follow any other product kernel, reading what it wrote."""
PRODUCT_KERNELS = {"cublas": "cublas_gemm", "tiled": "gemm"}
"""The launcher of each product kernel that leaves the norm and the epilogue to kernels of their own."""
PREFILL_P_PRECISION = "fp16"
"""How flash prefill multiplies P V (`attention_tiles.P_PRECISIONS`): one float16 pass is the
faster at every shape `perf/bench_attention.py --p-precision` times (`perf/LOG.md`). Cascade's
shared kernel keeps "bf16x2": it has not been timed with one pass."""


# --8<-- [start:dispatch]
def product_kernel(linear_backend: str, rows: int, cublas_available: bool) -> str:
    """The matrix-product kernel `linear_backend` runs for x of `rows` rows: "cublas", "tiled" or "gemv"."""
    if linear_backend not in LINEAR_BACKENDS:
        raise ValueError(f"linear_backend: expected one of {LINEAR_BACKENDS}, got {linear_backend!r}")
    if linear_backend == "auto" and cublas_available:
        return "gemv" if rows <= AUTO_GEMV_ROWS else "cublas"
    if linear_backend in ("auto", "numba"):
        return "gemv" if rows <= GEMV_ROWS else "tiled"
    return linear_backend


# --8<-- [end:dispatch]


# --8<-- [start:partitions]
def decode_partitions(num_seqs: int, num_kv_heads: int, max_context_len: int, max_grid: int) -> int:
    """How many parts to cut each context into: enough blocks to fill the GPU, none tiny.

    max_grid is the number of decode blocks the GPU holds at once (BLOCKS_PER_SM per SM).
    S * Hkv blocks that already fill it need no split; fewer get as many parts as keep
    the grid within it (MAX_PARTITIONS at most), but no more than leave each part of
    max_context_len (the block table's width) MIN_PARTITION_TOKENS long.
    """
    by_occupancy = max_grid // max(1, num_seqs * num_kv_heads)
    by_length = max_context_len // MIN_PARTITION_TOKENS
    return max(1, min(by_occupancy, by_length, MAX_PARTITIONS))


# --8<-- [end:partitions]


def decode_shape(q, k_cache, block_tables) -> tuple[int, int, int]:
    """What decode attention's split depends on: (sequences, KV heads, the block table's
    width in tokens), from q[S, Hq, D], k_cache[blocks, block_size, Hkv, D] and
    block_tables[S, max_blocks]. The width, not the context: a graph's split is fixed."""
    _, block_size, num_kv_heads, _ = k_cache.shape
    return q.shape[0], num_kv_heads, block_tables.shape[1] * block_size


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel an operator call launches: its name (a launcher in tinyvllm/kernels) and
    its split, where it has one."""

    name: str
    partitions: int = 1

    def __str__(self) -> str:
        return self.name if self.partitions == 1 else f"{self.name} ({self.partitions} partitions)"


@dataclass(frozen=True)
class VariantTable:
    """The kernel choices of one GPU (num_sms SMs, cuBLAS there or not) under one `linear_backend`."""

    linear_backend: str
    num_sms: int
    cublas_available: bool

    def __post_init__(self) -> None:
        if self.linear_backend not in LINEAR_BACKENDS:
            raise ValueError(f"linear_backend: expected one of {LINEAR_BACKENDS}, got {self.linear_backend!r}")
        if self.num_sms < 1:
            raise ValueError(f"num_sms: must be at least 1, got {self.num_sms}")

    def product(self, rows: int) -> str:
        """The matrix-product kernel for x of `rows` rows: "cublas", "tiled" or "gemv"."""
        return product_kernel(self.linear_backend, rows, self.cublas_available)

    @property
    def prefill_p_precision(self) -> str:
        """How flash prefill's P V takes the probabilities (PREFILL_P_PRECISION)."""
        return PREFILL_P_PRECISION

    def decode_partitions(self, num_seqs: int, num_kv_heads: int, max_context_len: int) -> int:
        """The parts each context of a decode batch is cut into (1: no split); max_context_len
        is the block table's width in tokens."""
        return decode_partitions(num_seqs, num_kv_heads, max_context_len, BLOCKS_PER_SM * self.num_sms)

    def product_launches(self, operator: str, rows: int, normed: bool) -> tuple[KernelLaunch, ...]:
        """The kernels of a product operator ("linear", "linear_silu_mul", "linear_rope_write_kv")
        for x of `rows` rows, with the RMSNorm in front of it or not."""
        product = self.product(rows)
        if product == "gemv":
            return (KernelLaunch(FUSED[operator]),)
        names = ("rmsnorm",) * normed + (PRODUCT_KERNELS[product],) + EPILOGUES[operator]
        return tuple(KernelLaunch(name) for name in names)

    def cascade(self, num_seqs: int, shared_tokens: int) -> bool:
        """Whether decode attention of num_seqs sequences whose first shared_tokens tokens are
        in the same blocks reads those once for all (cascade attention)."""
        return num_seqs >= CASCADE_MIN_SEQS and shared_tokens >= CASCADE_MIN_TOKENS

    def cascade_partitions(
        self, num_seqs: int, num_kv_heads: int, max_context_len: int, heads: tuple[int, int]
    ) -> tuple[int, int]:
        """Cascade attention's parts: of each sequence's own tokens (as split-K cuts whole
        contexts) and of the shared prefix (enough to fill the GPU); heads is (query heads
        per KV head, head_dim)."""
        own = self.decode_partitions(num_seqs, num_kv_heads, max_context_len)
        return own, cascade_shared_partitions(num_seqs, num_kv_heads, *heads, BLOCKS_PER_SM * self.num_sms)

    def decode_launches(
        self, num_seqs: int, num_kv_heads: int, max_context_len: int, cascade: tuple[int, int] | None = None
    ) -> tuple[KernelLaunch, ...]:
        """The kernels of decode attention: one over whole contexts, or the split and its merge;
        with `cascade` (query heads per KV head, head_dim), cascade attention's three."""
        partitions = self.decode_partitions(num_seqs, num_kv_heads, max_context_len)
        if cascade is not None:
            own, shared = self.cascade_partitions(num_seqs, num_kv_heads, max_context_len, cascade)
            return (
                KernelLaunch("split_decode_attention", own),
                KernelLaunch("cascade_prefix_attention", shared),
                KernelLaunch("merge_cascade"),
            )
        if partitions == 1:
            return (KernelLaunch("paged_decode_attention"),)
        return KernelLaunch("split_decode_attention", partitions), KernelLaunch("merge_partitions")

    @staticmethod
    def sample_launches(rows: int) -> tuple[KernelLaunch, ...]:
        """The sampler's kernels for `rows` rows of logits: the best of each part of each row,
        then the best of the parts (kernels/sampling.py); none for no rows."""
        return (KernelLaunch("sample_parts"), KernelLaunch("sample")) if rows else ()
