"""--max-cost (issue 34 item 6): the budget's decisions at their boundaries (launcher/plans/budget.py), the option
refused in one line before anything starts, the job's step stopping a run at the cap without a requeue (its
scontrol and mpirun stood in for, as tests/test_jobstep_main.py does), and 2 trainer ranks asked to stop that agree
on one step, write its checkpoint and resume from it to the parameters of a run never stopped."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_checkpoint_every import RUN, data  # noqa: F401 - data is the module's shards fixture
from test_checkpoint_every import ranks as start_ranks
from test_jobstep_main import Allocation
from test_trainer_inputs import ROOT, finish

from launcher.cluster import Cluster, Node
from launcher.execute import budget as spend
from launcher.plans import budget, slurm
from training import stopping

# --- the decisions -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "ok"), [("0.01", True), ("5", True), ("0", False), ("-1", False), ("-0.01", False),
                                          ("abc", False), ("", False), ("nan", False), ("inf", False)])
def test_a_cap_is_a_number_of_dollars_above_zero(text, ok):
    problem = budget.cap_problem(text)
    assert (problem is None) is ok
    if not ok:
        assert problem.startswith("--max-cost must be a number of US dollars above 0, got") and "\n" not in problem


@pytest.mark.parametrize(("spent", "said"), [(7.99, "under"), (8.00, "warn"), (9.99, "warn"), (10.00, "cap"),
                                             (10.01, "cap")])
def test_warned_from_80_percent_and_stopped_at_the_cap_to_the_cent(spent, said):
    assert budget.verdict(spent, 10.0) == said


def test_the_spend_is_the_hourly_price_times_the_time_since_the_cluster_came_up():
    assert budget.spent(36.0, 100) == pytest.approx(1.0)
    assert budget.spent(36.0, -5) == 0.0                       # a clock behind the launch time spends nothing
    assert budget.verdict(budget.spent(36.0, 1000), 10.0) == "cap"  # 3,600 $/h x 1,000 s: exactly the cap
    assert budget.verdict(budget.spent(36.0, 999), 10.0) == "warn"
    assert budget.seconds_to_cap(36.0, 9.0, 10.0) == pytest.approx(100.0)
    assert budget.seconds_to_cap(36.0, 11.0, 10.0) == 0.0


def local_cluster(head: bool = True) -> Cluster:
    def node(name, role):
        return Node(name=name, address="10.0.0.1", role=role, slots=1, cpus=1, workdir="/w")
    return Cluster(name="local", backend="local", nodes=[node("node0", "worker"), node("node1", "worker"),
                                                         node("reducer0", "reducer")],
                   user="u", ssh_config="c", known_hosts="k", python="/p", mpirun="/usr/bin/mpirun",
                   head=node("head", "head") if head else None)


def test_a_local_cluster_is_priced_as_the_same_shape_on_aws_head_and_storage_included():
    from infra import catalog

    parts = budget.hourly(local_cluster())
    assert [p.what for p in parts] == ["2 x p4d.24xlarge (workers)", "1 x c5n.18xlarge (reducers)",
                                       "1 x m5.large (head node)", "FSx for Lustre 1200 GiB (shared storage)"]
    assert parts[0].usd_per_hour == pytest.approx(2 * catalog.get("p4d.24xlarge").price_usd_per_hour)
    assert parts[2].usd_per_hour == pytest.approx(catalog.get("m5.large").price_usd_per_hour)
    assert parts[3].usd_per_hour == pytest.approx(1200 * 0.140 / 730)
    assert len(budget.hourly(local_cluster(head=False))) == 3


def test_an_aws_cluster_is_priced_by_its_nodes_own_types_and_its_fsx_size():
    from launcher.cluster import AwsInfo

    c = local_cluster().model_copy(update={
        "backend": "aws", "nodes": [n.model_copy(update={"instance_type": "p5.48xlarge"}) for n in
                                    local_cluster().nodes[:2]],
        "aws": AwsInfo(stack="s", region="us-east-1", node_ssh_config="x",
                       storage={"type": "fsx", "capacity_gib": 2400})})
    c = c.model_copy(update={"head": c.head.model_copy(update={"instance_type": "m5.24xlarge"})})
    assert [p.what for p in budget.hourly(c)] == ["2 x p5.48xlarge (workers)", "1 x m5.24xlarge (head node)",
                                                  "FSx for Lustre 2400 GiB (shared storage)"]


def test_plan_says_when_its_estimate_exceeds_the_cap_by_a_cent_and_not_when_within():
    assert budget.plan_line(9.50, 0.49, 10.0) is None
    assert budget.plan_line(9.50, 0.50, 10.0) is None          # exactly the cap: within
    over = budget.plan_line(9.50, 0.51, 10.0)
    assert over is not None and "exceeds --max-cost $10.00 by $0.01" in over


def test_the_step_options_reach_the_batch_script_and_the_steps_parser():
    args = budget.step_args(2.5, budget.hourly(local_cluster()), 1_700_000_000.4)
    script = slurm.batch_script(slurm.BatchJob(name="t", nodes=2, slots=1, output="/fsx/r", python="py",
                                               mpirun=("mpirun",), budget=args))
    p = argparse.ArgumentParser()
    spend.add_options(p)
    a = p.parse_args(list(args))  # every option the plan writes is one the step reads
    assert a.max_cost == 2.5 and a.cost_since == 1_700_000_000 and a.cost_per_hour == pytest.approx(
        budget.total(budget.hourly(local_cluster())), abs=1e-5)
    assert "--max-cost 2.5 --cost-per-hour" in script


def test_a_local_cluster_came_up_when_its_oldest_machine_started():
    c = local_cluster().model_copy(update={"processes": {"head": os.getpid(), "node0": os.getppid()}})
    started = spend.came_up(c)
    assert time.time() - 7 * 86400 < started < time.time()
    assert spend.came_up(c.model_copy(update={"processes": {}})) == pytest.approx(time.time(), abs=5)


# --- bad input: one line, exit 2, nothing started ----------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "-3", "abc"])
@pytest.mark.parametrize("command", [["train"], ["run"]])
def test_launch_train_and_run_refuse_a_cap_of_zero_below_or_not_a_number(value, command, tmp_path):
    tail = ["--", "python", "x.py"] if command == ["run"] else []
    proc = subprocess.run([sys.executable, "-m", "launcher", *command, "--max-cost", value, *tail],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "SCALETRAIN_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    said = value if value != "abc" else "'abc'"
    assert lines[0].startswith(f"error: --max-cost must be a number of US dollars above 0, got {said} "), lines
    assert not (tmp_path / "home").exists()  # no cluster was looked for, nothing made


# --- the job's step at the cap -----------------------------------------------------------------------------------

# mpirun as a trainer answers the step's ask: it trains until training/stopping.STOP_FILE appears in the run
# directory, then writes that step's checkpoint and ends 0, as the ranks do.
STOPPING_MPIRUN = r"""#!/usr/bin/env bash
out="$OUTPUT"
for i in $(seq 1 600); do
  echo "[1,0]<stdout>:epoch 0 step $i loss 6.9"
  if [ -e "$out/stop-requested" ]; then
    touch "$out/checkpoint-epoch000-step$(printf %08d "$i").pt"
    echo "[1,0]<stdout>:stopped after step $i (epoch 0): $(cat "$out/stop-requested")"
    exit 0
  fi
  sleep 0.1
done
exit 3
"""


@pytest.fixture
def alloc(tmp_path, monkeypatch):
    a = Allocation(tmp_path, monkeypatch)
    stub = tmp_path / "bin" / "mpirun-stopping"
    stub.write_text(STOPPING_MPIRUN)
    stub.chmod(0o755)
    a.mpirun = str(stub)
    monkeypatch.setenv("OUTPUT", str(a.output))
    monkeypatch.setattr(spend, "EVERY_S", 0.2)
    yield a
    a.close()


def budget_args(cap: float, *, rate: float = 3600.0, ago_s: float = 0.0) -> tuple[str, ...]:
    return ("--max-cost", str(cap), "--cost-per-hour", str(rate), "--cost-since", f"{time.time() - ago_s:.3f}")


def test_the_step_asks_the_run_to_stop_at_the_cap_and_ends_the_job_without_a_requeue(alloc, monkeypatch, capsys):
    (alloc.output / stopping.STOP_FILE).write_text("an earlier attempt's ask\n")  # cleared at the start
    code = alloc.run(monkeypatch, restart=0, max_restarts=2, extra=budget_args(2.0, ago_s=0.5))  # $1/s: 1.5 s left
    out = capsys.readouterr().out
    assert code == 1, out
    assert "an earlier attempt's ask" not in out
    warned = [ln for ln in out.splitlines() if ln.startswith("[job] budget: $") and ("spent (8" in ln or
                                                                                  "spent (9" in ln)]
    assert warned, out  # the 80% warning came first
    last = out.strip().splitlines()[-1]
    assert last.startswith("error: stopped at the budget: the cluster has cost $2.") and "--max-cost $2.00" in last
    assert "checkpoint checkpoint-epoch000-step" in last and "--resume continues from it" in last
    assert not any(c.startswith("scontrol requeue") for c in alloc.calls())
    state = (alloc.output / budget.STATE_FILE).read_text()
    assert '"state": "stopped"' in state and '"cap_usd": 2.0' in state


def test_a_cap_spent_before_the_start_starts_nothing(alloc, monkeypatch, capsys):
    code = alloc.run(monkeypatch, restart=0, max_restarts=0, extra=budget_args(2.0, ago_s=2.01))
    out = capsys.readouterr().out
    assert code == 1 and alloc.mpirun_argv() is None
    assert re.fullmatch(r"error: not started: the cluster has cost \$2\.\d\d since it came up \(at \$3,600\.00/h\), "
                        r"--max-cost \$2\.00 is spent; give a larger cap", out.strip().splitlines()[-1]), out


def test_a_cap_not_yet_spent_at_the_start_starts_the_run(alloc, monkeypatch, capsys):
    code = alloc.run(monkeypatch, restart=0, max_restarts=0, extra=budget_args(2.0, rate=36.0, ago_s=198.0))
    out = capsys.readouterr().out  # $0.01 a second: $1.98 spent at the start
    assert code == 1 and "error: stopped at the budget" in out
    assert "not started" not in out


def test_a_users_command_is_ended_at_the_cap(alloc, monkeypatch, capsys):
    stub = Path(alloc.mpirun).with_name("mpirun-forever")
    stub.write_text("#!/usr/bin/env bash\nwhile true; do echo '[rank 0] working'; sleep 0.1; done\n")
    stub.chmod(0o755)
    alloc.mpirun = str(stub)
    started = time.monotonic()
    code = alloc.run(monkeypatch, restart=0, max_restarts=0, extra=(*budget_args(1.0, ago_s=0.5), "--no-resume"))
    out = capsys.readouterr().out
    assert code == 1 and time.monotonic() - started < 30, out
    assert "ending the command (SIGTERM)" in out and "no checkpoint was written" in out.strip().splitlines()[-1]
    assert not (alloc.output / stopping.STOP_FILE).exists()


# --- the trainer's ranks, asked to stop ---------------------------------------------------------------------------

def test_two_ranks_asked_to_stop_agree_on_a_step_checkpoint_it_and_resume_to_the_uninterrupted_parameters(
        data, tmp_path):  # noqa: F811 - the shards fixture
    straight = tmp_path / "straight"
    assert all(code == 0 for code, _, _ in finish(start_ranks(straight, data)))
    stopped = tmp_path / "stopped"
    stopped.mkdir()
    (stopped / stopping.STOP_FILE).write_text("budget reached: test\n")
    results = finish(start_ranks(stopped, data))
    assert [code for code, _, _ in results] == [0, 0], results
    # --log-every 2: rank 0 read the ask at step 2 and both ranks stopped after it, with its checkpoint
    assert "stopped after step 2 (epoch 0): budget reached: test; its checkpoint is written" in results[0][1]
    assert sorted(p.name for p in stopped.glob("checkpoint-*")) == ["checkpoint-epoch000-step00000002.pt"]
    assert not (stopped / "summary.json").exists()  # not finished
    (stopped / stopping.STOP_FILE).unlink()
    resumed = finish(start_ranks(stopped, data, "--resume"))
    assert [code for code, _, _ in resumed] == [0, 0], resumed
    assert (stopped / "summary.json").exists()
    for r in range(2):
        a = torch.load(straight / f"params-rank{r}.pt")
        b = torch.load(stopped / f"params-rank{r}.pt")
        assert all(torch.equal(a[k], b[k]) for k in a), f"rank {r}"
    assert RUN.count("--log-every") == 1


def test_launch_plan_says_when_its_estimate_exceeds_the_cap(tmp_path):
    def plan(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "launcher", "plan", "--nodes", "2", "--instance-type",
                               "p4d.24xlarge", *extra], capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={**os.environ, "SCALETRAIN_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)})
    import json

    doc = json.loads(plan("--json", "--max-cost", "1000").stdout)
    whole = doc["budget"]["estimate_usd"]
    assert doc["budget"]["exceeds"] is False and whole > doc["estimate"]["cost_usd"] > 0  # the head node's share
    assert "budget" not in json.loads(plan("--json").stdout)  # no cap, no key: the golden documents stay as they are
    under = plan("--max-cost", f"{whole - 0.01:.2f}")
    assert under.returncode == 0 and "exceeds --max-cost $" in under.stdout and "by $0.01" in under.stdout
    at = plan("--max-cost", f"{whole + 0.01:.2f}")
    assert at.returncode == 0 and "exceeds" not in at.stdout and "is within --max-cost" in at.stdout


def test_status_reads_each_run_directorys_record_and_counts_a_running_job_to_now():
    import json

    record = {"job": "7", "cap_usd": 10.0, "spent_usd": 4.0, "usd_per_hour": 36.0, "since": 1000.0, "state": "under"}
    query = budget.records_query(["/fsx/runs/a b", "/fsx/runs/c"])
    assert "cat '/fsx/runs/a b/budget.json'" in query and budget.records_query([]) == "true"
    text = (f"{budget.RECORD_MARK}/fsx/runs/a b\n{json.dumps(record)}\n{budget.RECORD_MARK}/fsx/runs/c\n"
            f'{{"cap_usd": 1')  # torn: left out
    found = budget.parse_records(text)
    assert list(found) == ["/fsx/runs/a b"] and found["/fsx/runs/a b"]["cap_usd"] == 10.0
    assert budget.state_line("7", "running", found["/fsx/runs/a b"], 1500.0) == \
        "budget of job 7 (running): $5.00 of --max-cost $10.00 spent (50%)"  # counted to now: 500 s at $36/h
    stopped = {**found["/fsx/runs/a b"], "state": "stopped", "spent_usd": 10.02}
    assert budget.state_line("7", "failed", stopped, 9999.0) == \
        "budget of job 7 (failed): $10.02 of --max-cost $10.00 spent (100%), stopped at the cap"
