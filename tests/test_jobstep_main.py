"""The job's step (launcher/execute/jobstep.py) as Slurm runs it on the allocation's first node, without a cluster: a
fake `scontrol` on PATH answers from a state directory and logs what it was asked, a stub mpirun records its argv and
fails the way a lost node makes it fail, and each node's slurmd is a real listening socket on a loopback address of
its own, at slurmd's port. Each decision of main() is tested at its boundary, on both sides: the restart bound, the
first attempt against a requeued one, whether Slurm already requeued, and which port says a node is alive."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.execute import jobstep
from launcher.execute import nodecheck as nodecheck_step
from launcher.plans import nodecheck, restarts, slurm

JOB = "4242"
NODES = ("node0", "node1")

# Answers as Slurm 22.05's scontrol gives them (`scontrol --oneliner show node|job`, `scontrol show hostnames`):
# records come from $STATE, every call is logged to $STATE/calls.
FAKE_SCONTROL = r"""#!/usr/bin/env bash
echo "scontrol $*" >>"$STATE/calls"
[ "$1" = --oneliner ] && shift
case "$1 $2" in
  "show hostnames") tr ',' '\n' <"$STATE/nodelist" ;;
  "show node") for n in ${3//,/ }; do
      printf 'NodeName=%s Arch=x86_64 NodeAddr=%s NodeHostName=%s AvailableFeatures=%s SlurmdStartTime=%s\n' \
        "$n" "$(cat "$STATE/addr.$n")" "$n" "$(cat "$STATE/features.$n" 2>/dev/null)" \
        "$(cat "$STATE/slurmd-start.$n" 2>/dev/null || echo 2026-11-27T10:00:00)"; done ;;
  "show job") printf 'JobId=%s JobName=train JobState=RUNNING Restarts=%s StartTime=2026-11-27T11:00:00\n' \
      "$3" "$(cat "$STATE/slurm-restarts")" ;;
  "update NodeName="*|requeue*) ;;
  *) echo "scontrol: unexpected: $*" >&2; exit 1 ;;
esac
"""

# mpirun: records its argv; $STATE/mpirun-mode says how it ends. "lose node1" is a spot reclaim mid-run: node1's
# instance is gone (its address answers no more) and Open MPI names the daemon it lost.
STUB_MPIRUN = r"""#!/usr/bin/env bash
printf '%s\n' "$@" >"$STATE/mpirun.argv"
echo "MASTER_ADDR=${MASTER_ADDR:-} SCALETRAIN_RESTART_COUNT=${SCALETRAIN_RESTART_COUNT:-}" >"$STATE/mpirun.env"
echo "[1,0]<stdout>:model resnet50, 2 ranks, 100 steps/epoch"
echo "[1,0]<stdout>:epoch 0 step 10 loss 6.9"
case "$(cat "$STATE/mpirun-mode")" in
  ok) exit 0 ;;
  "lose node1") cat "$STATE/dead-addr" >"$STATE/addr.node1"
    echo "ORTE has lost communication with a remote daemon."
    echo "  HNP daemon   : [[4242,0],0] on node node0"
    echo "  Remote daemon: [[4242,0],1] on node node1"
    exit 1 ;;
  trainer) echo "[1,0]<stderr>:error: the shards under /fsx/data are not a dataset"; exit 1 ;;
esac
"""


class Allocation:
    """A two-node allocation: each node's slurmd a listening socket at SLURMD_PORT on a loopback address of its own
    (127.x.y.z, so two runs of the suite do not meet), and nothing listening on the addresses of lost nodes."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.state = tmp_path / "state"
        self.state.mkdir()
        self.output = tmp_path / "run"
        self.output.mkdir()
        self.hostfile = tmp_path / "run" / "hostfile"
        bin_ = tmp_path / "bin"
        bin_.mkdir()
        for name, body in (("scontrol", FAKE_SCONTROL), ("mpirun", STUB_MPIRUN)):
            (bin_ / name).write_text(body)
            (bin_ / name).chmod(0o755)
        self.mpirun = str(bin_ / "mpirun")
        self.listeners: list[socket.socket] = []
        base = f"127.{random.randint(20, 250)}.{random.randint(0, 250)}"
        for i, node in enumerate(NODES):
            address = f"{base}.{10 + i}"
            (self.state / f"addr.{node}").write_text(address)
            self.listen(address, slurm.SLURMD_PORT)
        (self.state / "dead-addr").write_text(f"{base}.99")
        (self.state / "nodelist").write_text(",".join(NODES))
        (self.state / "calls").touch()
        self.set(slurm_restarts=0, mode="ok")
        monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("STATE", str(self.state))
        monkeypatch.setenv("SLURM_JOB_ID", JOB)
        monkeypatch.setenv("SLURM_JOB_NODELIST", "node[0-1]")
        # main() sets these for mpirun to forward: monkeypatch restores them after the test.
        for name in ("SCALETRAIN_RESTART_COUNT", "MASTER_ADDR", "MASTER_PORT"):
            monkeypatch.setenv(name, "unset-by-the-test")
        monkeypatch.setattr(jobstep, "WHOLE_WITHIN_S", 1.0)   # a silent node is waited for 1 s here, not 90
        monkeypatch.setattr(jobstep.socket, "gethostname", lambda: "node0")
        # No node check unless a test writes the node's kind here (launcher/execute/nodecheck.py reads it).
        monkeypatch.setattr(nodecheck_step, "HEALTH_CHECK", str(self.state / "healthcheck.sh"))
        self.sigterm = signal.getsignal(signal.SIGTERM)

    def listen(self, address: str, port: int) -> None:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((address, port))
        s.listen(16)
        self.listeners.append(s)

    def close(self) -> None:
        for s in self.listeners:
            s.close()
        signal.signal(signal.SIGTERM, self.sigterm)  # run_step's handler ends the process: not pytest's

    def set(self, *, slurm_restarts: int | None = None, mode: str | None = None) -> None:
        if slurm_restarts is not None:
            (self.state / "slurm-restarts").write_text(str(slurm_restarts))
        if mode is not None:
            (self.state / "mpirun-mode").write_text(mode)

    def run(self, monkeypatch: pytest.MonkeyPatch, *, restart: int, max_restarts: int, extra: tuple[str, ...] = (),
            trainer_args: tuple[str, ...] = ()) -> int:
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
        return jobstep.main(["--max-restarts", str(max_restarts), "--slots", "2", "--hostfile", str(self.hostfile),
                             "--output", str(self.output), *extra, "--", self.mpirun, "-np", "4",
                             sys.executable, "-m", "training.train", *trainer_args])

    def calls(self) -> list[str]:
        return (self.state / "calls").read_text().splitlines()

    def mpirun_argv(self) -> list[str] | None:
        f = self.state / "mpirun.argv"
        return f.read_text().splitlines() if f.exists() else None


@pytest.fixture
def alloc(tmp_path, monkeypatch):
    a = Allocation(tmp_path, monkeypatch)
    yield a
    a.close()


# --- The restart bound: SLURM_RESTART_COUNT against --max-restarts -----------------------------------------------

@pytest.mark.parametrize(("restart", "max_restarts", "runs"), [
    (0, 0, True),    # the first attempt always runs, also with no restarts allowed
    (2, 2, True),    # the last restart the bound allows runs
    (3, 2, False),   # one more than the bound: Slurm requeued it anyway (a node failure, JobRequeue=1)
    (1, 0, False),
])  # fmt: skip
def test_an_attempt_runs_up_to_the_bound_and_not_past_it(alloc, monkeypatch, capsys, restart, max_restarts,
                                                          runs) -> None:
    code = alloc.run(monkeypatch, restart=restart, max_restarts=max_restarts)
    out = capsys.readouterr().out
    assert (alloc.mpirun_argv() is not None) is runs
    if runs:
        assert code == 0 and f"job {JOB} finished" in out
        assert alloc.hostfile.read_text() == "node0 slots=2\nnode1 slots=2\n"
    else:
        assert code == 1
        assert (f"error: job {JOB} was restarted {restart} time(s), more than --max-restarts {max_restarts}; "
                "not running it again") in out
        assert not alloc.hostfile.exists()


# --- --resume: only a requeued attempt resumes --------------------------------------------------------------------

def test_the_first_attempt_starts_fresh(alloc, monkeypatch) -> None:
    """Resuming on the first attempt would restore whatever checkpoint the run directory (or --checkpoint-to's
    bucket) holds: another run's, under the same name."""
    assert alloc.run(monkeypatch, restart=0, max_restarts=2, trainer_args=("--checkpoint-to", "s3://b/run")) == 0
    argv = alloc.mpirun_argv()
    assert argv is not None and "--resume" not in argv
    assert argv[-2:] == ["--checkpoint-to", "s3://b/run"]
    assert (alloc.state / "mpirun.env").read_text().split()[1] == "SCALETRAIN_RESTART_COUNT=0"


def test_a_requeued_attempt_resumes(alloc, monkeypatch) -> None:
    assert alloc.run(monkeypatch, restart=1, max_restarts=2) == 0
    argv = alloc.mpirun_argv()
    assert argv is not None and argv[-1] == "--resume" and argv.count("--resume") == 1
    assert (alloc.state / "mpirun.env").read_text().split()[1] == "SCALETRAIN_RESTART_COUNT=1"


def test_a_requeued_attempt_that_already_says_resume_or_runs_a_users_command_gets_no_second(alloc,
                                                                                        monkeypatch) -> None:
    assert alloc.run(monkeypatch, restart=1, max_restarts=2, trainer_args=("--resume",)) == 0
    assert alloc.mpirun_argv().count("--resume") == 1
    assert alloc.run(monkeypatch, restart=1, max_restarts=2, extra=("--no-resume",)) == 0
    assert "--resume" not in alloc.mpirun_argv()


# --- A lost node: which node, and whether the job is requeued ----------------------------------------------------

def down_nodes(calls: list[str]) -> list[str]:
    return [c.split()[2].removeprefix("NodeName=") for c in calls if c.startswith("scontrol update NodeName=")]


def test_a_lost_node_is_set_down_and_the_job_requeued(alloc, monkeypatch, capsys) -> None:
    alloc.set(mode="lose node1")
    code = alloc.run(monkeypatch, restart=0, max_restarts=2)
    out = capsys.readouterr().out
    assert code == 1
    # slurmd answers on node0 at its port (SlurmdPort, 6818): only node1, whose address no longer answers, is lost.
    assert "waiting for" not in out  # every node answered before mpirun: nothing was waited for
    assert down_nodes(alloc.calls()) == ["node1"]
    assert f"scontrol requeue {JOB}" in alloc.calls()
    assert f"node1 lost (node1: slurmd at {(alloc.state / 'dead-addr').read_text()}:{slurm.SLURMD_PORT}" in out
    record = json.loads((alloc.output / restarts.RECORD_FILE).read_text())  # what the next attempt reads
    assert [h["lost"] for h in record["history"]] == [["node1"]]


def test_slurmds_port_is_what_says_a_node_is_alive(alloc, monkeypatch) -> None:
    """slurmctld's port (6817) on a node answers nothing: probed there, every node would look lost."""
    assert (slurm.SLURMD_PORT, slurm.SLURMCTLD_PORT) == (6818, 6817)  # slurm.conf(5): SlurmdPort, SlurmctldPort
    addresses = {n: (alloc.state / f"addr.{n}").read_text() for n in NODES}
    assert jobstep.unreachable(list(NODES)) == {}
    for s in alloc.listeners:
        s.close()
    for n in NODES:  # slurmctld's port answering, slurmd's not: every node is lost
        alloc.listen(addresses[n], slurm.SLURMCTLD_PORT)
    assert sorted(jobstep.unreachable(list(NODES))) == list(NODES)


@pytest.mark.parametrize(("restart", "slurm_restarts", "requeued"), [
    (0, 0, True),    # Slurm has not requeued this attempt: the step does
    (0, 1, False),   # Slurm already did (it saw the node fail, and counted a restart): a second would spend another
    (1, 1, True),
    (1, 2, False),
])  # fmt: skip
def test_the_step_requeues_only_an_attempt_slurm_has_not(alloc, monkeypatch, capsys, restart, slurm_restarts,
                                                          requeued) -> None:
    alloc.set(mode="lose node1", slurm_restarts=slurm_restarts)
    assert alloc.run(monkeypatch, restart=restart, max_restarts=2) == 1
    assert (f"scontrol requeue {JOB}" in alloc.calls()) is requeued
    assert (f"Slurm has already requeued job {JOB}" in capsys.readouterr().out) is not requeued


@pytest.mark.parametrize(("restart", "requeued"), [(1, True), (2, False)])
def test_a_lost_node_is_not_requeued_once_the_bound_is_spent(alloc, monkeypatch, capsys, restart, requeued) -> None:
    alloc.set(mode="lose node1", slurm_restarts=restart)
    assert alloc.run(monkeypatch, restart=restart, max_restarts=2) == 1
    out = capsys.readouterr().out
    assert (f"scontrol requeue {JOB}" in alloc.calls()) is requeued
    assert ("error: training failed:" in out) is not requeued
    if not requeued:
        assert "the limit (--max-restarts 2)" in out and down_nodes(alloc.calls()) == []


def test_a_failure_the_trainer_named_is_not_requeued(alloc, monkeypatch, capsys) -> None:
    alloc.set(mode="trainer")
    assert alloc.run(monkeypatch, restart=0, max_restarts=2) == 1
    assert not [c for c in alloc.calls() if c.startswith(("scontrol requeue", "scontrol update"))]
    assert "error: training failed:" in capsys.readouterr().out


def test_a_replacement_that_already_registered_is_not_set_down(alloc, monkeypatch) -> None:
    """Its slurmd started after the job did: DOWN would keep the new instance out for good (ReturnToService=2 only
    returns a node that registers after)."""
    (alloc.state / "slurmd-start.node1").write_text("2026-11-27T11:00:05")
    alloc.set(mode="lose node1")
    assert alloc.run(monkeypatch, restart=0, max_restarts=2) == 1
    assert down_nodes(alloc.calls()) == []
    assert f"scontrol requeue {JOB}" in alloc.calls()


def test_the_step_runs_as_slurm_runs_it(alloc, tmp_path) -> None:
    """`python -m launcher.execute.jobstep` in a process of its own, as the batch script starts it."""
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "SLURM_RESTART_COUNT": "1"}
    done = subprocess.run([sys.executable, "-m", "launcher.execute.jobstep", "--max-restarts", "1", "--slots", "2",
                           "--hostfile", str(alloc.hostfile), "--output", str(alloc.output), "--", alloc.mpirun,
                           "-np", "4"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"[job] job {JOB}, attempt 2 (at most 2), on node0, node1" in done.stdout
    assert alloc.mpirun_argv() == ["-np", "4", "--resume"]


def test_a_requeued_reducer_tier_job_gets_resume_in_the_workers_app_context_only() -> None:
    """training.reducer takes no --resume (it exits 2 on one): in an MPMD line it ends the workers' app context."""
    mpmd = ["mpirun", "-np", "2", "-host", "node0:1,node1:1", "python", "-m", "training.train", "--epochs", "1",
            ":", "-np", "1", "-host", "reducer0:1", "python", "-m", "training.reducer", "--workers", "2"]
    assert jobstep.with_resume(mpmd) == [*mpmd[:10], "--resume", *mpmd[10:]]
    assert jobstep.with_resume(["mpirun", "python", "-m", "training.train"])[-1] == "--resume"



# --- The node check before the first step (launcher/plans/nodecheck.py decides) ----------------------------------

def test_a_node_that_falls_short_is_drained_with_its_figures(alloc, monkeypatch, capsys) -> None:
    (alloc.state / "healthcheck.sh").write_text("exec python -m launcher.doctor.health --backend local\n")
    hosts = ["node0", "node1", "node2"]
    slow = {"node1"}
    monkeypatch.setattr(nodecheck_step, "measure_ring", lambda hosts, addresses, job: [
        nodecheck.Pair(s, r, 1_000_000 if {s, r} & slow else 1_000_000_000, 1.0) for s, r in nodecheck.ring(hosts)])
    short = nodecheck_step.refuse_short(hosts, {}, JOB, jobstep.say)
    assert [s.node for s in short] == ["node1"]
    drained = [c for c in alloc.calls() if c.startswith("scontrol update NodeName=node1 State=DRAIN Reason=")]
    assert len(drained) == 1 and "8.0 Mbit/s to and from its neighbours" in drained[0], alloc.calls()
    assert "[job] node check: node1 refused: measured 8.0 Mbit/s" in capsys.readouterr().out
    slow.clear()   # every node at its figure: nothing drained
    assert nodecheck_step.refuse_short(hosts, {}, JOB, jobstep.say) == [] and len(down_nodes(alloc.calls())) == 1


@pytest.mark.parametrize(("restart", "max_restarts", "requeued"), [(0, 1, True), (1, 1, False)])
def test_a_refused_node_requeues_the_job_before_its_first_step_while_restarts_are_left(
        alloc, monkeypatch, capsys, restart, max_restarts, requeued) -> None:
    expected = nodecheck.expectation("local", None)
    monkeypatch.setattr(nodecheck_step, "refuse_short",
                        lambda *_: [nodecheck.Short("node1", 4e6, expected)])
    code = alloc.run(monkeypatch, restart=restart, max_restarts=max_restarts)
    out = capsys.readouterr().out
    assert code == 1 and alloc.mpirun_argv() is None   # no step started
    assert (f"scontrol requeue {JOB}" in alloc.calls()) is requeued
    if requeued:
        history = json.loads((alloc.output / restarts.RECORD_FILE).read_text())["history"]
        assert history[-1]["lost"] == ["node1"] and history[-1]["why"].startswith(nodecheck.REASON_PREFIX)
    else:
        assert f"error: job {JOB} refused node1" in out and "no restart left" in out
    assert alloc.run(monkeypatch, restart=restart, max_restarts=max_restarts, extra=("--no-node-check",)) == 0
