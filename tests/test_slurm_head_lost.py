"""A lost head node (issue 24, "faults"): the local cluster's `head` is killed mid-run, as an instance is lost. The
launcher says so in one line, names what went with it and what did not; a run that the lost head started and that
still runs on the nodes is not run over; once it is stopped, `launch train --resume` continues the run directory
from its newest checkpoint, with mpirun from here (the nodes and the shared storage are still there)."""

from __future__ import annotations

import json

import pytest
from clusterutil import (
    SHARDS,
    TINY,
    assert_one_line_error,
    launch,
    launch_background,
    needs_root,
    node_run,
    on_host,
    put_on_shared,
    tiny_shards,
    up,
)
from test_slurm_cluster import submitted, wait_for

from launcher.plans import restarts

pytestmark = [pytest.mark.cluster, needs_root]


def test_a_lost_head_node_is_one_line_and_a_resume_continues_from_the_checkpoints(tmp_path):
    home = tmp_path / "home"
    up(home, "--nodes", "2", "--slurm")
    try:
        put_on_shared(home, tiny_shards(home, tmp_path), SHARDS)
        run = node_run("headless")
        proc = launch_background(home, "train", "--data", SHARDS, "--epochs", "12", *TINY, "--output", run)
        submitted(proc)
        wait_for(lambda: on_host(home, f"{run}/checkpoint-epoch000.pt").exists(), 300, 0.2)
        launch(home, "local", "kill", "head", check=True)
        proc.kill()
        proc.wait(10)
        for args in (["jobs"], ["logs", "1"], ["cancel", "1"]):
            assert_one_line_error(launch(home, *args, "--cluster", "local"), "the head node 'head' does not answer",
                                  "checkpoints are on the shared storage", "launch train --resume --out DIR")
        # The job's step runs on without its controller: a resume now would write the same directory.
        again = ["train", "--data", SHARDS, "--epochs", "12", *TINY, "--output", run, "--resume"]
        # On the job's batch host: the first node of the allocation, which Slurm lists in registration order (node0 or
        # node1), as the step itself recorded it.
        batch_host = on_host(home, f"{run}/{restarts.BATCH_HOST_FILE}").read_text().split()[0]
        assert batch_host in ("node0", "node1"), batch_host
        assert_one_line_error(launch(home, *again), f"a job it started still runs on {batch_host}", "pkill -f")
        launch(home, "exec", "--", "pkill", "-f", "[l]auncher.execute.jobstep")

        def stopped():
            """no job step or trainer left on the nodes"""
            left = launch(home, "exec", "--", "pgrep -f '[l]auncher.execute.jobstep|[t]raining.train' || true")
            return left.returncode == 0 and not [ln for ln in left.stdout.splitlines() if ln.split()[1:]]

        wait_for(stopped, 60)
        done = launch(home, *again)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr
        assert "note: the head node 'head' does not answer" in done.stdout and "not a Slurm job" in done.stdout
        assert "run finished: resnet18 on 2 node(s) / 2 rank(s), 12 epochs" in done.stdout, done.stdout
        epochs = [json.loads(ln)["epoch"] for ln in on_host(home, f"{run}/metrics.jsonl").read_text().splitlines()
                  if '"epoch_time_s"' in ln]
        assert epochs[-1] == 11 and epochs.count(0) == 1, epochs  # epoch 0 not trained again: resumed after it
    finally:
        launch(home, "local", "down")
