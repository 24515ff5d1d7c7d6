"""perf/timeline_step.py's arithmetic, on kernel events drawn at random (no GPU, no profiler).

The oracle for each kernel's exposed time is its end minus the previous kernel's end,
worked out here from the drawn chain; the exposed times of a replay add up to its span.
"""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from perf.timeline_step import by_kernel, exposed_times, kernel_label

NAMES = ("tinyvllm::kernels::gemv::gemv_kernel::_3clocals_3e::gemv_normalized[abi:v87][abi:cw51c](Array<unsigned short>)",  # noqa: E501
         "tinyvllm::kernels::attention_decode::_decode_kernel::_3clocals_3e::decode[abi:v42][abi:cw51c](Array<int>)",
         "tinyvllm::kernels::embedding::_feed_kernel[abi:v1][abi:cw51c](Array<int>)")  # fmt: skip
LABELS = ("gemv_normalized[v87] 1056x64", "decode[v42] 8x32x128", "_feed_kernel[v1] 1x256")
SHAPES = (([1056, 1, 1], [64, 1, 1]), ([8, 1, 32], [128, 1, 1]), ([1, 1, 1], [256, 1, 1]))


def event(kind: int, start: float, duration: float) -> dict:
    grid, block = SHAPES[kind]
    return {"name": NAMES[kind], "ts": start, "dur": duration, "args": {"grid": grid, "block": block}}


@st.composite
def replays(draw):
    """Replays of one chain of kernels: each starts before or after the previous one ends."""
    kinds = draw(st.lists(st.integers(0, len(NAMES) - 1), min_size=1, max_size=12))
    chains = []
    for _ in range(draw(st.integers(1, 4))):
        events, end = [], draw(st.floats(0, 1e6))
        for kind in kinds:
            start = end + draw(st.floats(-10, 3)) if events else end
            duration = draw(st.floats(0.5, 100))
            events.append(event(kind, start, duration))
            end = start + duration
        chains.append(events)
    return kinds, chains


def test_labels_name_function_specialisation_and_launch_shape():
    assert [kernel_label(event(kind, 0.0, 1.0)) for kind in range(len(NAMES))] == list(LABELS)


@given(replays())
def test_exposed_times_are_the_gaps_between_ends_and_add_up_to_the_span(drawn):
    kinds, chains = drawn
    chain, span = exposed_times(chains)
    ends = np.array([[e["ts"] + e["dur"] for e in events] for events in chains])
    starts = np.array([events[0]["ts"] for events in chains])
    expected = np.median(np.diff(np.concatenate([starts[:, None], ends], axis=1), axis=1), axis=0)
    np.testing.assert_allclose([step["exposed_us"] for step in chain], expected, rtol=1e-9, atol=1e-6)
    assert span == pytest.approx(float(np.median(ends[:, -1] - starts)))
    assert [step["kernel"] for step in chain] == [LABELS[kind] for kind in kinds]
    table = by_kernel(chain)
    assert sum(row["launches"] for row in table) == len(kinds)
    for row in table:
        mine = [step["exposed_us"] for step in chain if step["kernel"] == row["kernel"]]
        assert row["exposed_us"] == pytest.approx(sum(mine))


def test_replays_of_different_lengths_are_refused():
    with pytest.raises(RuntimeError, match="different kernel counts"):
        exposed_times([[event(0, 0.0, 1.0)], [event(0, 0.0, 1.0), event(1, 1.0, 1.0)]])
