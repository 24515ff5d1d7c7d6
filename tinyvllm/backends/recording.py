"""A backend that launches nothing and records, for each operator call, the kernels the
CUDA backend would launch for it (from the variant table), so that the real forward pass
and the runner's sampling, run on it, list a step's kernels exactly.

Its arrays are `ShapeOnly`: a shape and a dtype, no memory, so a model of any size is
"loaded" on any machine, with or without a GPU. Graph capture records the calls in
between and a replay records them again, as the GPU replays the kernels it captured.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from tinyvllm.backends.variants import KernelLaunch, VariantTable, decode_shape
from tinyvllm.model.config import ModelConfig


class ShapeOnly:
    """An array's shape and dtype, without its memory: slices, views and reshapes give
    the shapes NumPy would."""

    def __init__(self, shape: tuple[int, ...], dtype: Any):
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    def __getitem__(self, index: Any) -> "ShapeOnly":
        # Strides of zero: NumPy works out the indexed shape without the memory.
        probe = np.lib.stride_tricks.as_strided(np.zeros(1, self.dtype), self.shape, (0,) * len(self.shape))
        return ShapeOnly(probe[index].shape, self.dtype)

    def reshape(self, *shape: int | tuple[int, ...]) -> "ShapeOnly":
        if len(shape) == 1 and isinstance(shape[0], tuple):
            shape = shape[0]
        size = int(np.prod(self.shape))
        known = int(np.prod([n for n in shape if n != -1]))
        resolved = tuple(size // known if n == -1 else n for n in shape)
        if int(np.prod(resolved)) != size:
            raise ValueError(f"cannot reshape {self.shape} into {shape}")
        return ShapeOnly(resolved, self.dtype)

    def view(self, dtype: Any) -> "ShapeOnly":
        dtype = np.dtype(dtype)
        *leading, last = self.shape
        return ShapeOnly((*leading, last * self.dtype.itemsize // dtype.itemsize), dtype)


@dataclass(frozen=True)
class OperatorCall:
    """One operator call and the kernels it launches, in order."""

    operator: str
    kernels: tuple[KernelLaunch, ...]


class RecordingBackend:
    """The Backend protocol (`base.py`) over ShapeOnly arrays: each operator call appends
    an OperatorCall to `calls`, with the kernels the variant table names for its shapes."""

    name = "recording"
    activation_dtype = np.dtype(np.uint16)
    has_device_memory = False
    can_capture_graphs = True

    def __init__(self, variants: VariantTable):
        self.variants = variants
        self.calls: list[OperatorCall] = []
        self._capture_start: int | None = None

    def _record(self, operator: str, *kernels: KernelLaunch) -> None:
        self.calls.append(OperatorCall(operator, kernels))

    # -- memory -----------------------------------------------------------------
    def weight(self, bits: np.ndarray) -> ShapeOnly:
        return ShapeOnly(bits.shape, np.uint16)

    def constant(self, array: np.ndarray) -> ShapeOnly:
        return ShapeOnly(array.shape, array.dtype)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> ShapeOnly:
        return ShapeOnly(shape, dtype)

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> ShapeOnly:
        return ShapeOnly(shape, dtype)

    def pinned_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """Real host memory: the runner writes each step's metadata into it."""
        return np.zeros(shape, dtype)

    def prefix(self, array: ShapeOnly, rows: int) -> ShapeOnly:
        return array[:rows]

    def upload_bytes(self, host: np.ndarray, device: ShapeOnly, nbytes: int) -> None:
        """A copy, not a kernel: nothing to record."""

    def upload_row(self, host: np.ndarray, device: ShapeOnly, row: int) -> None:
        """A copy, not a kernel: nothing to record."""

    def copy(self, source: ShapeOnly, out: ShapeOnly) -> None:
        """A copy, not a kernel: nothing to record."""

    def download_async(self, device: ShapeOnly, host: np.ndarray, count: int) -> None:
        """A copy, not a kernel: nothing to record (the host keeps what it holds)."""

    def memory_info(self) -> tuple[int, int]:
        raise NotImplementedError("memory_info: the recording backend has no memory (has_device_memory is False)")

    def decode_scratch(self, max_seqs: int, config: ModelConfig, cascade: bool = False) -> None:
        """No kernel runs: no scratch."""

    def sample_scratch(self, max_rows: int, vocab: int) -> None:
        """No kernel runs: no scratch."""

    # -- events -----------------------------------------------------------------
    def new_event(self) -> None:
        """Nothing runs: nothing to wait for."""

    def record(self, event: None) -> None:
        """Nothing to mark."""

    def wait(self, event: None) -> None:
        """Nothing to wait for."""

    def synchronize(self) -> None:
        """Nothing runs."""

    # -- graphs -------------------------------------------------------------------
    def begin_capture(self) -> None:
        self._capture_start = len(self.calls)

    def end_capture(self) -> list[OperatorCall]:
        """The calls since `begin_capture`, as the graph they make (and no longer in `calls`)."""
        graph = self.calls[self._capture_start :]
        del self.calls[self._capture_start :]
        self._capture_start = None
        return graph

    def launch_graph(self, graph: list[OperatorCall]) -> None:
        self.calls.extend(graph)

    # -- operators ---------------------------------------------------------------
    def embedding(self, token_ids, table, out) -> None:
        self._record("embedding", KernelLaunch("embedding"))

    def feed_sampled_tokens(self, token_ids, token_sources, sampled) -> None:
        self._record("feed_sampled_tokens", KernelLaunch("feed_sampled_tokens"))

    def gather_rows(self, indices, source, out) -> None:
        self._record("gather_rows", KernelLaunch("embedding"))

    def linear(self, x, weight, out, norm=None, accumulate=False) -> None:
        self._record("linear", *self.variants.product_launches("linear", x.shape[0], norm is not None))

    def linear_rope_write_kv(
        self, x, weight, qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache, norm=None
    ) -> None:
        launches = self.variants.product_launches("linear_rope_write_kv", x.shape[0], norm is not None)
        self._record("linear_rope_write_kv", *launches)

    def linear_silu_mul(self, x, weight, gate_up, out, norm=None) -> None:
        self._record(
            "linear_silu_mul", *self.variants.product_launches("linear_silu_mul", x.shape[0], norm is not None)
        )

    def prefill_attention(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out) -> None:
        self._record("prefill_attention", KernelLaunch("prefill_attention"))

    def decode_attention(
        self, q, k_cache, v_cache, block_tables, context_lens, out, scratch, shared_prefix_len=None
    ) -> None:
        shape = decode_shape(q, k_cache, block_tables)
        cascade = None if shared_prefix_len is None else (q.shape[1] // k_cache.shape[2], q.shape[2])
        self._record("decode_attention", *self.variants.decode_launches(*shape, cascade=cascade))

    def decode_reads_shared_prefix(self, num_seqs: int, shared_tokens: int) -> bool:
        return self.variants.cascade(num_seqs, shared_tokens)

    def sample(self, logits, temperature, top_k, top_p, seeds, positions, out, scratch) -> None:
        self._record("sample", *self.variants.sample_launches(logits.shape[0]))

    def apply_penalties(self, logits, token_state, slots, presence, frequency, repetition, mask_stop_tokens) -> None:
        self._record("apply_penalties", KernelLaunch("apply_penalties"))

    def apply_min_p(self, logits, temperature, min_p) -> None:
        self._record("apply_min_p", KernelLaunch("apply_min_p"))

    def count_sampled_tokens(self, token_state, slots, sampled) -> None:
        self._record("count_sampled_tokens", KernelLaunch("count_sampled_tokens"))

    def compute_logprobs(
        self, logits, num_logprobs, sampled, top_ids, top_logprobs, sampled_logprobs, sampled_ranks
    ) -> None:
        self._record("compute_logprobs", KernelLaunch("compute_logprobs"))
