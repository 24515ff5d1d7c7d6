"""The Backend protocol: the operators the model and the runner call, and the memory,
events and graphs they run on, stated once.

The model (`model/llama.py`) is written once, as a sequence of operator calls on a
backend; the runner adds the sampler's two. Each operator takes its inputs, then the
preallocated arrays it writes: it allocates nothing, so a step can be captured into a
CUDA graph. `NumpyBackend` and `CudaBackend` implement the protocol (tests check both
against it), and the operator check in tests derives its operator table from it.

The annotations say what an operator does with each array: `Output` marks the arrays it
writes its results to (some also read, as `linear`'s out when it accumulates), `Buffer`
an array it may fill with intermediate values that no caller reads, `Weight` a weight
(bf16 bits on the GPU, widened to float32 on the NumPy backend), and `Scratch` a
backend's own workspace, made by `decode_scratch` or `sample_scratch` (None where the
backend needs none).
"""

import inspect
from enum import Enum
from typing import Annotated, Any, Protocol, TypeAlias, get_type_hints

import numpy as np

from tinyvllm.kernels.operands import RMSNorm
from tinyvllm.model.config import ModelConfig


class DeviceArray(Protocol):
    """An array where the backend computes: a Numba device array on the GPU, a NumPy array
    on the host. The model and the runner ask only its shape and dtype, reshape it and
    slice it (slices share its memory)."""

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def dtype(self) -> np.dtype: ...

    def reshape(self, *shape: int) -> "DeviceArray": ...

    def __getitem__(self, index: Any) -> "DeviceArray": ...


class Role(Enum):
    """What an operator does with an array argument (in its annotation)."""

    OUTPUT = "output"
    BUFFER = "buffer"
    WEIGHT = "weight"
    SCRATCH = "scratch"


Output: TypeAlias = Annotated[DeviceArray, Role.OUTPUT]
Buffer: TypeAlias = Annotated[DeviceArray, Role.BUFFER]
Weight: TypeAlias = Annotated[DeviceArray, Role.WEIGHT]
Scratch: TypeAlias = Annotated[Any, Role.SCRATCH]


class ModelOperators(Protocol):
    """The operators of the forward pass (`LlamaModel.forward`)."""

    def embedding(self, token_ids: DeviceArray, table: Weight, out: Output) -> None:
        """out[t] = table[token_ids[t]]."""

    def gather_rows(self, indices: DeviceArray, source: DeviceArray, out: Output) -> None:
        """out[i] = source[indices[i]]: the rows that sample."""

    def linear(
        self, x: DeviceArray, weight: Weight, out: Output, norm: RMSNorm | None = None, accumulate: bool = False
    ) -> None:
        """out = x @ weight^T; of rmsnorm(x) * norm.weight with `norm` (the normed rows may
        go to norm.normed); out += the product with `accumulate`."""

    def linear_rope_write_kv(
        self,
        x: DeviceArray,
        weight: Weight,
        qkv: Buffer,
        positions: DeviceArray,
        inv_freq: DeviceArray,
        slot_mapping: DeviceArray,
        q: Output,
        k_cache: Output,
        v_cache: Output,
        norm: RMSNorm | None = None,
    ) -> None:
        """[q | k | v] = x @ weight^T (`norm` as in `linear`), q and k rotated (RoPE), k and v
        written to the caches at slot_mapping (-1: no write)."""

    def linear_silu_mul(
        self, x: DeviceArray, weight: Weight, gate_up: Buffer, out: Output, norm: RMSNorm | None = None
    ) -> None:
        """out = silu(gate) * up of x @ weight^T, weight's rows interleaving gate and up
        (`norm` as in `linear`)."""

    def prefill_attention(
        self,
        q: DeviceArray,
        k_cache: DeviceArray,
        v_cache: DeviceArray,
        block_tables: DeviceArray,
        cu_seqlens_q: DeviceArray,
        context_lens: DeviceArray,
        out: Output,
    ) -> None:
        """Causal attention of each sequence's query rows over its paged context."""

    def decode_attention(
        self,
        q: DeviceArray,
        k_cache: DeviceArray,
        v_cache: DeviceArray,
        block_tables: DeviceArray,
        context_lens: DeviceArray,
        out: Output,
        scratch: Scratch,
        shared_prefix_len: DeviceArray | None = None,
    ) -> None:
        """Attention of one query row per sequence over its paged context. With
        shared_prefix_len (int32[1]: tokens whose blocks lead every sequence's table), that
        prefix's K and V are read once for all the sequences (cascade attention); the
        result is the same."""


class SamplerOperators(Protocol):
    """The operators the runner calls around the forward pass."""

    def feed_sampled_tokens(self, token_ids: Output, token_sources: DeviceArray, sampled: DeviceArray) -> None:
        """token_ids[t] = sampled[token_sources[t]] where token_sources[t] >= 0: the tokens
        the previous step sampled, into the rows that wait for them."""

    def sample(
        self,
        logits: DeviceArray,
        temperature: DeviceArray,
        top_k: DeviceArray,
        top_p: DeviceArray,
        seeds: DeviceArray,
        positions: DeviceArray,
        out: Output,
        scratch: Scratch,
    ) -> None:
        """out[s] = a token drawn from row s of logits with row s's parameters (0: greedy)."""

    def apply_penalties(
        self,
        logits: Output,
        token_state: DeviceArray,
        slots: DeviceArray,
        presence: DeviceArray,
        frequency: DeviceArray,
        repetition: DeviceArray,
        mask_stop_tokens: DeviceArray,
    ) -> None:
        """Row s of logits, in place, penalized by the state of slot slots[s] (-1: as it is),
        its stop tokens -inf where mask_stop_tokens[s] (min_tokens; `kernels/penalties.py`)."""

    def apply_min_p(self, logits: Output, temperature: DeviceArray, min_p: DeviceArray) -> None:
        """Row s of logits, in place, with the tokens below min_p[s] times the top one's
        probability at -inf (greedy rows and min_p 0 as they are)."""

    def compute_logprobs(
        self,
        logits: DeviceArray,
        num_logprobs: DeviceArray,
        sampled: DeviceArray,
        top_ids: Output,
        top_logprobs: Output,
        sampled_logprobs: Output,
        sampled_ranks: Output,
    ) -> None:
        """For each row s with num_logprobs[s] = n >= 0, of the log-softmax of row s of the raw
        logits: the logprob and rank of token sampled[s], and in top_ids[s, :n] and
        top_logprobs[s, :n] the n most likely tokens, most likely first (`kernels/logprobs.py`).
        Rows with n < 0, and the columns past n, are left as they are."""

    def count_sampled_tokens(self, token_state: Output, slots: DeviceArray, sampled: DeviceArray) -> None:
        """token_state[slots[s], sampled[s]] += 1 where slots[s] >= 0: the output counts, kept current."""


class Memory(Protocol):
    """Where arrays live and how bytes move between the host and them."""

    activation_dtype: np.dtype
    """The dtype of activations and of the KV cache (uint16 = bf16 bits, or float32)."""
    has_device_memory: bool
    """Arrays live in device memory, whose free bytes `memory_info` measures (the KV arena
    is sized from it); False: in host memory, sized by the engine's option."""

    def weight(self, bits: np.ndarray) -> DeviceArray:
        """A bf16 weight (uint16 bits) in the form the operators read."""

    def constant(self, array: np.ndarray) -> DeviceArray:
        """A host array copied as it is."""

    def empty(self, shape: tuple[int, ...], dtype: Any) -> DeviceArray: ...

    def zeros(self, shape: tuple[int, ...], dtype: Any) -> DeviceArray: ...

    def pinned_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        """Host memory the device copies asynchronously."""

    def prefix(self, array: DeviceArray, rows: int) -> DeviceArray:
        """array[:rows], the same memory."""

    def copy(self, source: DeviceArray, out: DeviceArray) -> None:
        """Queue out[...] = source, of the same shape and dtype."""

    def upload_bytes(self, host: np.ndarray, device: DeviceArray, nbytes: int) -> None:
        """Copy the first nbytes of a uint8 host array into a uint8 device array."""

    def upload_row(self, host: np.ndarray, device: DeviceArray, row: int) -> None:
        """Copy a host array into row `row` of a 2-D device array, behind the queued work."""

    def download_async(self, device: DeviceArray, host: np.ndarray, count: int) -> None:
        """Queue a copy of the first `count` elements of a 1-D array into host memory."""

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory (only where has_device_memory)."""

    def decode_scratch(self, max_seqs: int, config: ModelConfig, cascade: bool = False) -> Scratch:
        """`decode_attention`'s scratch, for any batch of up to max_seqs sequences, with or
        without shared_prefix_len as `cascade` says."""

    def decode_reads_shared_prefix(self, num_seqs: int, shared_tokens: int) -> bool:
        """Whether `decode_attention` over num_seqs sequences whose first shared_tokens tokens
        are in the same blocks should be given shared_prefix_len: where it is faster. Never
        yes for fewer shared tokens where it is no for more: a step asks first with the most
        its sequences could share, and skips looking for a shared prefix on a no."""

    def sample_scratch(self, max_rows: int, vocab: int) -> Scratch:
        """`sample`'s scratch, for up to max_rows rows of `vocab` logits."""


class Events(Protocol):
    """Ordering the host and the device's queued work."""

    def new_event(self) -> Any: ...

    def record(self, event: Any) -> None:
        """Mark the work queued so far with `event`."""

    def wait(self, event: Any) -> None:
        """Block the host until the work before `event` is done."""

    def synchronize(self) -> None:
        """Block the host until all queued work is done."""


class Graphs(Protocol):
    """Capturing queued work once and replaying it (only where can_capture_graphs)."""

    can_capture_graphs: bool

    def begin_capture(self) -> None: ...

    def end_capture(self) -> Any:
        """The graph of the work queued since `begin_capture`."""

    def launch_graph(self, graph: Any) -> None: ...


class Backend(ModelOperators, SamplerOperators, Memory, Events, Graphs, Protocol):
    """Everything the model, the runner and the engine ask of a backend."""

    name: str
    """A label for messages ("numpy", "cuda"); behaviour follows the capabilities, not it."""


def methods(protocol: type) -> dict[str, inspect.Signature]:
    """The methods a protocol states (and those of the protocols it is made of), in the
    order they are written, with their signatures less `self`."""
    found = {}
    for base in protocol.__mro__:
        if base is Protocol or not getattr(base, "_is_protocol", False):
            continue
        for name, value in vars(base).items():
            if inspect.isfunction(value) and not name.startswith("_") and name not in found:
                signature = inspect.signature(value)
                found[name] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return found


def parameters_in_role(protocol: type, name: str, role: Role) -> tuple[str, ...]:
    """The parameters of `protocol.name` annotated with `role`."""
    hints = get_type_hints(getattr(protocol, name), include_extras=True)
    return tuple(parameter for parameter, hint in hints.items() if role in getattr(hint, "__metadata__", ()))
