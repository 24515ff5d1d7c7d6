"""Choosing the next token: the greedy argmax, and sampling with temperature, top-k, top-p.

One row of logits l[0..V) with temperature T, top_k k and top_p p is sampled from
`reference.sampling_probs` (the kernel computes w_i in float32, the reference in float64):

    K = {i : l_i >= t_k}          t_k the k-th largest logit; K is every token when k = -1
    w_i = exp((l_i - max l) / T)  for i in K
    t_p = the largest logit t with  sum_{i in K, l_i >= t} w_i  >=  p * sum_{i in K} w_i
    P(i) = w_i / sum_{j in K, l_j >= t_p} w_j   for i in K with l_i >= t_p, else 0

Both filters are thresholds on the logit, so tokens tied at an edge are all kept, and the
kept set is {l_i >= t} for one threshold t = t_p (or t_k without top-p: t_p >= t_k always).
T = 0 is greedy: the argmax, the lowest index among ties (as np.argmax).

The thresholds come from a radix select over the logits' bits (`radix_select`): three
passes for each filter, with integer weights, so no thread schedule changes the result.

The draw, by the Gumbel-max trick. If G_i are independent Gumbel variables,

    argmax_{i kept} (l_i / T + G_i)   is distributed as P,

so one pass draws the token with no normaliser. G_i = -log(-log(1 - U_i)), and U_i is a
hash of (seed, offset, i) alone: a counter-based generator, so a token depends on nothing
but its row's logits and parameters, not on the batch around it, and recomputing a token
after preemption (the engine passes the token's position as its offset) draws it again.

An argmax splits: the argmax of a row is the argmax of the argmaxes of its parts, with the
lowest index winning ties at both levels. So is the draw of a row with no filter, whose
score l_i / T + G_i depends on i alone; and the same scores give the same token however
the row is cut. The filters do not split: a threshold needs the whole row's histogram.

One block streaming a row loads ROUND = BLOCK * UNROLL logits at a time (`load_chunk`),
one round after the other: 63 rounds for V = 128256 on the GPU, ~40 us, most of it waiting
on memory while the rest of the GPU idles. So
the rows that need no filter (greedy or unfiltered, `_whole_row_argmax`) are cut into
parts of whole rounds, at most MAX_PARTS of them (`split_vocab`; V = 128256 is 63 parts
of one round) and fewer when the batch is large (MAX_PART_BLOCKS in all), and
`_part_kernel` runs a block per (row, part), which writes its part's best (value, index)
to a workspace. `_sample_kernel`, one block per row, then reduces
such a row's partials, or streams a filtered row whole. Passes over the row: greedy 1,
no filters 1 (each spread over the parts), top-k 4, top-p 5 (one to find max l), both 8.
Logits are finite or -inf (a masked token); a sampled row needs one finite logit.

`sample` launches both kernels. The caller allocates the workspace once, of
`sample_workspace_shape`, so that the launch allocates nothing and can be captured in a
CUDA graph.
"""

import math

import numpy as np
from numba import cuda, float32, float64, int32, uint32, uint64

from tinyvllm.kernels.device.checks import check_array
from tinyvllm.kernels.device.launch import launch_kernel
from tinyvllm.kernels.device.pdl import allow_dependent_launch, wait_for_prior_grid
from tinyvllm.kernels.device.reduce import argmax_better, block_argmax, block_max
from tinyvllm.kernels.device.rng import GUMBEL_MAX, gumbel, stream_key
from tinyvllm.kernels.radix_select import (
    BLOCK,
    MAX_VOCAB,
    RADIX_BINS,
    UNROLL,
    load_chunk,
    ordered_key,
    radix_select,
)
from tinyvllm.kernels.reference import SALTS

ROUND = BLOCK * UNROLL
"""Logits a block loads at once. Parts are whole rounds, so only the row's end needs padding."""
MAX_PARTS = 64
"""Parts per row at most, so the workspace's width is known up front. On the GPU V = 128256
fits in 63 parts of one round: a block's loads are all in flight at once."""
MAX_PART_BLOCKS = 1024
"""Part-kernel blocks at most, over all rows: about as many as the H200's SMs hold at once.
A large batch gets fewer, longer parts per row, since more blocks would only queue (at
batch 256, 63 parts a row measured twice the single-block time)."""

_NO_INDEX = np.int32(2**31 - 1)


def split_vocab(vocab: int, num_rows: int = 1) -> tuple[int, int]:
    """(number of parts, logits per part) of each of num_rows rows of `vocab` logits: parts
    of as few rounds as keep them within MAX_PARTS a row and MAX_PART_BLOCKS in all; the
    last part may be shorter."""
    max_parts = max(1, min(MAX_PARTS, MAX_PART_BLOCKS // num_rows))
    rounds = -(-vocab // (max_parts * ROUND))
    part_size = rounds * ROUND
    return -(-vocab // part_size), part_size


def sample_workspace_shape(max_rows: int, vocab: int) -> tuple[int, int]:
    """The shape of `sample`'s part_values (float32) and part_indices (int32), for any
    batch of up to max_rows rows of `vocab` logits (one row has the most parts)."""
    return max_rows, split_vocab(vocab)[0]


@cuda.jit(device=True, inline=True)
def _whole_row_argmax(temperature, top_k, top_p, vocab):
    """Whether the row's token is an argmax over all of it: greedy, or sampled with no filter."""
    return temperature <= 0 or (not 0 < top_k < vocab and top_p >= 1)


# A candidate is one thread's best (value, index) among the logits it loads; `block_argmax`
# picks the block's best among its threads' candidates.
@cuda.jit(device=True, inline=True)
def _argmax_candidate(logits, row, begin, end):
    chunk = cuda.local.array(UNROLL, float32)
    best_value, best_index = float32(-math.inf), _NO_INDEX
    for start in range(begin + cuda.threadIdx.x, end, ROUND):
        load_chunk(logits, row, start, chunk)
        for j in range(UNROLL):
            i = start + j * BLOCK
            if argmax_better(chunk[j], i, best_value, best_index):
                best_value, best_index = chunk[j], int32(i)
    return best_value, best_index


@cuda.jit(device=True, inline=True)
def _row_max(logits, row, values):
    vocab = logits.shape[1]
    chunk = cuda.local.array(UNROLL, float32)
    best = float32(-math.inf)
    for start in range(cuda.threadIdx.x, vocab, ROUND):
        load_chunk(logits, row, start, chunk)
        for j in range(UNROLL):
            best = max(best, chunk[j])
    return block_max(best, values)


# --8<-- [start:gumbel-argmax]
@cuda.jit(device=True, inline=True)
def _gumbel_candidate(logits, row, begin, end, floor_key, inv_temperature, seed, offset):
    """The Gumbel-max candidate among the tokens of [begin, end) whose key is at least floor_key.

    A token whose l_i / T + GUMBEL_MAX is below the best score so far cannot win: it is
    skipped without hashing, which is most tokens of a peaked row.
    """
    key_1 = stream_key(SALTS[0], seed, uint64(offset))
    key_2 = stream_key(SALTS[1], seed, uint64(offset))
    chunk = cuda.local.array(UNROLL, float32)
    best_value, best_index = float32(-math.inf), _NO_INDEX
    for start in range(begin + cuda.threadIdx.x, end, ROUND):
        load_chunk(logits, row, start, chunk)
        for j in range(UNROLL):
            i = start + j * BLOCK
            scaled = chunk[j] * inv_temperature
            if scaled + GUMBEL_MAX >= best_value and ordered_key(chunk[j]) >= floor_key:
                score = scaled + gumbel(key_1, key_2, i)
                if argmax_better(score, i, best_value, best_index):
                    best_value, best_index = score, int32(i)
    return best_value, best_index


# --8<-- [end:gumbel-argmax]


# --8<-- [start:part-kernel]
@cuda.jit
def _part_kernel(logits, temperature, top_k, top_p, seeds, offsets, part_size, part_values, part_indices):
    """Block (row, part): the best (value, index) of the part, for a whole-row-argmax row.

    Rows are the grid's x dimension, which has no practical limit (y stops at 65535).
    """
    allow_dependent_launch()
    wait_for_prior_grid()
    row = cuda.blockIdx.x
    part = cuda.blockIdx.y
    vocab = logits.shape[1]
    if not _whole_row_argmax(temperature[row], top_k[row], top_p[row], vocab):
        return
    values = cuda.shared.array(BLOCK, float32)
    indices = cuda.shared.array(BLOCK, int32)
    begin = part * part_size
    end = min(begin + part_size, vocab)
    if temperature[row] <= 0:
        value, index = _argmax_candidate(logits, row, begin, end)
    else:
        inv_temperature = float32(1.0) / temperature[row]
        value, index = _gumbel_candidate(logits, row, begin, end, uint64(0), inv_temperature, seeds[row], offsets[row])
    best = block_argmax(value, index, values, indices)
    # block_argmax tells every thread the winning index only; the winner's own thread stores
    # its value, which a recomputed score could round differently.
    if index == best:
        part_values[row, part] = value
        part_indices[row, part] = best


# --8<-- [end:part-kernel]


@cuda.jit(device=True, inline=True)
def _parts_candidate(part_values, part_indices, row, num_parts):
    best_value, best_index = float32(-math.inf), _NO_INDEX
    for part in range(cuda.threadIdx.x, num_parts, BLOCK):
        if argmax_better(part_values[row, part], part_indices[row, part], best_value, best_index):
            best_value, best_index = part_values[row, part], part_indices[row, part]
    return best_value, best_index


# --8<-- [start:sample-kernel]
@cuda.jit
def _sample_kernel(logits, temperature, top_k, top_p, seeds, offsets, part_values, part_indices, num_parts, out):
    allow_dependent_launch()
    wait_for_prior_grid()
    row = cuda.blockIdx.x
    values = cuda.shared.array(BLOCK, float32)
    indices = cuda.shared.array(BLOCK, int32)
    hist_high = cuda.shared.array(RADIX_BINS, uint32)
    hist_low = cuda.shared.array(RADIX_BINS, uint32)
    scan = cuda.shared.array(BLOCK, uint64)
    choice = cuda.shared.array(2, uint64)
    vocab = logits.shape[1]
    if _whole_row_argmax(temperature[row], top_k[row], top_p[row], vocab):
        value, index = _parts_candidate(part_values, part_indices, row, num_parts)
    else:
        inv_temperature = float32(1.0) / temperature[row]
        floor_key = uint64(0)
        if 0 < top_k[row] < vocab:
            floor_key = radix_select(
                logits,
                row,
                floor_key,
                uint64(top_k[row]),
                0.0,
                False,
                float32(0.0),
                inv_temperature,
                hist_high,
                hist_low,
                scan,
                choice,
            )
        if top_p[row] < 1:
            max_logit = _row_max(logits, row, values)
            floor_key = radix_select(
                logits,
                row,
                floor_key,
                uint64(1),
                float64(top_p[row]),
                True,
                max_logit,
                inv_temperature,
                hist_high,
                hist_low,
                scan,
                choice,
            )
        value, index = _gumbel_candidate(logits, row, 0, vocab, floor_key, inv_temperature, seeds[row], offsets[row])
    token = block_argmax(value, index, values, indices)
    if cuda.threadIdx.x == 0:
        out[row] = token


# --8<-- [end:sample-kernel]


def sample(logits, temperature, top_k, top_p, seeds, offsets, out, part_values, part_indices, *, stream=0) -> None:
    """out[s] = a token drawn from row s (module docstring), with row s's own parameters.

    logits float32[S, V]; temperature float32[S] (0 = greedy); top_k int32[S] (-1 = all);
    top_p float32[S] in (0, 1]; seeds uint64[S]; offsets int64[S] (the token's position);
    out int32[S]. part_values float32 and part_indices int32, the workspace: each of shape
    `sample_workspace_shape(R, V)` for any R >= S, contents ignored.
    """
    num_rows, vocab = check_array("logits", logits, np.float32, (None, None))
    if not 0 < vocab < MAX_VOCAB:
        raise ValueError(f"logits: vocabulary of {vocab} tokens, expected 1 to {MAX_VOCAB - 1}")
    for name, array, dtype in (
        ("temperature", temperature, np.float32),
        ("top_k", top_k, np.int32),
        ("top_p", top_p, np.float32),
        ("seeds", seeds, np.uint64),
        ("offsets", offsets, np.int64),
        ("out", out, np.int32),
    ):
        check_array(name, array, dtype, (num_rows,))
    _, workspace_parts = sample_workspace_shape(num_rows, vocab)
    for name, array, dtype in (("part_values", part_values, np.float32), ("part_indices", part_indices, np.int32)):
        workspace_rows, _ = check_array(name, array, dtype, (None, workspace_parts))
        if workspace_rows < num_rows:
            raise ValueError(f"{name}: {workspace_rows} rows, needs at least one per row of logits ({num_rows})")
    if num_rows:
        num_parts, part_size = split_vocab(vocab, num_rows)
        rows = (logits, temperature, top_k, top_p, seeds, offsets)
        launch_kernel(_part_kernel, (num_rows, num_parts), BLOCK, stream, *rows, part_size, part_values, part_indices)
        launch_kernel(_sample_kernel, num_rows, BLOCK, stream, *rows, part_values, part_indices, num_parts, out)
