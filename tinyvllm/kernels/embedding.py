"""Token embedding: a gather of table rows.

    out[t, :] = table[token_ids[t], :]        token_ids: int32[T], table: bf16[V, H]

No arithmetic, only bytes: T rows of H bf16 values are read and written, so the kernel
is as fast as its memory traffic. One block per token copies the row 16 bytes (eight
bf16 values) per thread per step.

An id outside [0, V) would read memory that is not the table. The launcher rejects such
ids when `token_ids` is a host NumPy array; a device array cannot be inspected without a
synchronisation, so the engine validates ids on the host, where the tokenizer and the
request produce them, before they reach the device. The kernel still never reads out of
bounds: a row with a bad id is filled with bf16 NaN (0x7FC0), which poisons everything
downstream instead of silently using a wrong row.

Tokens still on the GPU. When the engine runs a step ahead (it launches step n before it
has read step n-1's sampled tokens back), the token a decode row needs is the one step
n-1 sampled, which only the GPU has. `feed_sampled_tokens` copies it into the row's token
id, from the sampled-token buffer the previous step wrote, before the embedding reads it:

    token_ids[t] = sampled[token_sources[t]]    where token_sources[t] >= 0
"""

import numpy as np
from numba import cuda

from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import WARP
from tinyvllm.kernels.device.vector_io import (
    BF16_NAN_PAIR,
    VECTOR,
    check_rows_of_eight,
    load_words,
    store_words,
)

MAX_THREADS = 256


# --8<-- [start:kernel]
@cuda.jit
def _embedding_kernel(token_ids, table, out):
    allow_dependent_launch()
    wait_for_prior_grid()
    token = cuda.blockIdx.x
    token_id = token_ids[token]
    vocab_size, hidden = table.shape
    valid = 0 <= token_id < vocab_size
    nan = np.uint32(BF16_NAN_PAIR)
    for column in range(cuda.threadIdx.x * VECTOR, hidden, cuda.blockDim.x * VECTOR):
        if valid:
            store_words(out[token], column, load_words(table[token_id], column))
        else:
            store_words(out[token], column, (nan, nan, nan, nan))


# --8<-- [end:kernel]


def embedding(token_ids, table, out, *, stream=0) -> None:
    """out[t] = table[token_ids[t]]. Raises ValueError for a host id outside the vocabulary."""
    (num_tokens,) = check_array("token_ids", token_ids, np.int32, (None,))
    vocab_size, hidden = check_rows_of_eight("table", table, (None, None))
    check_rows_of_eight("out", out, (num_tokens, hidden))
    if isinstance(token_ids, np.ndarray):
        bad = np.flatnonzero((token_ids < 0) | (token_ids >= vocab_size))
        if bad.size:
            position = int(bad[0])
            raise ValueError(
                f"token_ids: id {int(token_ids[position])} at position {position} "
                f"is outside the vocabulary [0, {vocab_size})"
            )
        # The one documented per-call allocation: a host array is copied to the device.
        token_ids = cuda.to_device(token_ids, stream=stream)
    if num_tokens == 0:
        return
    threads = min(MAX_THREADS, WARP * -(-(hidden // VECTOR) // WARP))
    launch_kernel(_embedding_kernel, num_tokens, threads, stream, token_ids, table, out)


@cuda.jit
def _feed_kernel(token_ids, token_sources, sampled):
    allow_dependent_launch()
    wait_for_prior_grid()
    row = cuda.grid(1)
    if row < token_ids.shape[0] and token_sources[row] >= 0:
        token_ids[row] = sampled[token_sources[row]]


def feed_sampled_tokens(token_ids, token_sources, sampled, *, stream=0) -> None:
    """token_ids[t] = sampled[token_sources[t]] for every t with token_sources[t] >= 0."""
    (num_tokens,) = check_array("token_ids", token_ids, np.int32, (None,))
    check_array("token_sources", token_sources, np.int32, (num_tokens,))
    check_array("sampled", sampled, np.int32, (None,))
    if num_tokens == 0:
        return
    launch_kernel(_feed_kernel, -(-num_tokens // MAX_THREADS), MAX_THREADS, stream, token_ids, token_sources, sampled)
