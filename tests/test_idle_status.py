"""`launch status` on a stack deployed with ``-c idle_minutes``: the idle time it shows is counted as the stack's own
idle check counts it (infra/idle_function.py), from the nodes' CPU in (moto's) CloudWatch."""

from __future__ import annotations

import datetime as dt
import json

import boto3
import pytest
from test_aws_moto import deploy, env  # noqa: F401 -- env is the moto fixture

from infra import idle_function, ttl
from launcher import cli
from launcher.cluster.aws import api as aws
from launcher.plans.idle import idle_line


@pytest.fixture
def no_console(monkeypatch):
    monkeypatch.setattr(aws.ConsoleReader, "__call__", lambda self, iid: [])


def _with_idle_minutes(name: str, minutes: int) -> None:
    """The stack as infra's writes it with -c idle_minutes: the IdleMinutes output."""
    cfn = boto3.client("cloudformation")
    template = cfn.get_template(StackName=name)["TemplateBody"]
    template = json.loads(template) if isinstance(template, str) else template
    template["Outputs"]["IdleMinutes"] = {"Value": str(minutes)}
    cfn.update_stack(StackName=name, TemplateBody=json.dumps(template))


def _cpu(group: str, minutes_ago: range, percent: float, now: dt.datetime) -> None:
    boto3.client("cloudwatch").put_metric_data(Namespace="AWS/EC2", MetricData=[
        {"MetricName": "CPUUtilization", "Dimensions": [{"Name": "AutoScalingGroupName", "Value": group}],
         "Timestamp": now - dt.timedelta(minutes=m), "Value": percent, "Unit": "Percent"} for m in minutes_ago])


def test_status_shows_how_long_every_node_has_been_idle(env, no_console, capsys):  # noqa: F811
    deploy(workers=2)
    _with_idle_minutes("c1", 60)
    now = dt.datetime.now(dt.timezone.utc)
    _cpu("c1-worker", range(41, 90), 9.0, now)   # training until 40 minutes ago (p4d: half a vCPU is 0.52%)
    _cpu("c1-worker", range(1, 40), 0.2, now)    # idle since
    assert cli.main(["status", "--cluster", "c1"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("idle for "))
    assert " of 1h00m (no node's CPU above half a vCPU); deletes itself in " in line
    assert int(line.split()[2].rstrip("m")) in range(35, 42)


def test_status_says_when_idle_stop_is_off_or_has_no_data(env, no_console, capsys):  # noqa: F811
    deploy(workers=1)
    assert cli.main(["status", "--cluster", "c1"]) == 0
    assert "idle stop: off (deploy with -c idle_minutes=M" in capsys.readouterr().out
    _with_idle_minutes("c1", 30)
    assert cli.main(["status", "--cluster", "c1"]) == 0
    assert "idle stop after 30m: no CPU data from CloudWatch in the last 15 minutes" in capsys.readouterr().out


def test_status_and_the_stack_count_idleness_alike(env, no_console, monkeypatch):  # noqa: F811
    """The launcher's groups and thresholds are the ones infra/stack.py hands the idle function."""
    from launcher.cluster.aws import idle

    deploy(workers=1, reducers=1)
    _with_idle_minutes("c1", 60)
    outputs = aws.stack_outputs(aws.session(), "c1")
    assert idle.groups(outputs) == [("c1-worker", ttl.idle_cpu_percent(96)), ("c1-reducer", ttl.idle_cpu_percent(72))]
    assert outputs.idle_minutes == 60


@pytest.mark.parametrize(("idle_s", "minutes", "expected"), [
    (None, None, "idle stop: off"),
    (0.0, 60, "idle stop after 1h00m: a node is busy now"),
    (25 * 60, 60, "idle for 25m of 1h00m (no node's CPU above half a vCPU); deletes itself in 35m if nothing runs"),
    (75 * 60, 60, "idle for 1h15m of 1h00m: the stack deletes itself at the next check"),
])
def test_idle_line(idle_s, minutes, expected):
    assert idle_line(idle_s, minutes).startswith(expected)
    assert idle_function.PERIOD == ttl.IDLE_PERIOD_S
