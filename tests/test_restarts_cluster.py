"""Issue 19's first "done when": a 2-node run with --max-restarts 1 whose node1 is killed after the first checkpoint
finishes every epoch with exit 0 and no human step, on rehearsal nodes; and a run without restarts still stops."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
from clusterutil import TINY, assert_one_line_error, launch, launch_background, needs_root, node_run, on_host, up

pytestmark = [pytest.mark.cluster, needs_root]
EPOCHS = 4


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("restarts") / "home"
    up(home, "--nodes", "2")
    yield home
    launch(home, "local", "down")


def _kill_after_first_checkpoint(home, proc, run: str) -> None:
    directory = on_host(home, run)
    deadline = time.monotonic() + 600
    while not list(directory.glob("checkpoint-epoch*.pt")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert list(directory.glob("checkpoint-epoch*.pt")), "no first checkpoint"
    killed = launch(home, "local", "kill", "node1")
    assert killed.returncode == 0, killed.stderr


def test_a_node_killed_after_the_first_checkpoint_is_replaced_and_the_run_finishes(home):
    run = node_run("restart")
    # the sample data (made on node0 in the run directory) gives epochs long enough to kill a node inside one
    proc = launch_background(home, "train", "--nodes", "2", "--epochs", str(EPOCHS), *TINY, "--output", run,
                             "--max-restarts", "1")
    _kill_after_first_checkpoint(home, proc, run)
    out, err = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out[-4000:] + err[-2000:]
    assert "[launch] restart 1 of 1:" in out and "replacing node1" in out
    assert "the run took 1 restart(s)" in out
    metrics = [json.loads(ln) for ln in on_host(home, f"{run}/metrics.jsonl").read_text().splitlines()]
    assert max(m["epoch"] for m in metrics if "epoch" in m) == EPOCHS - 1
    record = json.loads((home / "runs" / "local" / "restart" / "restarts.json").read_text())  # fetched back
    assert record["restarts"] == 1 and record["history"][0]["lost"] == ["node1"]
    assert record["history"][0]["resumed_from_epoch"] >= 1 and record["history"][0]["epochs_lost"] >= 0


def test_without_restarts_a_lost_node_still_stops_the_run_with_one_line(home):
    run = node_run("no-restart")
    proc = launch_background(home, "train", "--nodes", "2", "--epochs", str(EPOCHS), *TINY, "--output", run)
    _kill_after_first_checkpoint(home, proc, run)
    out, err = proc.communicate(timeout=600)
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "training failed: node node1")
    assert "[launch] restart" not in out
    launch(home, "local", "replace", "node1", check=True)
