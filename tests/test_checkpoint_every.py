"""--checkpoint-every (issue 34 item 7): mid-epoch checkpoints written off the training loop, their names as every
reader orders them, and a run killed mid-epoch that --resume continues to the very parameters of an uninterrupted
run (2 DDP ranks over loopback)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from test_trainer_inputs import ROOT, finish, rank_env
from test_trainer_inputs import free_port as _free_port

from launcher.execute import jobstep, results
from training import checkpoint, ckptwriter, durable
from training.convert import convert
from training.options import parse_args
from training.sample import make_sample

MID = "checkpoint-epoch001-step00000012.pt"


def test_names_order_by_epoch_then_steps_with_the_epochs_end_last():
    assert checkpoint.checkpoint_name(1) == "checkpoint-epoch001.pt"
    assert checkpoint.checkpoint_name(1, 12) == MID
    names = ["checkpoint-epoch001.pt", MID, "checkpoint-epoch001-step00000009.pt", "checkpoint-epoch000.pt",
             "checkpoint-epoch002-step00000017.pt", "notes.pt", ".checkpoint-epoch003.pt.tmp"]
    newest_first = sorted((n for n in names if checkpoint.name_order(n)), key=checkpoint.name_order, reverse=True)
    assert newest_first == ["checkpoint-epoch002-step00000017.pt", "checkpoint-epoch001.pt", MID,
                            "checkpoint-epoch001-step00000009.pt", "checkpoint-epoch000.pt"]
    # The launcher's readers and the S3 copy's agree with the trainer's.
    index = results.checkpoint_index([results.RemoteFile(n, 1) for n in names])
    assert [e["name"] for e in reversed(index)] == newest_first
    assert index[-1] == {"name": "checkpoint-epoch002-step00000017.pt", "epoch": 2, "step": 17, "bytes": 1}
    assert sorted((n for n in names if durable.CHECKPOINT.match(n)), key=durable.order, reverse=True) == newest_first


def test_what_resume_starts_after_in_epochs():
    def after(*names):
        return results.resumes_after(results.checkpoint_index([results.RemoteFile(n, 1) for n in names]))
    assert after() is None
    assert after("checkpoint-epoch000-step00000003.pt") is None  # nothing whole yet
    assert after("checkpoint-epoch000.pt", "checkpoint-epoch001-step00000009.pt") == 0
    assert after("checkpoint-epoch000.pt", "checkpoint-epoch001-step00000009.pt", "checkpoint-epoch001.pt") == 1


def test_jobstep_reads_the_newest_checkpoint_as_resume_does(tmp_path):
    (tmp_path / "checkpoint-epoch000.pt").write_bytes(b"x")
    (tmp_path / "checkpoint-epoch001-step00000012.pt").write_bytes(b"x")
    assert jobstep.newest_checkpoint_epoch(tmp_path) == 0
    (tmp_path / "checkpoint-epoch001.pt").write_bytes(b"x")
    assert jobstep.newest_checkpoint_epoch(tmp_path) == 1


def test_s3_restores_only_a_newer_checkpoint_mid_epoch_ones_too(tmp_path):
    assert durable.should_restore(None, MID)
    assert durable.should_restore(durable.order("checkpoint-epoch001-step00000009.pt"), MID)
    assert not durable.should_restore(durable.order(MID), MID)
    assert not durable.should_restore(durable.order("checkpoint-epoch001.pt"), MID)
    assert not durable.should_restore(1, MID) and durable.should_restore(0, MID)  # an epoch: its end
    (tmp_path / MID).write_bytes(b"x")
    assert durable.newest_local_epoch(tmp_path) == (1, 12)


def test_mid_epoch_checkpoints_fall_every_n_steps_but_not_on_an_epochs_last():
    steps = 8
    due = [s for s in range(3 * steps) if checkpoint.mid_epoch_due(s, steps, 3)]
    assert due == [2, 5, 8, 11, 14, 17, 20]  # step 23 (the 24th, an epoch's last) is the epoch's own checkpoint
    assert not any(checkpoint.mid_epoch_due(s, steps, 0) for s in range(3 * steps))  # 0: per epoch only
    assert [s for s in range(16) if checkpoint.mid_epoch_due(s, steps, 8)] == []
    assert [s for s in range(16) if checkpoint.mid_epoch_due(s, steps, 7)] == [6, 13]


def test_resume_point_continues_mid_epoch_or_at_the_next_epoch():
    net = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    mid = checkpoint.checkpoint_state(net, opt, scaler, {}, epoch=1, step=11, steps=8)
    assert mid["resume_at"] == [1, 4] and checkpoint.resume_point(mid) == (1, 4)
    end = checkpoint.checkpoint_state(net, opt, scaler, {}, epoch=1, step=15, steps=8)
    assert end["resume_at"] == [2, 0] and checkpoint.resume_point(end) == (2, 0)
    first = checkpoint.checkpoint_state(net, opt, scaler, {}, epoch=0, step=0, steps=8)
    assert checkpoint.resume_point(first) == (0, 1)
    assert checkpoint.resume_point({"epoch": 4}) == (5, 0)  # a checkpoint from before --checkpoint-every
    state = {**mid, "config": {"model": "x"}}
    assert checkpoint.restore(Path(MID), state, net, opt, scaler, 2, steps=8) == (1, 4)
    with pytest.raises(checkpoint.CheckpointError, match="with 8 steps per epoch, this run has 9"):
        checkpoint.restore(Path(MID), state, net, opt, scaler, 2, steps=9)
    assert checkpoint.restore(Path("e.pt"), {**end, "config": {}}, net, opt, scaler, 2, steps=9) == (2, 0)


def test_stale_mid_epoch_checkpoints_keep_the_newest_two_and_none_older_than_an_epochs_end():
    e0, e1 = "checkpoint-epoch000.pt", "checkpoint-epoch001.pt"
    m = [checkpoint.checkpoint_name(1, s) for s in (9, 10, 11)]
    assert checkpoint.stale_mid_epoch([e0, *m]) == [m[0]]
    assert checkpoint.stale_mid_epoch([e0, *m[1:]]) == []
    assert checkpoint.stale_mid_epoch([e0, *m, e1]) == m
    assert checkpoint.stale_mid_epoch([e0, e1, "checkpoint-epoch002-step00000017.pt"]) == []


def test_trim_metrics_drops_the_rows_a_resume_writes_again(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": s} for s in (2, 4, 6, 8, 8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 1')  # a torn last line
    assert checkpoint.trim_metrics(path, 6) == 3
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [2, 4, 6]
    assert checkpoint.trim_metrics(path, 6) == 0
    assert checkpoint.trim_metrics(tmp_path / "none.jsonl", 6) == 0


def test_host_copy_shares_no_memory_and_the_writer_leaves_whole_files_only(tmp_path, monkeypatch):
    state = {"w": torch.ones(3), "nested": [torch.zeros(2), (torch.ones(1), 5)], "cfg": {"a": [1]}}
    host = ckptwriter.to_host(state)
    state["w"].add_(1)
    state["nested"][0].add_(1)
    state["cfg"]["a"].append(2)
    assert torch.equal(host["w"], torch.ones(3)) and torch.equal(host["nested"][0], torch.zeros(2))
    assert host["cfg"] == {"a": [1]} and host["nested"][1][1] == 5

    gate, uploaded = threading.Event(), []
    real = ckptwriter.save_atomic

    def slow_save(obj, path):
        gate.wait(10)
        real(obj, path)
    monkeypatch.setattr(ckptwriter, "save_atomic", slow_save)
    writer = ckptwriter.CheckpointWriter(tmp_path, after=uploaded.append)
    writer.save({"w": torch.ones(2)}, tmp_path / "checkpoint-epoch000-step00000001.pt")
    assert not list(tmp_path.glob("checkpoint-*"))  # the step went on; the file is not there yet
    gate.set()
    for s in (2, 3):
        writer.save({"w": torch.full((2,), float(s))}, tmp_path / checkpoint.checkpoint_name(0, s))
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-epoch000-step00000002.pt",
                                                          "checkpoint-epoch000-step00000003.pt"]
    assert [p.name for p in uploaded] == [checkpoint.checkpoint_name(0, s) for s in (1, 2, 3)]
    assert torch.equal(torch.load(tmp_path / checkpoint.checkpoint_name(0, 3))["w"], torch.full((2,), 3.0))
    assert writer.writes == 3 and writer.stall_s >= 0


def test_a_failed_write_is_raised_in_the_training_loop(tmp_path):
    writer = ckptwriter.CheckpointWriter(tmp_path / "gone")
    writer.save({"w": torch.ones(1)}, tmp_path / "gone" / "checkpoint-epoch000.pt")
    with pytest.raises(FileNotFoundError):
        writer.wait()
    ckptwriter.finish_writes()  # nothing in flight, the error already handed over: quiet


@pytest.mark.parametrize(("value", "said"), [("-1", "--checkpoint-every must be >= 0, got -1"),
                                           ("x", "--checkpoint-every: invalid int value: 'x'")])
def test_trainer_refuses_a_negative_or_non_number(value, said, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--output", "o", "--synthetic", "--checkpoint-every", value])
    assert e.value.code == 2 and capsys.readouterr().err.strip().splitlines() == [f"error: argument {said}"
                                                                                   if value == "x" else
                                                                                   f"error: {said}"]
    assert parse_args(["--output", "o", "--synthetic"]).checkpoint_every == 0
    assert parse_args(["--output", "o", "--synthetic", "--checkpoint-every", "1"]).checkpoint_every == 1


@pytest.mark.parametrize(("value", "said"), [("0", "got 0"), ("-2", "got -2"), ("x", "'x' is not a valid integer")])
def test_launch_train_refuses_zero_negative_and_non_numbers_in_one_line(value, said, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "launcher", "train", "--checkpoint-every", value, "--cluster",
                           "nosuch"], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "--checkpoint-every" in lines[0] and said in lines[0], \
        proc.stderr


# The 2-rank run: 32 training images in shards of 4, 2 per rank per step: 8 steps an epoch, 2 epochs.
RUN = ["--engine", "ddp", "--model", "resnet18", "--image-size", "32", "--batch-per-gpu", "2", "--workers", "0",
       "--threads", "1", "--no-tensorboard", "--warmup-epochs", "0.5", "--epochs", "2", "--log-every", "2",
       "--val-every", "0", "--dump-rank-params", "--checkpoint-every", "3"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ckpt")
    make_sample(root / "src", classes=4, per_class=8, val_per_class=1, seed=0)
    convert(root / "src", root / "out", shard_size=4, seed=0)
    return root / "out"


def ranks(out: Path, data: Path, *extra: str) -> list[subprocess.Popen]:
    port = _free_port()
    return [subprocess.Popen([sys.executable, "-m", "training.train", *RUN, "--data", str(data), "--output",
                              str(out), *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                             env=rank_env(r, 2, port), start_new_session=True) for r in range(2)]


def test_killed_mid_epoch_then_resumed_ends_with_bitwise_the_same_parameters(data, tmp_path):
    straight = tmp_path / "straight"
    results_ = finish(ranks(straight, data))
    assert [rc for rc, _, _ in results_] == [0, 0], results_
    assert sorted(p.name for p in straight.glob("checkpoint-*")) == ["checkpoint-epoch000.pt", "checkpoint-epoch001.pt"]

    run = tmp_path / "run"
    procs = ranks(run, data)
    deadline = time.monotonic() + 120
    while not list(run.glob("checkpoint-epoch001-step*.pt")) and time.monotonic() < deadline:
        time.sleep(0.01)
    for p in procs:  # both ranks, no chance to clean up
        os.killpg(p.pid, signal.SIGKILL)
    finish(procs)
    newest = max((p.name for p in run.glob("checkpoint-*.pt")), key=checkpoint.name_order)
    assert "-step" in newest, f"the run got past its last mid-epoch checkpoint before the kill: {newest}"
    assert not (run / "summary.json").exists()

    resumed = finish(ranks(run, data, "--resume"))
    assert [rc for rc, _, _ in resumed] == [0, 0], resumed
    assert f"resuming from {newest}" in resumed[0][1]
    for r in range(2):
        mine = torch.load(run / f"params-rank{r}.pt")
        theirs = torch.load(straight / f"params-rank{r}.pt")
        assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs), r
    # Each step's metrics once, as the uninterrupted run wrote them (loss aside: a window cut by the kill).
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    rows_straight = [json.loads(x) for x in (straight / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], "epoch_time_s" in r) for r in rows] == [(r["step"], "epoch_time_s" in r) for r in rows_straight]
    assert [r["lr"] for r in rows] == [r["lr"] for r in rows_straight]
    assert len(list(run.glob("checkpoint-epoch001-step*.pt"))) == 0  # stale once epoch 1's end was written


def test_launch_train_passes_the_interval_to_the_trainer_ahead_of_the_users_own_options():
    from launcher.cli.train import _checked
    from launcher.plans import job

    kw = dict(nodes=None, data=None, model="resnet18", image_size=32, epochs=2, batch_per_gpu=2, warmup_epochs=None,
              workers=None, engine="ddp", reducers=0, out=None, output=None, resume=False, teardown=False,
              region=None, profile=None, ready_timeout=0, probe_interval=15, probe_misses=4, stall_timeout=0,
              max_restarts=0, checkpoint_to=None)
    argv = job.trainer_argv("python", _checked(["--seed", "3"], **kw, checkpoint_every=5).spec("/d", "/o"))
    assert argv[-4:] == ["--checkpoint-every", "5", "--seed", "3"]
    assert "--checkpoint-every" not in job.trainer_argv("python", _checked(None, **kw).spec("/d", "/o"))
    assert parse_args(argv[argv.index("--data"):]).checkpoint_every == 5  # the trainer reads it back
    assert _checked(None, **kw).node_check and not _checked(None, **kw, node_check=False).node_check
