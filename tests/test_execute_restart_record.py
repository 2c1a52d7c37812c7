"""The restart record as the cluster's shell keeps it, tested without a cluster: launcher/execute/restartlog.py (the
job's step reads and extends restarts.json and asks Slurm to requeue) and launcher/execute/recovery.py (the launcher
finds the newest whole checkpoint and writes the record on the first node), each against a real run directory on
disk and, for Slurm, a fake `scontrol` that answers as Slurm does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.cluster import Cluster, Node
from launcher.execute import recovery, remote, restartlog
from launcher.plans import restarts


def _restart(attempt: int, epoch: int) -> restarts.Restart:
    return restarts.Restart(attempt=attempt, why="node lost", lost=[f"node{attempt}"], resumed_from_epoch=epoch,
                            epochs_lost=0.5, progress=[epoch, 3, 10])


def test_the_record_is_extended_whole_and_read_back(tmp_path) -> None:
    assert restartlog.history(tmp_path) == []                       # no record yet
    restartlog.append(tmp_path, [], _restart(1, 2))
    first = restartlog.history(tmp_path)
    restartlog.append(tmp_path, first, _restart(2, 4))
    data = json.loads((tmp_path / restarts.RECORD_FILE).read_text())
    assert data["restarts"] == 2 and data["epochs_lost"] == 1.0
    assert [(h["attempt"], h["lost"], h["resumed_from_epoch"]) for h in data["history"]] == [
        (1, ["node1"], 2), (2, ["node2"], 4)]
    assert [p.name for p in tmp_path.iterdir()] == [restarts.RECORD_FILE]   # written aside and renamed: no temp left


def test_an_unreadable_record_is_no_history_not_a_crash(tmp_path) -> None:
    (tmp_path / restarts.RECORD_FILE).write_text('{"history": [')   # cut short by a node that died mid-write
    assert restartlog.history(tmp_path) == []


@pytest.fixture
def scontrol(tmp_path, monkeypatch):
    """`scontrol requeue` answering as Slurm 22.05 does; the answer chosen by each test (ANSWER: ok, pending, done)."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "scontrol").write_text(
        '#!/bin/sh\necho "$*" >> "$CALLS"\ncase "$ANSWER" in\n'
        "  ok) exit 0 ;;\n"
        '  pending) echo "Requeue of JobId=$2 returned an error: Job is pending execution" >&2; exit 1 ;;\n'
        '  done) echo "Requeue of JobId=$2 returned an error: Job/step already completing or completed" >&2;'
        " exit 1 ;;\nesac\n")
    (bin_ / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CALLS", str(tmp_path / "calls"))
    return tmp_path / "calls"


@pytest.mark.parametrize(("answer", "pending_ok", "refused"), [
    ("ok", False, None),
    ("pending", True, None),                                   # Slurm requeued it first: no refusal
    ("pending", False, "Job is pending execution"),
    ("done", True, "Job/step already completing or completed"),
])
def test_requeue_says_why_slurm_refused_or_nothing(scontrol, monkeypatch, answer, pending_ok, refused) -> None:
    monkeypatch.setenv("ANSWER", answer)
    said = restartlog.requeue("4242", pending_ok=pending_ok)
    assert scontrol.read_text() == "requeue 4242\n"
    assert (said is None) if refused is None else (refused in said)


@pytest.fixture
def first_node(tmp_path, monkeypatch) -> tuple[Cluster, Node]:
    """The first node's shell is this machine's bash (remote.check and remote.put_text, as over SSH)."""
    node = Node(name="node0", address="127.0.0.1", port=22, role="worker", slots=1, cpus=1, workdir=str(tmp_path))
    c = Cluster(name="local", backend="local", nodes=[node], user="u", ssh_config="/s", known_hosts="/k",
                python=sys.executable)

    def check(cluster, n, command, *, timeout_s=None):
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
        return done.returncode, done.stdout

    def put_text(cluster, n, text, path, mode=0o600):
        Path(path).write_text(text)
        os.chmod(path, mode)

    monkeypatch.setattr(remote, "check", check)
    monkeypatch.setattr(remote, "put_text", put_text)
    return c, node


@pytest.mark.parametrize(("files", "epoch"), [
    ([], None),
    (["checkpoint-epoch000.pt"], 0),
    (["checkpoint-epoch000.pt", "checkpoint-epoch001.pt", "checkpoint-epoch002.pt"], 2),
    (["checkpoint-epoch001.pt", "checkpoint-epoch002-step00000350.pt"], 1),     # mid-epoch 2: epoch 1 whole
    (["checkpoint-epoch001.pt", ".checkpoint-epoch002.pt.tmp"], 1),             # being written: not yet
])
def test_the_newest_whole_checkpoint_is_read_on_the_first_node(first_node, tmp_path, files, epoch) -> None:
    c, node = first_node
    out = tmp_path / "run"
    out.mkdir()
    for name in files:
        (out / name).write_bytes(b"weights")
    assert recovery.newest_checkpoint_epoch(c, node, str(out)) == epoch


def test_a_run_directory_that_is_gone_has_no_checkpoint(first_node, tmp_path) -> None:
    c, node = first_node
    assert recovery.newest_checkpoint_epoch(c, node, str(tmp_path / "missing")) is None


def test_the_record_written_on_the_first_node_replaces_the_old_one_whole(first_node, tmp_path) -> None:
    c, node = first_node
    out = tmp_path / "run"
    out.mkdir()
    recovery.write_record(c, node, str(out), [_restart(1, 2)])
    recovery.write_record(c, node, str(out), [_restart(1, 2), _restart(2, 3)])
    data = json.loads((out / restarts.RECORD_FILE).read_text())
    assert data["restarts"] == 2 and [h["resumed_from_epoch"] for h in data["history"]] == [2, 3]
    assert sorted(p.name for p in out.iterdir()) == [restarts.RECORD_FILE]
