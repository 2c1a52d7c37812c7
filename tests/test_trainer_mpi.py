"""The trainer itself under real `mpirun`: 2 CPU ranks, real Horovod and real torch.distributed (gloo).

No sshd here (tests/test_train_cluster.py runs the launcher's whole path); these runs start
`mpirun -np 2 python -m training.train ...` directly, as the launcher's plan does on the first node.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from clusterutil import ROOT, tiny_shards

pytestmark = pytest.mark.mpi

# Tiny and fast on 2 CPU ranks; 4 classes, 96 training and 24 validation images in shards of 12.
TINY = ["--model", "resnet18", "--image-size", "32", "--batch-per-gpu", "8", "--workers", "1", "--threads", "1",
        "--warmup-epochs", "0.5", "--lr-per-256", "0.8", "--log-every", "2"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mpirun_argv(*args: str, ranks: int = 2) -> list[str]:
    argv = ["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
            "--mca", "pml", "ob1", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo",
            "--mca", "oob_tcp_if_include", "lo",
            "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS=1", "-x", "HOROVOD_GLOO_IFACE=lo", "-x", "MASTER_ADDR",
            "-x", "MASTER_PORT", "-x", "GLOO_SOCKET_IFNAME=lo"]
    if os.geteuid() == 0:
        argv.insert(1, "--allow-run-as-root")
    return argv + [sys.executable, "-m", "training.train", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def train(*args: str, ranks: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(mpirun_argv(*args, ranks=ranks), capture_output=True, text=True, env=env(),
                          timeout=timeout, cwd=ROOT)


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def params(run: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(run / f"params-rank{rank}.pt")


def assert_ranks_identical(run: Path) -> None:
    p0, p1 = params(run, 0), params(run, 1)
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)


def verdict_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith("error: ")]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("trainer")
    home = root / "home"
    return tiny_shards(home, root)


@pytest.fixture(scope="module")
def reference(shards, tmp_path_factory) -> Path:
    """Horovod, fp32, 3 epochs without interruption: the run the others are compared with."""
    run = tmp_path_factory.mktemp("reference") / "run"
    ok(train("--data", str(shards), "--output", str(run), "--epochs", "3", *TINY, "--dump-rank-params"))
    return run


def test_horovod_ranks_agree_loss_falls_and_validation_is_exact(reference):
    assert_ranks_identical(reference)
    rows = metrics(reference)
    epochs = [r for r in rows if "epoch_time_s" in r]
    assert [r["epoch"] for r in epochs] == [0, 1, 2]
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    summary = json.loads((reference / "summary.json").read_text())
    assert summary["engine"] == "horovod" and summary["ranks"] == 2
    assert summary["val_samples"] == 24 and 0 <= summary["top1"] <= summary["top5"] <= 1
    assert rows[-1]["top1"] == summary["top1"]



def test_every_rank_records_each_steps_phases_for_the_jobs_step(reference):
    """training/progress.py's files, read as the job's step reads them (launcher/plans/stragglers.py): one per rank,
    named by its node, every step of every epoch once, in order, each phase's time recorded."""
    import socket

    from launcher.plans import stragglers

    host = socket.gethostname().split(".")[0]
    files = sorted(p.name for p in (reference / "progress").iterdir())
    assert files == [f"rank-0@{host}.tsv", f"rank-1@{host}.tsv"]
    summary = json.loads((reference / "summary.json").read_text())
    for name in files:
        times = [stragglers.parse(ln) for ln in (reference / "progress" / name).read_text().splitlines()]
        assert [t.step for t in times] == list(range(summary["epochs"] * summary["steps_per_epoch"]))
        assert all(t.forward > 0 and t.backward > 0 and t.optimizer > 0 and t.data >= 0 for t in times)
        assert all(b.start >= a.start for a, b in zip(times, times[1:], strict=False))

def test_killed_then_resumed_run_ends_with_the_same_parameters(shards, reference, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(mpirun_argv("--data", str(shards), "--output", str(run), "--epochs", "3", *TINY,
                                        "--dump-rank-params"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env(), cwd=ROOT,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while not (run / "checkpoint-epoch000.pt").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # mpirun and both ranks, mid-run, no chance to clean up
    proc.wait()
    assert not (run / "summary.json").exists(), "the run finished before it could be killed"

    proc = ok(train("--data", str(shards), "--output", str(run), "--epochs", "3", *TINY, "--dump-rank-params",
                    "--resume"))
    assert "resuming from checkpoint-epoch00" in proc.stdout
    resumed, straight = params(run, 0), params(reference, 0)
    assert all(torch.allclose(resumed[k], straight[k], rtol=0, atol=1e-6) for k in straight)
    assert_ranks_identical(run)


def test_ddp_engine_trains_like_horovod(shards, reference, tmp_path):
    run = tmp_path / "run"
    ok(train("--data", str(shards), "--output", str(run), "--epochs", "3", *TINY, "--dump-rank-params",
             "--engine", "ddp"))
    assert json.loads((run / "summary.json").read_text())["engine"] == "ddp"
    assert_ranks_identical(run)
    # Same seed, same data, same averaged gradients: the two engines end within float rounding of each other.
    ddp, hvd = params(run, 0), params(reference, 0)
    assert all(torch.allclose(ddp[k], hvd[k], rtol=1e-4, atol=1e-5) for k in hvd)


def fp16_run(shards: Path, run: Path, *extra: str) -> tuple[dict, list[dict]]:
    ok(train("--data", str(shards), "--output", str(run), "--epochs", "1", *TINY, "--image-size", "16",
             "--precision", "fp16", "--log-every", "1", "--dump-rank-params", "--no-tensorboard", *extra))
    assert_ranks_identical(run)
    return json.loads((run / "summary.json").read_text()), [r for r in metrics(run) if "loss_scale" in r]


def test_fp16_static_loss_scale_is_fixed_and_an_overflowing_scale_skips_every_step(shards, tmp_path):
    # fp16 arithmetic on CPU is slow (about 3 images/s here): a few steps show each behaviour.
    summary, rows = fp16_run(shards, tmp_path / "static", "--loss-scale", "1024", "--steps-per-epoch", "2")
    assert {r["loss_scale"] for r in rows} == {1024.0} and summary["skipped_steps"] == 0 and len(rows) == 2

    # A scale so large that every fp16 gradient overflows: every step is skipped, the weights never move.
    summary, rows = fp16_run(shards, tmp_path / "inf", "--loss-scale", "1e30", "--steps-per-epoch", "2")
    assert summary["skipped_steps"] == summary["steps_per_epoch"] == 2
    assert all(r["loss_scale"] == pytest.approx(1e30) for r in rows)  # held, not backed off (1e30 as a float32)
    torch.manual_seed(0)
    from training.model import build_model
    initial = dict(build_model("resnet18", 4).named_parameters())
    final = params(tmp_path / "inf", 0)
    assert all(torch.equal(final[k], initial[k].detach()) for k in final)


def test_fp16_dynamic_scale_backs_off_on_inf_then_trains(shards, tmp_path):
    # From 2^18 the first three steps overflow (2^18, 2^17, 2^16); the fourth, at 2^15, applies.
    summary, rows = fp16_run(shards, tmp_path / "dynamic", "--initial-loss-scale", str(2.0**18), "--steps-per-epoch",
                             "4")
    scales = [r["loss_scale"] for r in rows]
    assert scales[0] < 2.0**18 and scales == sorted(scales, reverse=True)  # halved on every overflow
    assert 0 < summary["skipped_steps"] < summary["steps_per_epoch"]       # skipped some, applied the rest


def test_synthetic_backward_passes_fp16_compression_val_every_and_tensorboard(shards, tmp_path):
    run = tmp_path / "synthetic"
    ok(train("--synthetic", "--output", str(run), "--epochs", "2", "--steps-per-epoch", "3", "--num-classes", "10",
             *TINY, "--backward-passes-per-step", "2", "--fp16-allreduce", "--dump-rank-params"))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["synthetic"] and summary["train_images"] == 2 * 3 * 16 and summary["top1"] is None
    assert summary["steady_images_per_sec"] > 0
    assert_ranks_identical(run)
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))

    run = tmp_path / "val-every"
    ok(train("--data", str(shards), "--output", str(run), "--epochs", "2", *TINY, "--val-every", "1",
             "--no-decay-bn-bias", "--label-smoothing", "0.1", "--decay", "cosine"))
    assert [r["epoch"] for r in metrics(run) if "top1" in r] == [0, 1]


def test_checkpoint_of_another_model_is_refused(shards, reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference, run)
    proc = train("--data", str(shards), "--output", str(run), "--epochs", "4", *TINY, "--model", "resnet34",
                 "--resume", timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert verdict_lines(proc.stderr) == [
        "error: checkpoint checkpoint-epoch002.pt was made by resnet18, not resnet34; "
        "use another --output or the same --model"]


def test_a_rank_without_shards_and_a_batch_too_big_are_one_line_errors(shards, tmp_path):
    proc = train("--data", str(shards), "--output", str(tmp_path / "a"), "--epochs", "1", *TINY,
                 "--batch-per-gpu", "64", timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert verdict_lines(proc.stderr) == ["error: --batch-per-gpu 64 is larger than the 48 samples the smallest "
                                          "rank holds; use a batch of at most 48"]

    one_shard = tmp_path / "one"
    one_shard.mkdir()
    manifest = json.loads((shards / "manifest.json").read_text())
    manifest["shards"] = [s for s in manifest["shards"] if s["name"] != "train-000000.tar"][:1] + [
        s for s in manifest["shards"] if s["split"] == "val"]
    for s in manifest["shards"]:
        shutil.copy(shards / s["name"], one_shard / s["name"])
    (one_shard / "manifest.json").write_text(json.dumps(manifest))
    proc = train("--data", str(one_shard), "--output", str(tmp_path / "b"), "--epochs", "1", *TINY, timeout=120)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert verdict_lines(proc.stderr) == ["error: 1 training shard(s) for 2 ranks: every rank needs one; convert "
                                          "with a smaller --shard-size"]


def test_a_corrupt_shard_on_one_rank_stops_the_job_without_a_hang(shards, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(shards, broken)
    victim = sorted(broken.glob("train-*.tar"))[1]  # rank 1 reads shards 1, 3, 5, ...
    victim.write_bytes(victim.read_bytes()[:700])   # truncated mid-member
    start = time.monotonic()
    proc = train("--data", str(broken), "--output", str(tmp_path / "run"), "--epochs", "2", *TINY, timeout=180)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    lines = verdict_lines(proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: rank 1: "), proc.stderr
    assert time.monotonic() - start < 180
