"""The GPU backend: Numba device arrays, `@cuda.jit` kernels and cuBLAS on one stream.

Every launch goes to one stream, so the runner can capture a whole decode step into a
CUDA graph on it. Weights and buffers are plain Numba device arrays allocated once; the
operators allocate nothing. Under Numba's CUDA simulator the same class runs the kernels
on the CPU (the engine tests use that).
"""

import contextlib
import gc

import numpy as np
from numba import cuda
from numba.cuda.cudadrv.driver import device_memset, device_to_device

from tinyvllm.backends.variants import VariantTable, decode_shape
from tinyvllm.kernels import (
    attention_cascade,
    attention_prefill,
    attention_split,
    cublas,
    embedding,
    logprobs,
    penalties,
    sampling,
)
from tinyvllm.kernels.device import multiprocessors, pdl
from tinyvllm.kernels.device.simulator import SIMULATOR
from tinyvllm.kernels.linear import linear, linear_rope_write_kv, linear_silu_mul

if not SIMULATOR:  # the simulator has its own cudadrv, without these
    from numba.cuda.cudadrv.devicearray import DeviceNDArray
    from numba.cuda.cudadrv.driver import device_to_host, host_to_device


class CudaBackend:
    """The Backend protocol (`base.py`) on the GPU; each operator runs the kernels that the
    variant table (`variants.py`) picks for its shapes."""

    name = "cuda"
    activation_dtype = np.dtype(np.uint16)
    has_device_memory = True

    def __init__(self, linear_backend: str = "auto"):
        self.simulated = SIMULATOR
        self.can_capture_graphs = not self.simulated
        if self.can_capture_graphs:
            import cupy

            self.cupy_stream = cupy.cuda.Stream(non_blocking=True)
            self.stream = cuda.external_stream(self.cupy_stream.ptr)
            self._capture_launches = contextlib.ExitStack()
        else:
            self.stream = cuda.stream()
        self.variants = VariantTable(linear_backend, multiprocessors.multiprocessor_count(), cublas.available())

    # -- memory -----------------------------------------------------------------
    def weight(self, bits: np.ndarray):
        return cuda.to_device(np.ascontiguousarray(bits), stream=self.stream)

    def constant(self, array: np.ndarray):
        return cuda.to_device(np.ascontiguousarray(array), stream=self.stream)

    def empty(self, shape: tuple[int, ...], dtype):
        return cuda.device_array(shape, dtype=dtype, stream=self.stream)

    def zeros(self, shape: tuple[int, ...], dtype):
        array = self.empty(shape, dtype)
        if self.simulated:
            array.copy_to_device(np.zeros(shape, dtype))
        else:
            device_memset(array, 0, array.nbytes, stream=self.stream)
        return array

    def pinned_empty(self, shape: tuple[int, ...], dtype) -> np.ndarray:
        """Page-locked host memory: the GPU copies it asynchronously, without a staging copy."""
        return cuda.pinned_array(shape, dtype=dtype)

    # Numba's slicing and copy_to_device run tens of microseconds of Python per call, more
    # than the copy; the three methods below are what a step calls, done the short way.
    def prefix(self, array, rows: int):
        """array[:rows], the same memory (an array of the same strides, shorter)."""
        if rows == array.shape[0]:
            return array
        if self.simulated:
            return array[:rows]
        shape = (rows, *array.shape[1:])
        return DeviceNDArray(shape, array.strides, array.dtype, stream=self.stream, gpu_data=array.gpu_data)

    def upload_bytes(self, host: np.ndarray, device, nbytes: int) -> None:
        """Copy the first nbytes of a (pinned) uint8 host array into a uint8 device array."""
        if self.simulated:
            device[:nbytes].copy_to_device(host[:nbytes])
        else:
            host_to_device(device, host, nbytes, stream=self.stream)

    def copy(self, source, out) -> None:
        """A device-to-device copy on the stream (a graph captures it as a memcpy node)."""
        if self.simulated:
            out.copy_to_device(source)
        else:
            device_to_device(out, source, source.nbytes, stream=self.stream)

    def upload_row(self, host: np.ndarray, device, row: int) -> None:
        """A pageable copy: it waits for the stream's queued work, then copies (once per admission)."""
        device[row].copy_to_device(np.ascontiguousarray(host), stream=self.stream)

    def download_async(self, device, host: np.ndarray, count: int) -> None:
        """Queue a copy of the first `count` elements of a 1-D device array into (pinned)
        host memory, behind the stream's work; `record` an event, then `wait` on it to read it."""
        if self.simulated:
            host[:count] = device[:count].copy_to_host()
        else:
            device_to_host(host, device, count * device.dtype.itemsize, stream=self.stream)

    def new_event(self):
        return cuda.event()

    def record(self, event) -> None:
        """Mark the stream's work queued so far with `event` (made once, recorded again each time)."""
        event.record(self.stream)

    def wait(self, event) -> None:
        """Block the host until the work before `event` is done (and no later work)."""
        event.synchronize()

    def synchronize(self) -> None:
        self.stream.synchronize()

    def begin_capture(self) -> None:
        """Start capturing the stream's work into a graph; its kernels launch with PDL (`kernels/device/pdl.py`)."""
        self.cupy_stream.begin_capture()
        self._capture_launches.enter_context(pdl.programmatic_launches())

    def end_capture(self):
        self._capture_launches.close()
        return self.cupy_stream.end_capture()

    def launch_graph(self, graph) -> None:
        graph.launch(stream=self.cupy_stream)

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory, counting what dead arrays held as free.

        Numba frees device memory lazily: a dropped array's memory goes on a pending list
        that is released in batches. Arrays of a dropped engine still in reference cycles
        wait for the garbage collector. Both are flushed first, so that memory sizing (the
        KV arena) sees what is really available.
        """
        self.stream.synchronize()
        gc.collect()
        context = cuda.current_context()
        context.deallocations.clear()
        return tuple(context.get_memory_info())

    # -- operators ---------------------------------------------------------------
    def embedding(self, token_ids, table, out) -> None:
        embedding.embedding(token_ids, table, out, stream=self.stream)

    def feed_sampled_tokens(self, token_ids, token_sources, sampled) -> None:
        embedding.feed_sampled_tokens(token_ids, token_sources, sampled, stream=self.stream)

    def gather_rows(self, indices, source, out) -> None:
        embedding.embedding(indices, source, out, stream=self.stream)

    def linear(self, x, weight, out, norm=None, accumulate=False) -> None:
        linear(
            x,
            weight,
            out,
            kernel=self.variants.product(x.shape[0]),
            norm=norm,
            accumulate=accumulate,
            stream=self.stream,
        )

    def linear_rope_write_kv(
        self, x, weight, qkv, positions, inv_freq, slot_mapping, q, k_cache, v_cache, norm=None
    ) -> None:
        linear_rope_write_kv(
            x,
            weight,
            qkv,
            positions,
            inv_freq,
            slot_mapping,
            q,
            k_cache,
            v_cache,
            kernel=self.variants.product(x.shape[0]),
            norm=norm,
            stream=self.stream,
        )

    def linear_silu_mul(self, x, weight, gate_up, out, norm=None) -> None:
        linear_silu_mul(
            x, weight, gate_up, out, kernel=self.variants.product(x.shape[0]), norm=norm, stream=self.stream
        )

    def prefill_attention(self, q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out) -> None:
        attention_prefill.prefill_attention(
            q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out,
            stream=self.stream, p_precision=self.variants.prefill_p_precision,
        )  # fmt: skip

    def decode_scratch(self, max_seqs: int, config, cascade: bool = False):
        """Split-K's float32 partial results, sized for the whole GPU (any batch), and with
        `cascade` cascade attention's for any batch of up to max_seqs sequences."""
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        rows, columns = attention_split.decode_workspace_shape(heads, kv_heads, head_dim, self.variants.num_sms)
        for seqs in range(1, max_seqs + 1 if cascade else 1):
            # the own parts are at most split-K's: the widest table gives the most
            own, shared = self.variants.cascade_partitions(seqs, kv_heads, 2**31 - 1, (heads // kv_heads, head_dim))
            rows = max(rows, attention_cascade.cascade_workspace_rows(seqs, heads, own, shared))
        return self.empty((rows, columns), np.float32)

    def decode_attention(
        self, q, k_cache, v_cache, block_tables, context_lens, out, scratch, shared_prefix_len=None
    ) -> None:
        shape = decode_shape(q, k_cache, block_tables)
        if shared_prefix_len is None:
            partitions = self.variants.decode_partitions(*shape)
            attention_split.decode_attention(
                q, k_cache, v_cache, block_tables, context_lens, out, scratch, partitions, stream=self.stream
            )
            return
        own, shared = self.variants.cascade_partitions(*shape, (q.shape[1] // k_cache.shape[2], q.shape[2]))
        attention_cascade.cascade_decode_attention(
            q, k_cache, v_cache, block_tables, context_lens, shared_prefix_len, out, scratch, own, shared,
            stream=self.stream,
        )  # fmt: skip

    def decode_reads_shared_prefix(self, num_seqs: int, shared_tokens: int) -> bool:
        return self.variants.cascade(num_seqs, shared_tokens)

    def sample_scratch(self, max_rows: int, vocab: int):
        """The sampler's best value and index of each part of each row, for up to max_rows rows."""
        shape = sampling.sample_workspace_shape(max_rows, vocab)
        return self.empty(shape, np.float32), self.empty(shape, np.int32)

    def sample(self, logits, temperature, top_k, top_p, seeds, positions, out, scratch) -> None:
        part_values, part_indices = scratch
        sampling.sample(
            logits, temperature, top_k, top_p, seeds, positions, out, part_values, part_indices, stream=self.stream
        )

    def apply_penalties(self, logits, token_state, slots, presence, frequency, repetition, mask_stop_tokens) -> None:
        penalties.apply_penalties(
            logits, token_state, slots, presence, frequency, repetition, mask_stop_tokens, stream=self.stream
        )

    def apply_min_p(self, logits, temperature, min_p) -> None:
        penalties.apply_min_p(logits, temperature, min_p, stream=self.stream)

    def count_sampled_tokens(self, token_state, slots, sampled) -> None:
        penalties.count_sampled_tokens(token_state, slots, sampled, stream=self.stream)

    def compute_logprobs(
        self, logits, num_logprobs, sampled, top_ids, top_logprobs, sampled_logprobs, sampled_ranks
    ) -> None:
        logprobs.compute_logprobs(
            logits, num_logprobs, sampled, top_ids, top_logprobs, sampled_logprobs, sampled_ranks, stream=self.stream
        )
