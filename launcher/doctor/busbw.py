"""nccl-tests' all_reduce_perf output, parsed: pure (launcher/doctor/checks.py judges it against the catalog)."""

from __future__ import annotations

import re

__all__ = ["parse_bus_bandwidth", "parse_largest_busbw"]


def parse_bus_bandwidth(output: str) -> float | None:
    """nccl-tests' ``# Avg bus bandwidth    : 42.1523`` (GB/s); None when absent."""
    found = re.search(r"#\s*Avg bus bandwidth\s*:\s*([\d.]+)", output)
    return float(found.group(1)) if found else None


def parse_largest_busbw(output: str) -> tuple[int, float] | None:
    """(size in bytes, out-of-place bus bandwidth GB/s) of the largest message all_reduce_perf ran."""
    rows = []
    for line in output.splitlines():
        fields = line.split()
        if len(fields) >= 9 and not line.lstrip().startswith("#") and fields[0].isdigit():
            rows.append((int(fields[0]), float(fields[7])))
    return max(rows) if rows else None
