"""Host-side latency: percentiles as the serving benchmarks report them (mean, p50 and p99 in
milliseconds), and the garbage collector's share of a block of host work (`CollectorTime`)."""

import gc
import statistics
import time


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


class CollectorTime:
    """The garbage collector's collections of each generation, and their wall time, while the
    `with` block runs (`gc.callbacks`). A list of token ids is a container whose every item a
    collection visits, so admitting long prompts can cost collections as well as the calls."""

    def __enter__(self) -> "CollectorTime":
        self.collections = [0] * len(gc.get_count())
        self.seconds = 0.0
        self._began = 0.0
        gc.callbacks.append(self._note)
        return self

    def __exit__(self, *exc_info) -> None:
        gc.callbacks.remove(self._note)

    def _note(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._began
            self.collections[info["generation"]] += 1

    def summary(self) -> dict:
        """Collections by generation, and their milliseconds in all."""
        return {"collections": self.collections, "ms": 1e3 * self.seconds}
