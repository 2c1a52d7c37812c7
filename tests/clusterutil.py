"""Helpers for tests that run the real `launch` CLI against real sshd processes on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def launch(home: Path, *args: str, timeout: float = 600, check: bool = False) -> subprocess.CompletedProcess:
    env = {**os.environ, "SCALETRAIN_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=ROOT)
    if check and proc.returncode != 0:
        raise AssertionError(f"launch {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


def tiny_shards(home: Path, root: Path) -> Path:
    """The tests' small data set: 4 classes, 96 training and 24 validation images, in shards of 12."""
    launch(home, "data", "sample", "--out", str(root / "raw"), "--classes", "4", "--per-class", "24",
           "--val-per-class", "6", check=True)
    launch(home, "data", "convert", str(root / "raw"), "--out", str(root / "shards"), "--shard-size", "12",
           check=True)
    return root / "shards"


def cluster_state(home: Path, name: str = "local") -> dict:
    return json.loads((home / "clusters" / name / "cluster.json").read_text())


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status  # a zombie has exited


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode != 0, proc.stdout
    err = proc.stderr.strip()
    assert "Traceback" not in err, err
    lines = err.splitlines()
    # Output the command relayed (a node's stderr) may come first; the verdict is one last line.
    assert lines and lines[-1].startswith("error: "), err
    assert sum(1 for ln in lines if ln.startswith("error: ")) == 1, err
    for f in fragments:
        assert f in lines[-1], err
