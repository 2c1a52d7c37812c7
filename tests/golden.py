"""Golden files: compare text with tests/golden/NAME; refresh with UPDATE_GOLDEN=1; fail with a diff."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

GOLDEN = Path(__file__).parent / "golden"


def assert_golden(name: str, actual: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual)
        return
    if not path.exists():
        raise AssertionError(f"no golden file {path}; create it with UPDATE_GOLDEN=1")
    expected = path.read_text()
    if actual != expected:
        diff = "".join(difflib.unified_diff(expected.splitlines(True), actual.splitlines(True),
                                            f"golden/{name}", "actual"))
        raise AssertionError(f"output differs from golden/{name} (refresh with UPDATE_GOLDEN=1):\n{diff}")
