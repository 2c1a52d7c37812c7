"""The shell of `launch up`: run `npx cdk deploy` per attempt, read why a deploy failed, delete a stack that found no
capacity, and watch the node groups of one that deployed. What to try next is ``launcher.plans.capacity``'s.

IAM actions (besides what `cdk deploy` itself needs): cloudformation:DescribeStacks, DescribeStackEvents,
DescribeStackResources, DeleteStack; autoscaling:DescribeAutoScalingGroups, DescribeScalingActivities;
ec2:DescribeInstances (the teardown's check that nothing is left).
"""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3
from botocore.exceptions import ClientError

from infra.spec import ClusterSpec
from launcher.cluster.aws import api as aws
from launcher.errors import LaunchError
from launcher.plans import capacity
from launcher.plans.capacity import Attempt, GroupState, Outcome

__all__ = ["Cdk", "deploy_all", "failure_texts", "group_states", "run_cdk", "stack_status", "wait_for_nodes"]

Cdk = Callable[[list[str]], tuple[int, str]]  # argv -> (exit status, what it printed)
_GROUP = "AWS::AutoScaling::AutoScalingGroup"


def run_cdk(argv: list[str], *, cwd: Path | None = None) -> tuple[int, str]:
    """Run the CDK CLI, showing its output as it comes and keeping it: the failure reasons are in it."""
    kept: list[str] = []
    with subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            kept.append(line)
    return proc.returncode, "".join(kept)


def stack_status(cfn: Any, stack: str) -> str | None:
    try:
        return cfn.describe_stacks(StackName=stack)["Stacks"][0]["StackStatus"]
    except ClientError as e:
        if "does not exist" in str(e):
            return None
        raise


def _groups(cfn: Any, stack: str) -> list[str]:
    try:
        resources = cfn.describe_stack_resources(StackName=stack)["StackResources"]
    except ClientError:
        return []
    return [r["PhysicalResourceId"] for r in resources if r["ResourceType"] == _GROUP and r.get("PhysicalResourceId")]


def _failed_activities(asg: Any, group: str, since: dt.datetime) -> list[str]:
    """The group's failed scaling activities since ``since``, deleted groups too (a rollback deletes the group)."""
    found = asg.describe_scaling_activities(AutoScalingGroupName=group, IncludeDeletedGroups=True)["Activities"]
    return [a.get("StatusMessage") or a.get("Description", "") for a in found
            if a.get("StatusCode") == "Failed" and a.get("StartTime", since) >= since]


def failure_texts(sess: boto3.Session, stack: str, since: dt.datetime) -> list[str]:
    """Why the stack failed: its *_FAILED events' reasons, then its groups' failed activities (newest first)."""
    cfn, asg = sess.client("cloudformation"), sess.client("autoscaling")
    reasons: list[str] = []
    try:
        pages = cfn.get_paginator("describe_stack_events").paginate(StackName=stack)
        for page in pages:
            for e in page["StackEvents"]:
                failed = e["ResourceStatus"].endswith("_FAILED") and e.get("ResourceStatusReason")
                if failed and e["Timestamp"] >= since:
                    reasons.append(f"{e['LogicalResourceId']}: {e['ResourceStatusReason']}")
    except ClientError:
        pass  # no stack: nothing to read
    for group in _groups(cfn, stack):
        reasons += _failed_activities(asg, group, since)
    return reasons


def group_states(sess: boto3.Session, stack: str, since: dt.datetime) -> list[GroupState]:
    cfn, asg = sess.client("cloudformation"), sess.client("autoscaling")
    names = _groups(cfn, stack)
    if not names:
        return []
    found = asg.describe_auto_scaling_groups(AutoScalingGroupNames=names)["AutoScalingGroups"]
    return [GroupState(name=g["AutoScalingGroupName"], desired=int(g["DesiredCapacity"]),
                       in_service=sum(i.get("LifecycleState") == "InService" for i in g.get("Instances", [])),
                       failures=tuple(_failed_activities(asg, g["AutoScalingGroupName"], since))) for g in found]


def wait_for_nodes(sess: boto3.Session, stack: str, since: dt.datetime, *, wait_s: float, delay_s: float,
                   sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic
                   ) -> tuple[str, str]:
    """Until every group is in service, one says it cannot launch, or ``wait_s`` passes: (verdict, one line)."""
    deadline = clock() + wait_s
    while True:
        verdict, line = capacity.group_verdict(group_states(sess, stack, since))
        if verdict != "waiting":
            return verdict, line
        if clock() >= deadline:
            return "failed", f"nodes not all in service after {wait_s:.0f} s ({line}); Auto Scaling keeps trying"
        sleep(delay_s)


def deploy_all(sess: boto3.Session, spec: ClusterSpec, plan: Sequence[Attempt], *, cdk: Cdk,
               say: Callable[[str], None], profile: str | None = None, wait_s: float = 900, delay_s: float = 15,
               teardown_delay_s: float = 15, now: Callable[[], dt.datetime] | None = None) -> Outcome:
    """Deploy ``plan``'s attempts in order until one brings every node up; delete each that found no capacity.

    Returns the successful outcome; raises a one-line LaunchError on any other failure (the stack is then left for
    inspection) or when every attempt found no capacity (each failed stack deleted).
    """
    now = now or (lambda: dt.datetime.now(dt.timezone.utc))
    stack, cfn = spec.cluster_name, sess.client("cloudformation")
    with aws.aws_errors(f"stack '{stack}'"):
        problem = capacity.stack_in_the_way(stack, stack_status(cfn, stack))
    if problem:
        raise LaunchError(problem)
    outcomes: list[Outcome] = []
    for k, attempt in enumerate(plan, 1):
        argv = capacity.cdk_deploy_argv(stack, attempt.context, profile)
        say(f"launch up: attempt {k} of {len(plan)}: {attempt.why}: {' '.join(argv)}")
        since = now() - dt.timedelta(seconds=5)
        rc, printed = cdk(argv)
        with aws.aws_errors(f"reading stack '{stack}'"):
            if rc == 0:
                verdict, line = wait_for_nodes(sess, stack, since, wait_s=wait_s, delay_s=delay_s)
                result, reason = ("ok", line) if verdict == "ready" else (verdict, line)
            else:
                reasons = failure_texts(sess, stack, since)
                result, reason = capacity.classify(rc, [printed, *reasons], reasons)
        outcome = Outcome(attempt, result, reason)  # type: ignore[arg-type]
        if result == "ok":
            say(f"launch up: stack '{stack}' is up in {attempt.az}: {reason}")
            return outcome
        if result == "failed":
            raise LaunchError(f"deploy in {attempt.az} failed, not for capacity: {reason}; the stack is left as it is "
                              f"(`launch down --cluster {stack}` deletes it)")
        outcomes.append(outcome)
        say(f"launch up: no capacity in {attempt.az}: {reason}")
        say("launch up: deleting the failed stack before the next attempt")
        aws.teardown(sess, stack, delay_s=teardown_delay_s, say=say)
    raise LaunchError(capacity.exhausted(spec, outcomes))
