"""The step-input table: every field of one step's metadata, stated once.

A step runs a packed batch: rows [0, num_decode) of the token arrays are decode tokens,
one per sequence, whose sequences are rows [0, num_decode) of `block_tables` and
`context_lens`; the prefill sequences follow, with their query rows given by
`prefill_cu_seqlens` (relative to the first prefill token). `sample_rows` are the token
rows whose logits are needed, and the sampling parameters have one entry per sampled row.
`shared_prefix_len` is the one value of the step: the leading tokens that every decode
sequence holds in the same KV blocks, when decode attention reads them once for all of
those sequences (cascade attention), else 0.

Everything that lists the fields derives from `STEP_FIELDS`: the engine's host step
(`HostStep`) and its buffers (`StepBuffers`: pinned staging, one device area, the views),
the padding of a decode step up to its CUDA-graph bucket and the capture template, and
the device-side `StepInputs` the forward reads. The table lives with the model because
the forward is its reader, and the model imports nothing from the engine.
"""

from dataclasses import make_dataclass
from enum import Enum
from typing import NamedTuple

import numpy as np


class Extent(Enum):
    """What a field has one row for, which fixes its shape."""

    TOKEN = "token"  # [num_tokens]
    SEQUENCE = "sequence"  # [num_seqs]
    SAMPLED_ROW = "sampled row"  # [num_sampled]
    BLOCK_TABLE = "block table"  # [num_seqs, max_blocks_per_seq]
    PREFILL_OFFSETS = "prefill offsets"  # [num_prefill_seqs + 1]
    STEP = "step"  # [1]: one value for the whole step

    def shape(self, num_tokens: int, num_seqs: int, max_blocks_per_seq: int) -> tuple[int, ...]:
        """The field's shape for a step of that many tokens and sequences (at most as many sampled rows)."""
        if self is Extent.TOKEN:
            return (num_tokens,)
        if self is Extent.BLOCK_TABLE:
            return (num_seqs, max_blocks_per_seq)
        if self is Extent.PREFILL_OFFSETS:
            return (num_seqs + 1,)
        if self is Extent.STEP:
            return (1,)
        return (num_seqs,)


class Pad(Enum):
    """Graph padding that is not a fill value."""

    KEEP = "keep"  # unchanged: a decode step has no prefill sequences to pad, and a step value stays
    ROW_INDEX = "row index"  # rows 0..size-1: every row of the padded step samples its own token


class StepField(NamedTuple):
    """One field: its name, extent and dtype, and what a padding row of a decode step holds.

    The pad values make a padding row harmless: it writes no KV (slot -1), attends to one
    token of block 0, samples greedily, and its outputs are never read.
    """

    name: str
    extent: Extent
    dtype: type
    pad: int | float | Pad


# The order is the device layout's, except that the block table always goes last
# (`StepBuffers` copies only the rows a step uses). A new field is one line here.
# --8<-- [start:fields]
STEP_FIELDS = (
    StepField("token_ids", Extent.TOKEN, np.int32, 0),
    StepField("token_sources", Extent.TOKEN, np.int32, -1),  # row of the previous step's samples, or -1
    StepField("positions", Extent.TOKEN, np.int32, 0),
    StepField("slot_mapping", Extent.TOKEN, np.int32, -1),  # -1: write no KV
    StepField("context_lens", Extent.SEQUENCE, np.int32, 1),
    StepField("prefill_cu_seqlens", Extent.PREFILL_OFFSETS, np.int32, Pad.KEEP),
    StepField("shared_prefix_len", Extent.STEP, np.int32, Pad.KEEP),  # tokens all decode rows share (cascade), or 0
    StepField("sample_rows", Extent.SAMPLED_ROW, np.int32, Pad.ROW_INDEX),
    StepField("temperature", Extent.SAMPLED_ROW, np.float32, 0.0),  # 0: greedy
    StepField("top_k", Extent.SAMPLED_ROW, np.int32, -1),  # -1: no top-k
    StepField("top_p", Extent.SAMPLED_ROW, np.float32, 1.0),
    StepField("seeds", Extent.SAMPLED_ROW, np.uint64, 0),
    StepField("sample_positions", Extent.SAMPLED_ROW, np.int64, 0),
    StepField("presence_penalty", Extent.SAMPLED_ROW, np.float32, 0.0),
    StepField("frequency_penalty", Extent.SAMPLED_ROW, np.float32, 0.0),
    StepField("repetition_penalty", Extent.SAMPLED_ROW, np.float32, 1.0),
    StepField("min_p", Extent.SAMPLED_ROW, np.float32, 0.0),
    StepField("penalty_slots", Extent.SAMPLED_ROW, np.int32, -1),  # row of the token state, or -1: none
    StepField("mask_stop_tokens", Extent.SAMPLED_ROW, np.int32, 0),  # 1: fewer than min_tokens generated
    StepField("num_logprobs", Extent.SAMPLED_ROW, np.int32, -1),  # top logprobs to return, or -1: none
    StepField("block_tables", Extent.BLOCK_TABLE, np.int32, 0),
)
# --8<-- [end:fields]
STEP_FIELD_NAMES = tuple(field.name for field in STEP_FIELDS)


def step_class(name: str, module: str, doc: str, array_type: type, counts: tuple[str, ...]) -> type:
    """A slotted dataclass with one `array_type` attribute per table field (in table order),
    then the int attributes `counts`: the host step and the device inputs share this shape.
    Slots make each attribute read a little faster, and the forward reads them every step."""
    fields = [(field.name, array_type) for field in STEP_FIELDS] + [(count, int) for count in counts]
    return make_dataclass(name, fields, slots=True, namespace={"__doc__": doc, "__module__": module})


StepInputs = step_class(
    "StepInputs",
    __name__,
    """One step's device-side metadata: views of the runner's persistent buffers, one per
    `STEP_FIELDS` entry, and the step's token, decode and prefill-sequence counts and its
    `shared_prefix_len` (on the host: which kernels run depends on it).""",
    object,
    ("num_tokens", "num_decode", "num_prefill_seqs", "num_shared_tokens"),
)
