"""--max-cost's shell (launcher/execute/budget.py, launcher/cli/budget.py) where tests/test_budget.py does not reach
without a cluster: when a cluster came up (its oldest machine, on AWS against moto and on the local backend from real
processes), a trainer that ignores the ask to stop ended exactly ``grace_s`` later however often the guard reckons
(a real child process, the guard's and the step's clocks in the test's hands), and `launch status` not counting a
stopped run's spend on while it writes its checkpoint. No rehearsal node, no sshd."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import boto3
import pytest
import test_aws_moto as moto_stack
from moto.ec2.models import instances as moto_instances
from test_aws_plans import outputs as aws_outputs

from launcher.cli import budget as budgetcli
from launcher.cluster import Cluster, Node
from launcher.cluster.aws import api as aws
from launcher.cluster.aws import discover
from launcher.errors import LaunchError
from launcher.execute import budget as spend
from launcher.execute import jobstep, remote, slurmjobs
from launcher.plans import budget, slurm
from training import stopping

env = moto_stack.env  # the fixture: moto's in-process AWS


class Clock:
    """The guard's clock (its module's ``time``): wall and monotonic seconds that move only when the test says, and
    a count of the guard's reckonings (each reads the wall clock once, first)."""

    def __init__(self, wall: float, mono: float = 1000.0) -> None:
        self.wall, self.mono, self.reads = wall, mono, 0
        self._changed = threading.Condition()

    def time(self) -> float:
        with self._changed:
            self.reads += 1
            self._changed.notify_all()
            return self.wall

    def monotonic(self) -> float:
        return self.mono

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.mono += seconds

    def wait_reads(self, count: int, timeout_s: float = 3.0) -> bool:
        with self._changed:
            return self._changed.wait_for(lambda: self.reads >= count, timeout=timeout_s)


def local_cluster(processes: dict[str, int], head: bool = False) -> Cluster:
    def node(name: str, role: str) -> Node:
        return Node(name=name, address="127.0.0.1", role=role, slots=1, cpus=1, workdir="/w")
    return Cluster(name="local", backend="local", nodes=[node("node0", "worker"), node("node1", "worker")],
                   user="u", ssh_config="c", known_hosts="k", python="/p", mpirun="/usr/bin/mpirun",
                   processes=processes, head=node("head", "head") if head else None)


# --- when the cluster came up: its oldest machine ----------------------------------------------------------------

def launch(ec2, role: str, instance_type: str, at: dt.datetime, monkeypatch) -> str:
    """One instance of stack c1, launched ``at`` (moto stamps LaunchTime with its clock, here the test's)."""
    monkeypatch.setattr(moto_instances, "utcnow", lambda: at.replace(tzinfo=None))
    tags = [{"Key": discover.TAG_CLUSTER, "Value": "c1"}, {"Key": discover.TAG_ROLE, "Value": role}]
    made = ec2.run_instances(ImageId="ami-0123456789abcdef0", InstanceType=instance_type, MinCount=1, MaxCount=1,
                             TagSpecifications=[{"ResourceType": "instance", "Tags": tags}])
    return made["Instances"][0]["InstanceId"]


def test_an_aws_cluster_came_up_with_its_oldest_instance_though_its_nodes_were_replaced_since(env, monkeypatch):
    # The head node and 2 workers launch 3 h ago; both workers are reclaimed and replaced, 2 h and 1 h ago: the head
    # node has been billed all along, so the spend counts from its launch.
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    ec2 = boto3.client("ec2")
    head = launch(ec2, "head", "m5.large", now - dt.timedelta(hours=3), monkeypatch)
    reclaimed = [launch(ec2, "worker", "p4d.24xlarge", now - dt.timedelta(hours=3), monkeypatch) for _ in range(2)]
    ec2.terminate_instances(InstanceIds=reclaimed)
    for hours in (2, 1):
        launch(ec2, "worker", "p4d.24xlarge", now - dt.timedelta(hours=hours), monkeypatch)
    found = aws.cluster_instances(aws.session(), "c1")  # the launcher's own DescribeInstances, as discovery reads it
    ip = next(i.private_ip for i in found if i.instance_id == head)
    c = discover.build_cluster(aws_outputs("p4d.24xlarge", storage_kind="fsx").model_copy(update={
        "head": discover.HeadNode(instance_id=head, private_ip=ip)}), found, stack="c1", region="us-east-1",
        profile=None, ssh_config="/x/ssh_config", known_hosts="/x/known_hosts", software={})
    assert sorted(n.launched_at for n in c.machines) == [
        (now - dt.timedelta(hours=h)).strftime("%Y-%m-%dT%H:%M:%SZ") for h in (3, 2, 1)]  # the replacements newer
    oldest = (now - dt.timedelta(hours=3)).timestamp()
    assert spend.came_up(c) == oldest
    # What a user sees: a cap of 2 h at the cluster's price, which the last hour alone has not spent but the 3 h since
    # the cluster came up have, is refused before submission; a larger one is counted from the oldest launch.
    rate = budget.total(budget.hourly(c))
    with pytest.raises(LaunchError) as e:
        budgetcli.step_args(c, round(2 * rate, 2))
    said = re.fullmatch(r"--max-cost \$[\d,.]+ is spent already: cluster 'c1' has cost \$([\d,.]+) since it came up "
                        r"\(\$[\d,.]+/h\); give a larger cap", str(e.value))
    assert said and float(said[1].replace(",", "")) == pytest.approx(3 * rate, abs=0.5), str(e.value)  # 3 h's spend
    args = budgetcli.step_args(c, round(4 * rate, 2))
    assert args[args.index("--cost-since") + 1] == f"{oldest:.0f}"


def test_a_local_cluster_came_up_with_its_oldest_process_though_a_node_was_replaced_since():
    # A local cluster records each machine's pid; `launch local replace` gives a node a new, younger process.
    older = subprocess.Popen(["sleep", "30"])
    try:
        time.sleep(0.3)  # /proc's start times count clock ticks (10 ms): far enough apart to tell which is which
        younger = subprocess.Popen(["sleep", "30"])
        try:
            alone_older = spend.came_up(local_cluster({"node0": older.pid}))
            alone_younger = spend.came_up(local_cluster({"node1": younger.pid}))
            assert alone_younger - alone_older >= 0.25
            both = local_cluster({"head": younger.pid, "node0": older.pid, "node1": younger.pid}, head=True)
            assert spend.came_up(both) == alone_older
            # whichever machine is named first: the oldest, not the first or the last
            assert spend.came_up(local_cluster({"node1": younger.pid, "node0": older.pid})) == alone_older
        finally:
            younger.kill()
            younger.wait()
    finally:
        older.kill()
        older.wait()


# --- a trainer that ignores the ask to stop: ended grace_s after it, however often the guard reckons -----------------

def test_the_guard_ends_a_trainer_grace_s_after_asking_it_to_stop_and_not_before_while_reckoning_every_second(
        tmp_path, monkeypatch):
    clock = Clock(wall=1_700_000_000.0)
    monkeypatch.setattr(spend, "time", clock)
    said: list[str] = []
    guard = spend.Guard(tmp_path, said.append, cap=1.0, usd_per_hour=3600.0, since=clock.wall - 1.0, job="7",
                        trainer=True, grace_s=30.0)  # $1 a second: the cap is reached at the first reckoning
    assert guard.reckon() == "cap"
    assert (tmp_path / stopping.STOP_FILE).exists() and guard.halt() is None
    for _ in range(29):  # reckoning more often than the grace, as the guard's loop does (EVERY_S, 2 s): at the cap
        clock.advance(1.0)
        assert guard.reckon() == "cap"
        assert guard.halt() is None
    clock.advance(1.0 - 2 ** -10)  # 30 s less 1 ms after the ask (exact in binary): still within the grace
    guard.reckon()
    assert guard.halt() is None
    clock.advance(2 ** -10)  # exactly 30 s after the ask
    guard.reckon()
    assert guard.halt() == "budget: the run did not stop within 30 s of being asked"
    assert [ln for ln in said if "asking the run" in ln] == [
        "budget: the cluster has cost $1.00, --max-cost $1.00; asking the run to write a checkpoint and stop"]
    assert json.loads((tmp_path / budget.STATE_FILE).read_text())["state"] == "stopped"


# A trainer that never reads the ask (training/stopping.STOP_FILE): it logs a step every 10 ms, saying when it has seen
# the ask and carries on, and ends by itself, exit 3, only after ~4 s.
IGNORING_TRAINER = r"""
import os, sys, time
out = sys.argv[1]
open(os.path.join(out, "trainer.pid"), "w").write(str(os.getpid()))
for i in range(400):
    asked = os.path.exists(os.path.join(out, sys.argv[2]))
    print(f"epoch 0 step {i} loss 6.9" + (" (asked to stop; carrying on)" if asked else ""), flush=True)
    time.sleep(0.01)
sys.exit(3)
"""


class StepClock:
    """The step's clock (jobstep's ``time``): a second passes at every reading, so run_step asks ``halt`` at every
    line of the run rather than once a real second."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        self.now += 1.0
        return self.now


def test_the_step_kills_a_trainer_that_ignores_the_ask_exactly_grace_s_after_it_with_the_guard_reckoning_meanwhile(
        tmp_path, monkeypatch, capsys):
    clock = Clock(wall=1_700_000_000.0)
    monkeypatch.setattr(spend, "time", clock)
    monkeypatch.setattr(spend, "EVERY_S", 0.005)  # the guard's own loop reckons every 5 ms of real time
    monkeypatch.setattr(spend, "STOP_GRACE_S", 1.0)
    monkeypatch.setattr(jobstep, "time", StepClock())
    a = argparse.Namespace(output=str(tmp_path), max_cost=1.0, cost_per_hour=3600.0, cost_since=clock.wall - 0.9,
                           no_resume=False)  # a trainer's run; $0.90 of $1.00 spent at the start
    # The budget clock's steps, one per ask of the step: the cap at the first ask, then 0.5 s, 1 s less 1 ms (exact in
    # binary) and exactly 1 s (the grace) after it.
    steps = [0.25, 0.5, 0.5 - 2 ** -10, 2 ** -10]
    asks: list[tuple[float, bool, str | None, bool]] = []  # (budget clock, stop asked, halt's answer, trainer ended)
    guard = spend.begin(a, "7", jobstep.say)
    assert isinstance(guard, spend.Guard)

    def halt() -> str | None:
        if steps:
            clock.advance(steps.pop(0))
            assert clock.wait_reads(clock.reads + 2)  # the guard's loop has reckoned at the new time, whole
        why = guard.halt()
        pid = tmp_path / "trainer.pid"
        try:
            os.kill(int(pid.read_text()), 0)
            gone = False
        except ProcessLookupError:
            gone = True
        except (OSError, ValueError):  # not started yet, or its pid half written
            gone = False
        asks.append((clock.mono, (tmp_path / stopping.STOP_FILE).exists(), why, gone))
        return why

    term = signal.getsignal(signal.SIGTERM)  # run_step takes SIGTERM over for the step: give it back to pytest
    try:
        code, lines, stopped = jobstep.run_step([sys.executable, "-c", IGNORING_TRAINER, str(tmp_path),
                                                 stopping.STOP_FILE], 0.0, None, halt)
    finally:
        signal.signal(signal.SIGTERM, term)
        guard.stop()
    asked_at = next(t for t, asked, _, _ in asks if asked)  # the reckoning that reached the cap asked the run to stop
    ended = [(t, why) for t, _, why, _ in asks if why]
    assert ended and ended[0][0] - asked_at == 1.0  # ended when the grace ran out, by the guard's clock ...
    assert not any(gone for t, _, _, gone in asks if t - asked_at < 1.0)  # the trainer ran on while asked to stop
    assert max(t for t, asked, why, _ in asks if asked and why is None) - asked_at == 1.0 - 2 ** -10  # ... not before
    assert stopped == "budget: the run did not stop within 1 s of being asked"
    assert code == -signal.SIGTERM  # the trainer was ended, not left to end by itself (exit 3)
    assert any(ln.endswith("(asked to stop; carrying on)") for ln in lines)
    out = capsys.readouterr().out
    assert "[job] budget: the run did not stop within 1 s of being asked; stopping the run" in out
    assert "asking the run to write a checkpoint and stop" in out


# --- launch status after the stop: the spend as the guard last reckoned it, not counted on -------------------------

def stopped_run(tmp_path: Path, monkeypatch, minutes_ago: float) -> Path:
    """A run directory whose guard reached its $1.00 cap (at $3,600/h, $1.10 spent) ``minutes_ago``; its trainer is
    still writing the checkpoint, so Slurm says the job is running."""
    run = tmp_path / "runs" / "r 1"
    run.mkdir(parents=True)
    clock = Clock(wall=time.time() - minutes_ago * 60)
    with monkeypatch.context() as m:
        m.setattr(spend, "time", clock)
        guard = spend.Guard(run, lambda line: None, cap=1.0, usd_per_hour=3600.0, since=clock.wall - 1.1, job="7",
                            trainer=True)
        assert guard.reckon() == "cap"
    return run


def test_launch_status_reports_a_stopped_running_jobs_spend_as_recorded_however_late_it_is_asked(tmp_path, monkeypatch):
    run = stopped_run(tmp_path, monkeypatch, minutes_ago=1)
    text = f"{budget.RECORD_MARK}{run}\n{(run / budget.STATE_FILE).read_text()}"
    record = budget.parse_records(text)[str(run)]
    assert record["state"] == "stopped"
    now = time.time()
    expected = "budget of job 7 (running): $1.10 of --max-cost $1.00 spent (110%), stopped at the cap"
    for later_s in (0.0, 60.0, 3600.0):  # a job writing its checkpoint is running to Slurm: the spend stays put
        assert budget.state_line("7", "running", record, now + later_s) == expected


def test_launch_status_over_the_head_node_does_not_count_a_stopped_jobs_spend_on(tmp_path, monkeypatch):
    run = stopped_run(tmp_path, monkeypatch, minutes_ago=10)  # $600 more had it been counted to now
    job = slurm.Job(id="7", name="train", state="running", slurm_state="RUNNING", started=None, ended=None,
                    nodes="node[0-1]", restarts=0, output=str(run), stdout=None, exit_code="0:0", reason=None)
    c = local_cluster({}, head=True)
    asked: list[str] = []

    def on_head(cluster, node, command, timeout_s=None):  # the head node, played by this machine's shell
        asked.append(command)
        return 0, subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout

    monkeypatch.setattr(slurmjobs, "jobs", lambda cluster: [job])
    monkeypatch.setattr(remote, "check", on_head)
    lines = budgetcli.status_lines(c)
    assert asked == [budget.records_query([str(run)])]
    assert lines[-1] == "budget of job 7 (running): $1.10 of --max-cost $1.00 spent (110%), stopped at the cap"
