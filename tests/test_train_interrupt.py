"""Ctrl-C during `launch train` on a real 2-node rehearsal cluster (each node its own machine, sharing only /fsx): one
line, exit 130, no rank left running on any node, and with --teardown the cluster is down too (the same finally block
tears an AWS stack down; tests/test_aws_moto.py)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from clusterutil import (
    SHARDS,
    TINY,
    alive,
    assert_one_line_error,
    cluster_state,
    descendants,
    launch,
    launch_background,
    needs_root,
    node_run,
    on_host,
    put_on_shared,
    tiny_shards,
    up,
)

pytestmark = [pytest.mark.cluster, needs_root]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("interrupt")
    return tiny_shards(root / "home", root)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds `text` (the run directory: mpirun's line and every rank's), on any
    node: this machine sees every node's processes."""
    found = []
    for f in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in f.read_bytes().replace(b"\0", b" ").decode(errors="replace") and alive(int(f.parent.name)):
                found.append(int(f.parent.name))
        except OSError:
            continue
    return found


def interrupt_mid_run(home: Path, shards: Path, run: str, *extra: str) -> subprocess.CompletedProcess:
    put_on_shared(home, shards, SHARDS)
    proc = launch_background(home, "train", "--data", SHARDS, "--epochs", "40", "--output", run, *TINY, *extra)
    try:
        metrics = on_host(home, run) / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not metrics.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        ranks = [p for p in processes_naming(f"-m training.train --data {SHARDS} --output {run}")
                 if "mpirun" not in cmdline(p)]
        nodes = cluster_state(home)["processes"]
        assert len(ranks) >= 2 and all(any(r in descendants(n) for r in ranks) for n in nodes.values()), \
            "no rank is running on one of the nodes"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def wait_until_gone(text: str, timeout: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := processes_naming(text)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def test_ctrl_c_stops_the_job_and_leaves_the_cluster_up(shards, tmp_path):
    home, run = tmp_path / "home", node_run(tmp_path.name)
    up(home, "--nodes", "2")
    try:
        proc = interrupt_mid_run(home, shards, run)
        assert proc.returncode == 130
        assert_one_line_error(proc, "interrupted")
        # The pty's hang-up took mpirun down, and mpirun its ranks on both nodes.
        assert wait_until_gone(run) == []
        assert launch(home, "exec", "--", "true").returncode == 0  # the cluster is still up
    finally:
        launch(home, "local", "down")


def test_ctrl_c_with_teardown_brings_the_cluster_down(shards, tmp_path):
    home, run = tmp_path / "home", node_run(tmp_path.name)
    pids = list(up(home, "--nodes", "2")["processes"].values())
    try:
        proc = interrupt_mid_run(home, shards, run, "--teardown")
        assert proc.returncode == 130
        assert_one_line_error(proc, "interrupted")
        assert wait_until_gone(run) == []
        assert not any(alive(p) for p in pids)
        assert not (home / "clusters" / "local").exists()
    finally:
        launch(home, "local", "down")
