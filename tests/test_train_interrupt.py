"""Ctrl-C during `launch train` on a real 2-node local cluster: one line, exit 130, no rank left running, and with
--teardown the cluster is down too (the same finally block tears an AWS stack down; tests/test_aws_moto.py)."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest
from clusterutil import TINY, alive, assert_one_line_error, cluster_state, launch, launch_background, tiny_shards

pytestmark = pytest.mark.cluster



@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("interrupt")
    return tiny_shards(root / "home", root)


def processes_naming(text: str) -> list[int]:
    """Live processes whose command line holds `text` (the run directory: mpirun's line and every rank's)."""
    found = []
    for f in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text in f.read_bytes().replace(b"\0", b" ").decode(errors="replace") and alive(int(f.parent.name)):
                found.append(int(f.parent.name))
        except OSError:
            continue
    return found


def interrupt_mid_run(home: Path, shards: Path, run: Path, *extra: str) -> subprocess.CompletedProcess:
    proc = launch_background(home, "train", "--data", str(shards), "--epochs", "40", "--output", str(run),
                             *TINY, *extra)
    try:
        deadline = time.monotonic() + 180
        while not (run / "metrics.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        assert processes_naming(str(run)), "no rank is running"
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
    home, run = tmp_path / "home", tmp_path / "run"
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True)
    try:
        proc = interrupt_mid_run(home, shards, run)
        assert proc.returncode == 130
        assert_one_line_error(proc, "interrupted")
        # The pty's hang-up took mpirun down, and mpirun its ranks on both nodes.
        assert wait_until_gone(str(run)) == []
        assert launch(home, "exec", "--", "true").returncode == 0  # the cluster is still up
    finally:
        launch(home, "local", "down")


def test_ctrl_c_with_teardown_brings_the_cluster_down(shards, tmp_path):
    home, run = tmp_path / "home", tmp_path / "run"
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True)
    pids = list(cluster_state(home)["processes"].values())
    try:
        proc = interrupt_mid_run(home, shards, run, "--teardown")
        assert proc.returncode == 130
        assert_one_line_error(proc, "interrupted")
        assert wait_until_gone(str(run)) == []
        assert not any(alive(p) for p in pids)
        assert not (home / "clusters" / "local").exists()
    finally:
        launch(home, "local", "down")
