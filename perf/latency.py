"""Latency percentiles as the serving benchmarks report them: mean, p50 and p99 in milliseconds."""

import statistics


def summary(values_s: list[float]) -> dict:
    """Mean, p50 and p99 of latencies given in seconds, in milliseconds (None for none)."""
    ms = sorted(1000 * value for value in values_s)
    if not ms:
        return {"mean": None, "p50": None, "p99": None}
    return {"mean": statistics.fmean(ms), "p50": percentile(ms, 50), "p99": percentile(ms, 99)}


def percentile(sorted_values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (NumPy's default)."""
    position = (len(sorted_values) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)
