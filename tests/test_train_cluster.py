"""The whole `launch train` path on a real 2-node local cluster: sshd, mpirun, Horovod, 2 CPU ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from clusterutil import (
    ROOT,
    TINY,
    alive,
    assert_one_line_error,
    cluster_state,
    kill_node,
    launch,
    local_cluster_with_shards,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with local_cluster_with_shards(tmp_path_factory.mktemp("train")) as found:
        yield found


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_resume_and_rank_consistency(env):
    root, home = env
    run = root / "run"
    proc = launch(home, "train", "--cluster", "local", "--nodes", "2", "--data", str(root / "shards"),
                  "--epochs", "3", "--output", str(run), *TINY,
                  "--", "--lr-per-256", "0.8", "--log-every", "2", "--dump-rank-params")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "[node0] training resnet18 on 2 rank(s)" in proc.stdout
    assert "run finished: resnet18 on 2 node(s) / 2 rank(s), 3 epochs, top-1" in proc.stdout
    assert "the same run on AWS" in proc.stdout

    rows = metrics(run)
    epochs = [r for r in rows if "epoch_time_s" in r]
    assert [r["epoch"] for r in epochs] == [0, 1, 2]
    assert all({"epoch", "step", "lr", "loss", "images_per_sec"} <= r.keys() for r in rows)
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    final = rows[-1]
    assert 0.0 <= final["top1"] <= final["top5"] <= 1.0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["val_samples"] == 24  # exactly the validation set

    # Horovod kept the ranks in lock-step: both end with identical parameters.
    p0 = torch.load(run / "params-rank0.pt")
    p1 = torch.load(run / "params-rank1.pt")
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)
    assert sorted(p.name for p in run.glob("checkpoint-epoch*.pt")) == [
        "checkpoint-epoch000.pt", "checkpoint-epoch001.pt", "checkpoint-epoch002.pt"]

    # --resume with more epochs continues at epoch 3 from the newest checkpoint, not from scratch.
    proc = launch(home, "train", "--nodes", "2", "--data", str(root / "shards"), "--epochs", "4",
                  "--output", str(run), "--resume", *TINY, "--", "--lr-per-256", "0.8", "--log-every", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "resuming from checkpoint-epoch002.pt: epoch 3" in proc.stdout
    epochs = [r for r in metrics(run) if "epoch_time_s" in r]
    assert [r["epoch"] for r in epochs] == [0, 1, 2, 3]


def test_missing_data_directory(env):
    root, home = env
    proc = launch(home, "train", "--data", str(root / "nowhere"), "--epochs", "1", *TINY)
    assert_one_line_error(proc, "no manifest.json in", "launch data convert")


def test_a_failed_run_leaves_the_cluster_up(env):
    root, home = env
    # 3 training shards of 12 samples per rank at most 24: a batch of 64 cannot be served.
    proc = launch(home, "train", "--data", str(root / "shards"), "--epochs", "1", "--output",
                  str(root / "bad"), *TINY[:4], "--batch-per-gpu", "64")
    # The trainer's own verdict (rank 0 says it once) becomes the launcher's one line.
    assert_one_line_error(proc, "training failed: --batch-per-gpu 64 is larger than the 48 samples the smallest "
                                "rank holds; use a batch of at most 48")
    assert "--batch-per-gpu 64 is larger than the" in proc.stdout
    assert launch(home, "exec", "--", "true").returncode == 0


def test_ddp_engine_over_the_same_cluster(env):
    # The image may lack Horovod: `--engine ddp` trains with torch.distributed (gloo here) from the same plan.
    root, home = env
    run = root / "ddp"
    proc = launch(home, "train", "--data", str(root / "shards"), "--epochs", "1", "--output", str(run),
                  "--engine", "ddp", *TINY, "--", "--dump-rank-params")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "[node0] training resnet18 on 2 rank(s) (ddp)" in proc.stdout
    p0, p1 = torch.load(run / "params-rank0.pt"), torch.load(run / "params-rank1.pt")
    assert all(torch.equal(p0[k], p1[k]) for k in p0)


def test_a_node_lost_mid_run_stops_the_job_and_is_named(env, tmp_path):
    root, _ = env
    home, run = tmp_path / "home", tmp_path / "run"
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "launcher", "train", "--data", str(root / "shards"), "--epochs", "40", "--output",
         str(run), *TINY], cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "SCALETRAIN_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"})
    try:
        deadline = time.monotonic() + 180
        while not (run / "metrics.jsonl").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        # node1 dies: its sshd and everything under it (mpirun's daemon, the rank) at once, like a reclaimed
        # spot instance.
        assert len(kill_node(home, "node1")) > 1, "nothing runs on node1"
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
        launch(home, "local", "down")
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "training failed: node node1 (", "stopped answering")
    assert "node0" not in err.splitlines()[-1].split("stopped answering")[0]


def test_bad_train_options(env):
    root, home = env
    assert_one_line_error(launch(home, "train", "--model", "vgg16"), "unknown model 'vgg16'; choose one of")
    assert_one_line_error(launch(home, "train", "--nodes", "5"), "--nodes 5 is more than the 2 worker")
    assert_one_line_error(launch(home, "train", "--resume"), "--resume needs --output")
    assert_one_line_error(launch(home, "train", "--engine", "mxnet"), "--engine must be one of: horovod, ddp")


def test_teardown_on_failure_brings_the_cluster_down(tmp_path):
    home = tmp_path / "home"
    launch(home, "local", "up", "--loopback", "--nodes", "1", check=True)
    pids = list(cluster_state(home)["processes"].values())
    proc = launch(home, "train", "--data", str(tmp_path / "missing"), "--teardown", *TINY)
    assert_one_line_error(proc, "no manifest.json")
    assert "is down (--teardown)" in proc.stdout
    assert not any(alive(p) for p in pids)


def test_without_data_it_makes_sample_data_on_the_first_node(tmp_path):
    home, run = tmp_path / "home", tmp_path / "run"
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True)
    try:
        proc = launch(home, "train", "--epochs", "1", "--output", str(run), *TINY)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        assert "[node0] making sample data" in proc.stdout and "[node0] converting sample data" in proc.stdout
        assert (run / "shards" / "manifest.json").is_file()
        assert (run / "sample-ilsvrc" / "train").is_dir()
        assert json.loads((run / "summary.json").read_text())["val_samples"] == 200
    finally:
        launch(home, "local", "down")
