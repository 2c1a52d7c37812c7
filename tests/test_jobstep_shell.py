"""What the job's step (launcher/execute/jobstep.py, with launcher/execute/stragglerdrain.py) and the restart from this
machine (launcher/cli/train.py's run followed to its end) leave behind for the user, without a cluster: the exit
status and the requeue of a run the step itself stopped, the rendezvous address the command is given, and the epoch
the run's record (restarts.json) says the restarted run begins with, read back from a known set of checkpoints.

The step runs in this process on the fake Slurm of tests/test_jobstep_main.py (a `scontrol` on PATH, each node's
slurmd a listening socket on a loopback address of its own); its command is a real shell script in place of mpirun.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from test_jobstep_main import JOB, Allocation

from launcher.execute import progresswatch
from launcher.plans import restarts, slurm

# The command a user may give `launch run` (or a wrapper around mpirun): it catches SIGTERM and exits 0, as a
# process that saved its work and ends "cleanly". Two ranks' progress, node1's forward pass 3x node0's, as the
# trainer writes it (training/progress.py); then, by $STATE/mpirun-mode, it goes silent or is lost with node1.
# In the background `sleep` + `wait` the trap runs as soon as the signal comes.
TRAPPING_MPIRUN = r"""#!/usr/bin/env bash
printf '%s\n' "$@" >"$STATE/mpirun.argv"
mode="$(cat "$STATE/mpirun-mode")"
case "$mode" in
  *trap*) trap 'kill "$pid" 2>/dev/null; echo "[1,0]<stdout>:SIGTERM: saved, exiting 0"; exit 0' TERM ;;
esac
out="$STATE/../run"
echo "[1,0]<stdout>:model resnet50, 2 ranks, 100 steps/epoch"
case "$mode" in
  *straggle*) mkdir -p "$out/progress"
    now=$(date +%s)
    for step in $(seq 0 11); do
      printf '%s\t%s\t0.01\t0.10\t0.05\t0.01\n' "$step" "$now" >>"$out/progress/rank-0@node0.tsv"
      printf '%s\t%s\t0.01\t0.30\t0.05\t0.01\n' "$step" "$now" >>"$out/progress/rank-1@node1.tsv"
    done ;;
esac
echo "[1,0]<stdout>:epoch 3 step 380 loss 6.9"
case "$mode" in
  *"lose node1"*) cat "$STATE/dead-addr" >"$STATE/addr.node1" ;;  # its instance gone: the collective hangs
esac
sleep 120 &
pid=$!
wait "$pid"
"""


class QuickWatcher(progresswatch.Watcher):
    """The step's progress watcher looking every half second, not every EVERY_S (its default, bound when the class
    was defined: setting EVERY_S changes nothing)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **{**kwargs, "every_s": 0.5})


@pytest.fixture
def alloc(tmp_path, monkeypatch):
    a = Allocation(tmp_path, monkeypatch)
    bin_ = tmp_path / "bin"
    (bin_ / "mpirun").write_text(TRAPPING_MPIRUN)
    # The stall's stacks are taken with srun (launcher/execute/stacks.py): none to be had here.
    (bin_ / "srun").write_text("#!/bin/sh\necho \"srun: error: no such job\" >&2\nexit 1\n")
    (bin_ / "srun").chmod(0o755)
    monkeypatch.setattr(progresswatch, "Watcher", QuickWatcher)
    yield a
    a.close()


def record(alloc: Allocation) -> dict:
    return json.loads((alloc.output / restarts.RECORD_FILE).read_text())


def requeued(alloc: Allocation) -> bool:
    return f"scontrol requeue {JOB}" in alloc.calls()


# --- A run the step stopped is not finished, whatever its command's exit status -----------------------------------

def test_a_drained_run_whose_command_exits_0_on_sigterm_is_requeued_not_finished(alloc, monkeypatch, capsys):
    alloc.set(mode="straggle trap")
    code = alloc.run(monkeypatch, restart=0, max_restarts=1, extra=("--on-straggler", "drain"))
    out = capsys.readouterr().out
    assert "SIGTERM: saved, exiting 0" in out, out   # the command did exit 0 on the step's SIGTERM
    assert "[job] node1 drained as a straggler; stopped" in out
    assert code == 1 and f"job {JOB} finished" not in out, out
    assert requeued(alloc), alloc.calls()
    assert [(h["attempt"], h["lost"]) for h in record(alloc)["history"]] == [(1, ["node1"])]


@pytest.mark.parametrize("lost", [True, False])
def test_a_stalled_run_whose_command_exits_0_on_sigterm_is_not_finished(alloc, monkeypatch, capsys, lost):
    """Silent past --stall-timeout: with node1 gone (its slurmd no longer answers) the job is requeued without it;
    with every node answering it fails with the stall as its reason. Never "finished"."""
    alloc.set(mode="trap lose node1" if lost else "trap")
    code = alloc.run(monkeypatch, restart=0, max_restarts=1, extra=("--stall-timeout", "1"))
    out = capsys.readouterr().out
    assert "SIGTERM: saved, exiting 0" in out, out
    assert "[job] the job printed nothing for 1 s (--stall-timeout)" in out
    assert code == 1 and f"job {JOB} finished" not in out, out
    assert requeued(alloc) is lost, alloc.calls()
    if lost:
        assert "scontrol update NodeName=node1 State=DOWN Reason=lost during job 4242" in alloc.calls()
        history = record(alloc)["history"]
        assert [(h["attempt"], h["lost"]) for h in history] == [(1, ["node1"])]
        assert history[0]["why"].startswith("the job printed nothing for 1 s")
    else:
        assert "error: training failed: the job printed nothing for 1 s (--stall-timeout)" in out
        assert not (alloc.output / restarts.RECORD_FILE).exists()


# --- The rendezvous: where the first node is now, as Slurm has it -------------------------------------------------

def test_master_addr_is_the_first_nodes_address_as_slurm_has_it_not_its_name(alloc, monkeypatch):
    """A replacement registers under its predecessor's name with an address of its own (NodeAddr): DDP's rendezvous
    dials MASTER_ADDR, and the name would resolve to the lost instance, or to nothing."""
    new = (alloc.state / "dead-addr").read_text().rsplit(".", 1)[0] + ".42"   # node0's replacement
    alloc.listen(new, slurm.SLURMD_PORT)
    (alloc.state / "addr.node0").write_text(new)
    (alloc.output.parent / "bin" / "mpirun").write_text(
        "#!/bin/sh\nenv >\"$STATE/mpirun.environ\"\necho \"[1,0]<stdout>:epoch 0 step 10 loss 6.9\"\n")
    assert alloc.run(monkeypatch, restart=0, max_restarts=0, extra=("--rendezvous-port", "29411")) == 0
    env = dict(line.split("=", 1) for line in (alloc.state / "mpirun.environ").read_text().splitlines()
               if "=" in line)
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (new, "29411")


# --- The drain's record: the epoch the restarted run begins with ---------------------------------------------------

@pytest.mark.parametrize(("checkpoints", "resumes_at"), [
    (("checkpoint-epoch001.pt", "checkpoint-epoch002.pt"), 3),                   # epoch 2 whole: epoch 3 next
    (("checkpoint-epoch002.pt", "checkpoint-epoch003-step00000350.pt"), 3),      # inside epoch 3: epoch 3 again
])  # fmt: skip
def test_the_drains_record_says_the_epoch_the_requeued_run_begins_with(alloc, monkeypatch, capsys, checkpoints,
                                                                       resumes_at):
    for name in checkpoints:   # written just now: the drain waits no longer than the work since, a second or two
        (alloc.output / name).write_bytes(b"x")
    alloc.set(mode="straggle")
    assert alloc.run(monkeypatch, restart=0, max_restarts=1, extra=("--on-straggler", "drain")) == 1
    out = capsys.readouterr().out
    assert requeued(alloc), alloc.calls()
    assert f"it resumes from {checkpoints[-1]} on its replacement" in out, out
    data = record(alloc)
    assert data["restarts"] == 1
    assert [(h["attempt"], h["lost"], h["resumed_from_epoch"]) for h in data["history"]] == [
        (1, ["node1"], resumes_at)]


# --- The restart from this machine (no Slurm): launcher/cli/train.py --------------------------------------------

LOST_NODE1 = ["[node0] training resnet18 on 2 rank(s) (ddp), 10 classes, 31 steps/epoch, global batch 4",
              "[node0] epoch 3 step 100 lr 0.006 loss 1.0 50 img/s",
              "[node0] ORTE has lost communication with a remote daemon.",
              "[node0]   HNP daemon   : [[51713,0],0] on node node0",
              "[node0]   Remote daemon: [[51713,0],1] on node node1"]


def test_a_restart_from_here_records_the_epoch_the_resumed_run_begins_with(tmp_path, monkeypatch):
    """mpirun from the launcher on a cluster without Slurm: node1 is lost in epoch 3 after checkpoint-epoch002.pt;
    the run is resumed on its replacement from the start of epoch 3, and restarts.json says so. The nodes' shell is
    this machine's (each command run here, as on the loopback cluster, whose nodes see the launcher's files)."""
    from launcher.cli import train as train_cli
    from launcher.cluster import Cluster, Node
    from launcher.execute import remote, run

    out = tmp_path / "run"
    out.mkdir()
    for name in ("checkpoint-epoch000.pt", "checkpoint-epoch001.pt", "checkpoint-epoch002.pt"):
        (out / name).write_bytes(b"x")
    nodes = [Node(name=f"node{i}", address="127.0.0.1", port=2200 + i, role="worker", slots=1, cpus=1,
                  workdir=str(tmp_path)) for i in range(2)]
    c = Cluster(name="local", backend="local", nodes=nodes, user="u", ssh_config="/s", known_hosts="/k",
                python=sys.executable)
    assert c.shares_launcher_fs
    o = train_cli._checked(None, nodes=None, data=None, model="resnet18", image_size=32, epochs=5, batch_per_gpu=2,
                           warmup_epochs=None, workers=None, engine="ddp", reducers=0, out=str(out), output=None,
                           resume=False, teardown=False, region=None, profile=None, ready_timeout=0,
                           probe_interval=15, probe_misses=4, stall_timeout=0, max_restarts=1, checkpoint_to=None)
    specs, replaced, reported = [], [], []
    runs = [run.RunResult(1, str(out), 100, None, LOST_NODE1), run.RunResult(0, str(out), 100, {"top1": 0.5})]

    def train(cluster, chosen, spec, *, make_data, reducers=None, watch=None):
        specs.append(spec)
        return runs[len(specs) - 1]

    def check(cluster, node, command, *, timeout_s=None):
        done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
        return done.returncode, done.stdout

    def put_text(cluster, node, text, path, mode=0o600):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)

    def run_all(cluster, chosen, command):   # node1's instance is gone: it answers nothing
        return [remote.NodeResult(n.name, -1 if n.name == "node1" else 0, "", "",
                                  "connection refused" if n.name == "node1" else "") for n in chosen]

    monkeypatch.setattr(run, "train", train)
    monkeypatch.setattr(remote, "check", check)
    monkeypatch.setattr(remote, "put_text", put_text)
    monkeypatch.setattr(remote, "run_all", run_all)
    monkeypatch.setattr(train_cli.trainreport, "report", lambda *a: reported.append(a))
    train_cli._followed(c, o, str(out), "", lambda cluster, lost: (replaced.append(lost), cluster)[1])
    assert replaced == [["node1"]] and len(reported) == 1
    assert [s.resume for s in specs] == [False, True]
    data = json.loads((out / restarts.RECORD_FILE).read_text())
    assert [(h["attempt"], h["lost"], h["resumed_from_epoch"]) for h in data["history"]] == [(1, ["node1"], 3)]
    assert data["history"][0]["epochs_lost"] == round(100 / 31 - 3, 3)   # epoch 3's first 7 steps repeated
