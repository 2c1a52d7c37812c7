"""The benchmarks' shared measurement: images per second of this process's CPU time, median over rounds."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_rates(candidates: dict[str, Callable[[], int]], rounds: int) -> dict[str, float]:
    """Each candidate returns the images it processed; one warm-up call each (page cache, imports, allocator),
    then `rounds` interleaved rounds timed with process CPU time (per core, whatever else the machine runs)."""
    for fn in candidates.values():
        fn()
    rates: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, fn in candidates.items():
            start = time.process_time()
            n = fn()
            rates[name].append(n / (time.process_time() - start))
    return {name: statistics.median(r) for name, r in rates.items()}
