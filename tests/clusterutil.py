"""Helpers for tests that run the real `launch` CLI against real sshd processes on loopback."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# `launch train` options for a run that takes seconds on CPUs: a small model, small images, small batches.
TINY = ["--model", "resnet18", "--image-size", "32", "--batch-per-gpu", "8", "--warmup-epochs", "1",
        "--workers", "1"]


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


def launch_background(home: Path, *args: str) -> subprocess.Popen:
    """`launch ARGS` started and left running (e.g. a training run to interrupt); the caller communicates."""
    env = {**os.environ, "SCALETRAIN_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=ROOT, text=True, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def kill_node(home: Path, node: str, name: str = "local") -> list[int]:
    """SIGKILL a local node's sshd and everything under it at once, as when a spot instance is reclaimed.
    Returns the pids killed."""
    sshd = cluster_state(home, name)["processes"][node]
    victims = [*descendants(sshd), sshd]
    for pid in victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return victims


@contextlib.contextmanager
def local_cluster_with_shards(root: Path, nodes: int = 2):
    """A local cluster under root/home and the tiny shards under root, for a module of tests; down afterwards."""
    home = root / "home"
    launch(home, "local", "up", "--loopback", "--nodes", str(nodes), check=True)
    try:
        tiny_shards(home, root)
        yield root, home
    finally:
        launch(home, "local", "down")
