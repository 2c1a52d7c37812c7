"""The whole `launch train` path on a real 2-node rehearsal cluster: two machines (own namespaces, roots built by the
image recipe, only /fsx shared), sshd, mpirun from the image's prefix, Horovod, 2 CPU ranks, and the run's record
fetched back to this machine. Data and runs are paths on the nodes: a launcher that read or wrote this machine's
files instead fails here, as it would on AWS."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from clusterutil import (
    SHARDS,
    TINY,
    alive,
    assert_one_line_error,
    cluster_state,
    descendants,
    kill_node,
    launch,
    launch_background,
    needs_root,
    node_run,
    on_host,
    put_on_shared,
    rehearsal_cluster_with_shards,
    up,
)

pytestmark = [pytest.mark.cluster, needs_root]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with rehearsal_cluster_with_shards(tmp_path_factory.mktemp("train")) as found:
        yield found


def fetched(home, run: str, cluster: str = "local"):
    """Where `launch train` brought the run's record on this machine."""
    return home / "runs" / cluster / run.rsplit("/", 1)[1]


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def metrics(run) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_resume_and_rank_consistency(env):
    root, home = env
    run = node_run("resume")
    proc = launch(home, "train", "--cluster", "local", "--nodes", "2", "--data", SHARDS,
                  "--epochs", "3", "--output", run, *TINY,
                  "--", "--lr-per-256", "0.8", "--log-every", "2", "--dump-rank-params")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "[node0] training resnet18 on 2 rank(s)" in proc.stdout
    assert "run finished: resnet18 on 2 node(s) / 2 rank(s), 3 epochs, top-1" in proc.stdout
    assert "the same run on AWS" in proc.stdout

    # The record came back to this machine from node0 (on AWS --teardown deletes the storage it was on).
    record = fetched(home, run)
    assert f"from node0:{run} to {record}" in proc.stdout
    rows = metrics(record)
    epochs = [r for r in rows if "epoch_time_s" in r]
    assert [r["epoch"] for r in epochs] == [0, 1, 2]
    assert all({"epoch", "step", "lr", "loss", "images_per_sec"} <= r.keys() for r in rows)
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    final = rows[-1]
    assert 0.0 <= final["top1"] <= final["top5"] <= 1.0
    summary = json.loads((record / "summary.json").read_text())
    assert summary["ranks"] == 2 and summary["val_samples"] == 24  # exactly the validation set
    assert [c["name"] for c in json.loads((record / "checkpoints.json").read_text())["checkpoints"]] == [
        "checkpoint-epoch000.pt", "checkpoint-epoch001.pt", "checkpoint-epoch002.pt"]

    # Horovod kept the ranks in lock-step: both end with identical parameters (on the shared storage, as on FSx).
    shared = on_host(home, run)
    p0 = torch.load(shared / "params-rank0.pt")
    p1 = torch.load(shared / "params-rank1.pt")
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)
    assert sorted(p.name for p in shared.glob("checkpoint-epoch*.pt")) == [
        "checkpoint-epoch000.pt", "checkpoint-epoch001.pt", "checkpoint-epoch002.pt"]

    # --resume with more epochs continues at epoch 3 from the newest checkpoint, not from scratch.
    proc = launch(home, "train", "--nodes", "2", "--data", SHARDS, "--epochs", "4",
                  "--output", run, "--resume", *TINY, "--", "--lr-per-256", "0.8", "--log-every", "2")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "resuming from checkpoint-epoch002.pt: epoch 3" in proc.stdout
    epochs = [r for r in metrics(record) if "epoch_time_s" in r]
    assert [r["epoch"] for r in epochs] == [0, 1, 2, 3]


def test_missing_data_directory(env):
    root, home = env
    proc = launch(home, "train", "--data", "/fsx/scaletrain/nowhere", "--epochs", "1", *TINY)
    assert_one_line_error(proc, "no manifest.json in /fsx/scaletrain/nowhere on node0", "launch data convert")


def test_a_failed_run_leaves_the_cluster_up(env):
    root, home = env
    # 3 training shards of 12 samples per rank at most 24: a batch of 64 cannot be served.
    proc = launch(home, "train", "--data", SHARDS, "--epochs", "1", "--output", node_run("bad"), *TINY[:4],
                  "--batch-per-gpu", "64")
    # The trainer's own verdict (rank 0 says it once) becomes the launcher's one line.
    assert_one_line_error(proc, "training failed: --batch-per-gpu 64 is larger than the 48 samples the smallest "
                                "rank holds; use a batch of at most 48")
    assert "--batch-per-gpu 64 is larger than the" in proc.stdout
    assert launch(home, "exec", "--", "true").returncode == 0


def test_ddp_engine_over_the_same_cluster(env):
    # The image may lack Horovod: `--engine ddp` trains with torch.distributed (gloo here) from the same plan.
    root, home = env
    run = node_run("ddp")
    proc = launch(home, "train", "--data", SHARDS, "--epochs", "1", "--output", run,
                  "--engine", "ddp", *TINY, "--", "--dump-rank-params")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "[node0] training resnet18 on 2 rank(s) (ddp)" in proc.stdout
    # gloo on the nodes' own interface: their names resolve to nothing, and gloo's fallback is 127.0.0.1
    assert "-x GLOO_SOCKET_IFNAME=eth0" in proc.stdout
    shared = on_host(home, run)
    p0, p1 = torch.load(shared / "params-rank0.pt"), torch.load(shared / "params-rank1.pt")
    assert all(torch.equal(p0[k], p1[k]) for k in p0)


def test_a_node_lost_mid_run_stops_the_job_and_is_named(env, tmp_path):
    root, _ = env
    home = tmp_path / "home"
    # A second cluster beside the module's: its own name and subnet.
    up(home, "--nodes", "2", "--name", "lost", "--subnet", "10.213.21.0/24")
    run = node_run("lost")
    put_on_shared(home, root / "shards", SHARDS, "lost")
    proc = launch_background(home, "train", "--data", SHARDS, "--epochs", "40", "--output", run, *TINY)
    try:
        metrics_file = on_host(home, run, "lost") / "metrics.jsonl"
        deadline = time.monotonic() + 180
        while not metrics_file.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before node1 could be lost:\n" + proc.stdout.read()[-3000:]
        node1 = cluster_state(home, "lost")["processes"]["node1"]
        assert [p for p in descendants(node1) if "training.train" in cmdline(p)], "no rank runs on node1"
        # node1 dies: the machine at once (its namespaces, sshd, mpirun's daemon, the rank), like a reclaimed spot
        # instance.
        kill_node(home, "node1", "lost")
        out, err = proc.communicate(timeout=180)
    finally:
        proc.kill()
        launch(home, "local", "down", "--cluster", "lost")
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "training failed: node node1 (", "stopped answering")
    assert "node0" not in err.splitlines()[-1].split("stopped answering")[0]


def test_bad_train_options(env):
    root, home = env
    assert_one_line_error(launch(home, "train", "--model", "vgg16"), "unknown model 'vgg16'; choose one of")
    assert_one_line_error(launch(home, "train", "--nodes", "5"), "--nodes 5 is more than the 2 worker")
    assert_one_line_error(launch(home, "train", "--resume"), "--resume needs --out")
    assert_one_line_error(launch(home, "train", "--engine", "mxnet"), "--engine must be one of: horovod, ddp")


def test_without_data_it_makes_sample_data_on_the_first_node(env):
    root, home = env
    run = node_run("sample")
    proc = launch(home, "train", "--epochs", "1", "--output", run, *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "[node0] making sample data" in proc.stdout and "[node0] converting sample data" in proc.stdout
    shared = on_host(home, run)
    assert (shared / "shards" / "manifest.json").is_file()
    assert (shared / "sample-ilsvrc" / "train").is_dir()
    assert json.loads((fetched(home, run) / "summary.json").read_text())["val_samples"] == 200


def test_teardown_on_failure_brings_the_cluster_down(env, tmp_path):
    home = tmp_path / "home"
    # A second cluster beside the module's: its own name and subnet.
    state = up(home, "--nodes", "1", "--name", "gone", "--subnet", "10.213.22.0/24")
    pids = list(state["processes"].values())
    netns = list(state["rehearsal"]["netns"].values())
    proc = launch(home, "train", "--data", "/fsx/scaletrain/missing", "--teardown", *TINY)
    assert_one_line_error(proc, "no manifest.json")
    assert "is down (--teardown)" in proc.stdout
    assert not any(alive(p) for p in pids)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in listed for ns in netns)
