"""The step-input table and what derives from it: the host step, the staging layout and
device views, the decode graphs' padding and capture template, the forward's inputs.

The oracles are written out here by hand (the shapes, pad values and template of the
design), so a wrong entry in `STEP_FIELDS` fails a test rather than a CUDA-graph replay.
"""

import dataclasses
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.random_llama import TINY_OVERRIDES, make_random_llama_dir
from tinyvllm import LLM, SamplingParams
from tinyvllm.backends.numpy_backend import NumpyBackend
from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.cuda_graphs import pad_decode_step
from tinyvllm.engine.scheduled_batch import ScheduledBatch
from tinyvllm.engine.sequence import Sequence
from tinyvllm.engine.step_inputs import HostStep, StepBuffers, build_step, empty_step, shared_prefix_tokens
from tinyvllm.model.step_fields import STEP_FIELD_NAMES, STEP_FIELDS, StepInputs

LIMITS = ResolvedEngineConfig(block_size=4, max_num_seqs=6, max_num_batched_tokens=40, max_model_len=20)
MAX_BLOCKS = LIMITS.max_blocks_per_seq  # 5

# Shapes at LIMITS (40 tokens, 6 sequences, 5 blocks a sequence) and dtypes, by hand.
EXPECTED_CAPACITY = {
    "token_ids": ((40,), np.int32),
    "token_sources": ((40,), np.int32),
    "positions": ((40,), np.int32),
    "slot_mapping": ((40,), np.int32),
    "context_lens": ((6,), np.int32),
    "prefill_cu_seqlens": ((7,), np.int32),
    "shared_prefix_len": ((1,), np.int32),
    "sample_rows": ((6,), np.int32),
    "temperature": ((6,), np.float32),
    "top_k": ((6,), np.int32),
    "top_p": ((6,), np.float32),
    "seeds": ((6,), np.uint64),
    "sample_positions": ((6,), np.int64),
    "presence_penalty": ((6,), np.float32),
    "frequency_penalty": ((6,), np.float32),
    "repetition_penalty": ((6,), np.float32),
    "min_p": ((6,), np.float32),
    "penalty_slots": ((6,), np.int32),
    "mask_stop_tokens": ((6,), np.int32),
    "num_logprobs": ((6,), np.int32),
    "block_tables": ((6, 5), np.int32),
}


def _decode_batch(count: int) -> ScheduledBatch:
    rng = np.random.default_rng(count)
    seqs = []
    for i in range(count):
        params = SamplingParams(temperature=0.5 + 0.1 * i, top_k=3 + i, top_p=0.9, seed=10 + i)
        seq = Sequence(f"s{i}", rng.integers(0, 200, size=6 + i).tolist(), params)
        seq.num_computed_tokens = seq.num_tokens - 1
        seq.block_table = [3 * i, 3 * i + 1, 3 * i + 2][: -(-seq.num_tokens // LIMITS.block_size)]
        seqs.append(seq)
    return ScheduledBatch(
        seqs=seqs, num_scheduled_tokens=np.ones(count, np.int32), samples=np.ones(count, bool), num_decodes=count
    )


def _mixed_batch() -> ScheduledBatch:
    decoding = Sequence("d", list(range(9)), SamplingParams(temperature=0.0, seed=1))
    decoding.num_computed_tokens, decoding.block_table = 8, [7, 2, 5]
    chunk = Sequence("p", list(range(11)), SamplingParams(temperature=0.7, seed=2))
    chunk.num_computed_tokens, chunk.block_table = 6, [4, 1, 6]
    first = Sequence("f", list(range(30, 37)), SamplingParams(seed=3))
    first.block_table = [0, 3]
    return ScheduledBatch(
        seqs=[decoding, chunk, first],
        num_scheduled_tokens=np.array([1, 5, 4], np.int32),
        samples=np.array([True, True, False]),
        num_decodes=1,
    )


def test_every_derived_structure_has_exactly_the_table_fields():
    assert set(STEP_FIELD_NAMES) == set(EXPECTED_CAPACITY)
    assert [f.name for f in dataclasses.fields(HostStep)] == [*STEP_FIELD_NAMES, "num_decode"]
    assert [f.name for f in dataclasses.fields(StepInputs)] == [
        *STEP_FIELD_NAMES, "num_tokens", "num_decode", "num_prefill_seqs", "num_shared_tokens",
    ]  # fmt: skip
    buffers = StepBuffers(NumpyBackend(), LIMITS)
    for fields in (*buffers.host_fields, buffers.device_fields):
        assert {name: (view.shape, view.dtype) for name, view in fields} == EXPECTED_CAPACITY


def test_build_step_fills_every_field_with_its_table_dtype_and_extent():
    step = build_step(_mixed_batch(), LIMITS.block_size, MAX_BLOCKS)
    # 10 tokens, 3 sequences (2 of them prefill), 2 sampled rows.
    expected_shapes = {"token": (10,), "sequence": (3,), "sampled row": (2,), "block table": (3, 5),
                       "prefill offsets": (3,), "step": (1,)}  # fmt: skip
    for field in STEP_FIELDS:
        array = getattr(step, field.name)
        assert array.dtype == field.dtype, field.name
        assert array.shape == expected_shapes[field.extent.value], field.name


def test_stage_and_views_round_trip_every_field_in_one_aligned_copy():
    backend = NumpyBackend()
    buffers = StepBuffers(backend, LIMITS)
    step = build_step(_mixed_batch(), LIMITS.block_size, MAX_BLOCKS)
    buffers.device[:] = 0xAB
    inputs = buffers.upload(step)
    for name in STEP_FIELD_NAMES:
        np.testing.assert_array_equal(getattr(inputs, name), getattr(step, name), err_msg=name)
    assert (inputs.num_tokens, inputs.num_decode, inputs.num_prefill_seqs) == (10, 1, 2)
    base = buffers.device.__array_interface__["data"][0]
    starts = {name: view.__array_interface__["data"][0] - base for name, view in buffers.device_fields}
    assert all(start % StepBuffers.ALIGNMENT == 0 for start in starts.values())
    assert max(starts, key=starts.get) == "block_tables"
    # The one copy stops at the step's last block-table row: the unused rows keep their bytes.
    tables = dict(buffers.device_fields)["block_tables"]
    assert (tables[3:].view(np.uint8) == 0xAB).all()


def test_padding_rows_hold_the_design_values():
    step = build_step(_decode_batch(3), LIMITS.block_size, MAX_BLOCKS)
    padded = pad_decode_step(step, 5)
    expected_rows = {
        "token_ids": 0, "token_sources": -1, "positions": 0, "slot_mapping": -1, "context_lens": 1,
        "temperature": 0.0, "top_k": -1, "top_p": 1.0, "seeds": 0, "sample_positions": 0, "block_tables": 0,
    }  # fmt: skip
    for name, value in expected_rows.items():
        array, real = getattr(padded, name), getattr(step, name)
        assert array.dtype == real.dtype and array.shape == (5, *real.shape[1:]), name
        np.testing.assert_array_equal(array[:3], real, err_msg=name)
        assert (array[3:] == value).all(), name
    np.testing.assert_array_equal(padded.sample_rows, np.arange(5, dtype=np.int32))
    assert padded.prefill_cu_seqlens is step.prefill_cu_seqlens
    assert padded.shared_prefix_len is step.shared_prefix_len
    assert padded.num_decode == 5


def test_capture_template_is_one_row_of_padding():
    template = pad_decode_step(empty_step(MAX_BLOCKS), 1)
    expected = {
        "token_ids": np.zeros(1, np.int32), "token_sources": np.full(1, -1, np.int32),
        "positions": np.zeros(1, np.int32), "slot_mapping": np.full(1, -1, np.int32),
        "block_tables": np.zeros((1, MAX_BLOCKS), np.int32), "context_lens": np.ones(1, np.int32),
        "prefill_cu_seqlens": np.zeros(1, np.int32), "shared_prefix_len": np.zeros(1, np.int32),
        "sample_rows": np.zeros(1, np.int32),
        "temperature": np.zeros(1, np.float32), "top_k": np.full(1, -1, np.int32), "top_p": np.ones(1, np.float32),
        "seeds": np.zeros(1, np.uint64), "sample_positions": np.zeros(1, np.int64),
    }  # fmt: skip
    for name, value in expected.items():
        array = getattr(template, name)
        assert array.dtype == value.dtype and array.shape == value.shape, name
        np.testing.assert_array_equal(array, value, err_msg=name)
    assert template.num_decode == 1


def _sharing_batch(tables: list[list[int]], lens: list[int]) -> ScheduledBatch:
    seqs = []
    for i, (table, length) in enumerate(zip(tables, lens)):
        seq = Sequence(f"s{i}", list(range(length - 1)), SamplingParams(temperature=0.0))
        seq.num_computed_tokens = length - 1
        seq.append_token(7)
        seq.block_table = table
        seqs.append(seq)
    count = len(seqs)
    return ScheduledBatch(seqs, np.ones(count, np.int32), np.ones(count, bool), num_decodes=count)


@pytest.mark.parametrize(
    "tables, lens, shared",
    [
        ([[3, 4, 5], [3, 4, 9], [3, 4, 8, 1]], [9, 12, 13], 8),  # blocks 3, 4 in all: 8 tokens
        ([[3, 4, 5], [3, 4, 9]], [8, 12], 4),  # the first row's last token is in block 4: its own
        ([[3, 4], [2, 4]], [8, 8], 0),  # the first blocks differ
        ([[3, 4, 5], [3, 4, 5]], [12, 12], 8),  # a table's last block is never shared
        ([[3, 4, 5]], [12], 0),  # one sequence shares with no one
    ],
)
def test_shared_prefix_is_the_whole_blocks_every_decode_row_holds_before_its_last_token(tables, lens, shared):
    asked = []

    def reads_shared_prefix(num_decode, tokens):
        asked.append((num_decode, tokens))
        return True

    step = build_step(_sharing_batch(tables, lens), LIMITS.block_size, MAX_BLOCKS, None, reads_shared_prefix)
    assert step.shared_prefix_len.tolist() == [shared]
    bound = [(len(tables), min(lens) - 1)] if len(tables) > 1 else []  # the most the rows could share
    assert asked == bound + ([(len(tables), shared)] if shared else [])
    refused = build_step(_sharing_batch(tables, lens), LIMITS.block_size, MAX_BLOCKS, None, lambda *_: False)
    unasked = build_step(_sharing_batch(tables, lens), LIMITS.block_size, MAX_BLOCKS)
    assert refused.shared_prefix_len.tolist() == unasked.shared_prefix_len.tolist() == [0]


def test_a_batch_refused_at_the_most_it_could_share_is_not_tested_further():
    """The predicate is asked first with the shortest context less its last token: a no there
    (too few sequences for cascade attention at any length) ends the question."""
    asked = []

    def reads_shared_prefix(num_decode, tokens):
        asked.append((num_decode, tokens))
        return num_decode >= 3

    tables, lens = [[3, 4, 5], [3, 4, 9]], [12, 12]
    step = build_step(_sharing_batch(tables, lens), LIMITS.block_size, MAX_BLOCKS, None, reads_shared_prefix)
    assert step.shared_prefix_len.tolist() == [0]
    assert asked == [(2, 11)]


@given(
    rows=st.integers(2, 6),
    common=st.integers(0, 6),
    lens=st.lists(st.integers(1, 24), min_size=6, max_size=6),
    seed=st.integers(0, 2**16),
)
def test_shared_prefix_tokens_equals_a_column_by_column_walk(rows, common, lens, seed):
    """Random block tables, wide enough for their contexts as the engine's are, whose first
    `common` columns agree (past them rows may differ anywhere, the first column included when
    common is 0), against a walk over whole blocks that stops at the first column the rows
    disagree on or at the block of the shortest context's last token."""
    block_size, context_lens = 4, np.array(lens[:rows], np.int32)
    rng = np.random.default_rng(seed)
    width = -(-int(context_lens.max()) // block_size)
    tables = rng.integers(0, 3, (rows, width)).astype(np.int32)  # few ids: rows agree by chance too
    tables[:, :common] = tables[0, :common]
    expected = 0
    while (expected + 1) * block_size <= context_lens.min() - 1:
        if not (tables[:, expected] == tables[0, expected]).all():
            break
        expected += 1
    assert shared_prefix_tokens(tables, context_lens, block_size) == expected * block_size


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_random_llama_dir(tmp_path_factory.mktemp("tiny"), tokenizer="bytes", config_overrides=TINY_OVERRIDES)


def test_padded_decode_step_samples_the_same_tokens_on_its_real_rows(tiny_model):
    llm = LLM(tiny_model, backend="numpy", block_size=LIMITS.block_size, max_num_seqs=8, max_model_len=64)
    runner = llm.engine.runner
    batch = _decode_batch(3)
    # Sequence 0 owns block 0, which padding rows read: a padding row that wrote KV would show.
    for seq in batch.seqs:  # fill the cache: each prompt but its last token
        prefill = ScheduledBatch(
            seqs=[seq], num_scheduled_tokens=np.array([seq.num_tokens - 1], np.int32),
            samples=np.array([False]), num_decodes=0,
        )  # fmt: skip
        seq.num_computed_tokens = 0
        runner.execute(prefill)
        seq.num_computed_tokens = seq.num_tokens - 1
    step = build_step(batch, LIMITS.block_size, runner.limits.max_blocks_per_seq)
    expected = runner.execute(batch)
    expected_logits = runner.workspace.logits[:3].copy()
    for size in (4, 8):
        runner.forward_and_sample(runner.buffers.upload(pad_decode_step(step, size)))
        np.testing.assert_array_equal(runner.buffers.sampled[:3], expected, err_msg=f"padded to {size}")
        np.testing.assert_allclose(runner.workspace.logits[:3], expected_logits, rtol=1e-5, atol=1e-5)


DUMMY_LINE = '    StepField("dummy", Extent.SEQUENCE, np.float32, 7.0),\n'

DUMMY_CHECK = """
import dataclasses
import numpy as np
from tinyvllm.backends.numpy_backend import NumpyBackend
from tinyvllm.engine.cuda_graphs import pad_decode_step
from tinyvllm.config import ResolvedEngineConfig
from tinyvllm.engine.step_inputs import HostStep, StepBuffers, empty_step
import tinyvllm
from tinyvllm.model.step_fields import StepInputs

assert tinyvllm.__file__.startswith(__import__("os").getcwd()), tinyvllm.__file__
limits = ResolvedEngineConfig(block_size=4, max_num_seqs=6, max_num_batched_tokens=40, max_model_len=20)
assert "dummy" in [f.name for f in dataclasses.fields(HostStep)]
assert "dummy" in [f.name for f in dataclasses.fields(StepInputs)]
buffers = StepBuffers(NumpyBackend(), limits)
for fields in (*buffers.host_fields, buffers.device_fields):
    view = dict(fields)["dummy"]
    assert view.shape == (6,) and view.dtype == np.float32
assert empty_step(5).dummy.shape == (0,)
step = pad_decode_step(empty_step(5), 3)
step.dummy[:2] = [1.5, 2.5]
padded = pad_decode_step(step, 4)
assert padded.dummy.tolist() == [1.5, 2.5, 7.0, 7.0], padded.dummy
assert buffers.upload(padded).dummy.tolist() == [1.5, 2.5, 7.0, 7.0]
base = buffers.device.__array_interface__["data"][0]
starts = {name: view.__array_interface__["data"][0] - base for name, view in buffers.device_fields}
assert max(starts, key=starts.get) == "block_tables", starts
print("dummy field derived everywhere")
"""


def test_a_new_field_is_one_line_in_the_table(tmp_path):
    package = Path(__file__).resolve().parent.parent / "tinyvllm"
    copy = tmp_path / "tinyvllm"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    table = copy / "model" / "step_fields.py"
    lines = table.read_text().splitlines(keepends=True)
    last = max(i for i, line in enumerate(lines) if line.startswith("    StepField("))
    table.write_text("".join(lines[: last + 1] + [DUMMY_LINE] + lines[last + 1 :]))
    result = subprocess.run(
        [sys.executable, "-c", DUMMY_CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "dummy field derived everywhere" in result.stdout
