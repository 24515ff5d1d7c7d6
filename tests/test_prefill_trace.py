"""perf/experiments/prefill_trace.py's arithmetic on kernel events drawn at random (no GPU, no profiler).

The oracle for the idle time is the span less the union of the kernels' intervals, worked out
by merging the sorted intervals; for the durations, their sums by kernel.
"""

from hypothesis import given
from hypothesis import strategies as st

from perf.experiments.prefill_trace import TOP_GAPS, summarize

NAMES = ("gemm_kernel[abi:v3][abi:cw51c](Array<int>)", "rmsnorm[abi:v7][abi:cw51c](Array<int>)")


def event(kind: int, start: float, duration: float) -> dict:
    return {"name": NAMES[kind], "ts": start, "dur": duration, "args": {"grid": [4, 1, 1], "block": [128, 1, 1]}}


@st.composite
def runs(draw):
    """Kernels in start order, each starting before, at or after the previous ones end."""
    events, start = [], draw(st.floats(0, 1e6))
    for _ in range(draw(st.integers(1, 20))):
        start += draw(st.floats(0, 50))
        events.append(event(draw(st.integers(0, 1)), start, draw(st.floats(0.5, 100))))
    return events


def union_length(events: list[dict]) -> float:
    total, current_start, current_end = 0.0, None, None
    for e in sorted(events, key=lambda e: e["ts"]):
        if current_end is None or e["ts"] > current_end:
            total += 0.0 if current_end is None else current_end - current_start
            current_start, current_end = e["ts"], e["ts"] + e["dur"]
        else:
            current_end = max(current_end, e["ts"] + e["dur"])
    return total + current_end - current_start


@given(runs())
def test_idle_time_is_the_span_less_the_kernels_union(events):
    run = summarize(events)
    end = max(e["ts"] + e["dur"] for e in events)
    assert abs(run["span_us"] - (end - events[0]["ts"])) < 1e-6 * max(1.0, end)
    assert abs(run["idle_us"] - (run["span_us"] - union_length(events))) < 1e-6 * max(1.0, end)
    assert len(run["largest_gaps"]) == min(run["gaps"], TOP_GAPS)
    assert all(gap["gap_us"] > 0 for gap in run["largest_gaps"])


@given(runs())
def test_durations_are_summed_by_kernel(events):
    run = summarize(events)
    by_name = {row["kernel"].split("[")[0]: row for row in run["kernels"]}
    for kind, name in enumerate(("gemm_kernel", "rmsnorm")):
        mine = [e["dur"] for e in events if e["name"] == NAMES[kind]]
        if mine:
            assert by_name[name]["launches"] == len(mine)
            assert abs(by_name[name]["us"] - sum(mine)) < 1e-6 * max(1.0, sum(mine))
        else:
            assert name not in by_name
