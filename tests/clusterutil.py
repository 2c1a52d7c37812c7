"""Helpers for tests that run the real `launch` CLI against a real local cluster: rehearsal nodes (each its own network
namespace, hostname and root built by the image recipe, sharing only /fsx with this machine), or `--loopback` sshd
processes where a test is about that mode."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.local.backend import descendants

ROOT = Path(__file__).resolve().parent.parent


# `launch train` options for a run that takes seconds on CPUs: a small model, small images, small batches.
TINY = ["--model", "resnet18", "--image-size", "32", "--batch-per-gpu", "8", "--warmup-epochs", "0.5",
        "--workers", "1"]


def launch(home: Path, *args: str, timeout: float = 600, check: bool = False,
           cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {**os.environ, "SCALETRAIN_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True,
                          env=env, timeout=timeout, cwd=cwd)
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


def node_cpus(home: Path, node: str, name: str = "local") -> int:
    """The vCPUs the cluster gave a node (its cgroup's quota)."""
    return next(n["cpus"] for n in cluster_state(home, name)["nodes"] if n["name"] == node)


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


def kill_node(home: Path, node: str, name: str = "local") -> list[int]:
    """End a local node at once, as when a spot instance is reclaimed: a rehearsal node's first process (unshare;
    its namespaces go away with every process in them), a loopback node's sshd and everything under it. Returns the
    node's processes, all gone."""
    state = cluster_state(home, name)
    first = state["processes"][node]
    victims = [*descendants(first), first]
    for pid in [first] if state.get("rehearsal") else victims:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while any(alive(p) for p in victims) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(p) for p in victims), f"{node} still has processes after SIGKILL"
    return victims


# Where the tests put the tiny shards on the nodes: on shared storage, as an upload to FSx leaves them.
SHARDS = "/fsx/scaletrain/shards"


def up(home: Path, *args: str) -> dict:
    """`launch local up ARGS` on rehearsal nodes (a first run builds their root: minutes); the cluster's state."""
    # Tests of the launcher-side path (mpirun from the launcher, as on an AWS stack without shared storage) ask for
    # no head node; the Slurm tests say --slurm.
    if "--slurm" not in args and "--loopback" not in args:
        args = (*args, "--no-slurm")
    proc = launch(home, "local", "up", *args, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    name = args[args.index("--name") + 1] if "--name" in args else "local"
    return cluster_state(home, name)


def on_host(home: Path, node_path: str, name: str = "local") -> Path:
    """Where a path on the nodes' shared storage (/fsx/...) is on this machine."""
    rehearsal = cluster_state(home, name)["rehearsal"]
    mount = rehearsal["shared_mount"]
    assert node_path.startswith(mount + "/"), f"{node_path} is not on the nodes' shared storage {mount}"
    return Path(rehearsal["shared_host"]) / node_path[len(mount) + 1:]


def put_on_shared(home: Path, local_dir: Path, node_path: str, name: str = "local") -> str:
    """Copy a directory made on this machine to the cluster's shared storage (an upload to FSx); its path on the
    nodes."""
    shutil.copytree(local_dir, on_host(home, node_path, name))
    return node_path


def node_run(label: str) -> str:
    """A run directory on the nodes' shared storage, unique to one test."""
    return f"/fsx/scaletrain/runs/{label}"


@contextlib.contextmanager
def rehearsal_cluster_with_shards(root: Path, *up_args: str):
    """A rehearsal cluster under root/home (`launch local up UP_ARGS`, default 2 nodes) with the tiny shards on its
    shared storage at SHARDS, for a module of tests; down afterwards. Yields (root, home)."""
    home = root / "home"
    up(home, *(up_args or ("--nodes", "2")))
    try:
        put_on_shared(home, tiny_shards(home, root), SHARDS)
        yield root, home
    finally:
        launch(home, "local", "down")


# Rehearsal nodes are namespaces, mounts and a bridge: root only (tests/test_rehearsal_cluster.py does the same).
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="rehearsal nodes need root (namespaces, mounts)")

