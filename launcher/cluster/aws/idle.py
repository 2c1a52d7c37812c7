"""`launch status` on a stack deployed with ``-c idle_minutes``: the idle time its idle check counts, read the same way
(the same CloudWatch metric, thresholds and arithmetic as ``infra/idle_function.py``, which runs in the stack).

Needs cloudwatch:GetMetricStatistics (and cloudformation:DescribeStacks for the node groups).
"""

from __future__ import annotations

import datetime as dt

import boto3

from infra import catalog, idle_function, ttl
from launcher.cluster.aws import api as aws
from launcher.cluster.aws.discover import StackOutputs

__all__ = ["groups", "idle_seconds"]


def groups(outputs: StackOutputs) -> list[tuple[str, float]]:
    """(Auto Scaling group, busy CPU %) per node group, as the stack gives its idle function (infra/stack.py)."""
    return [(g.group_name, ttl.idle_cpu_percent(catalog.get(g.instance_type).vcpus)) for g in outputs.node_groups]


def idle_seconds(sess: boto3.Session, outputs: StackOutputs, now: dt.datetime) -> float | None:
    """How long no node has been busy, as the stack's idle check would count it now; None without recent data."""
    minutes = float(outputs.idle_minutes or 0)
    with aws.aws_errors("reading the nodes' CPU from CloudWatch"):
        busy = idle_function.periods(sess.client("cloudwatch"), now, minutes, groups(outputs))
    return idle_function.idle_seconds(busy, now)
