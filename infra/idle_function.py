"""scaletrain idle stop, run by AWS Lambda every 5 minutes. The stack inlines it: keep it under 4,096 bytes.

GROUPS is [[Auto Scaling group, CPU %], ...]: a period is busy when any node of a group reached that group's
CPU % (CloudWatch AWS/EC2 CPUUtilization, dimension AutoScalingGroupName, Maximum per 5-minute period).
Once no node has been busy for IDLE_MINUTES, it deletes the stack (STACK_ID) with the stack's own
service role, as the TTL guard does. No datapoint in the last 15 minutes decides nothing.
"""

import datetime
import json
import os

import boto3

STACK_ID = os.environ.get("STACK_ID", "")
GROUPS = json.loads(os.environ.get("GROUPS", "[]"))
IDLE_MINUTES = float(os.environ.get("IDLE_MINUTES", "0"))
PERIOD = 300  # infra.ttl.IDLE_PERIOD_S


def handler(event, context):
    return check(datetime.datetime.now(datetime.timezone.utc))


def periods(cw, now, minutes, groups=None):
    """{period start: busy} over the last ``minutes`` + 30 minutes, every group merged."""
    busy = {}
    for group, percent in GROUPS if groups is None else groups:
        points = cw.get_metric_statistics(
            Namespace="AWS/EC2",
            MetricName="CPUUtilization",
            Dimensions=[{"Name": "AutoScalingGroupName", "Value": group}],
            StartTime=now - datetime.timedelta(minutes=minutes + 30),
            EndTime=now,
            Period=PERIOD,
            Statistics=["Maximum"],
        )["Datapoints"]
        for p in points:
            busy[p["Timestamp"]] = busy.get(p["Timestamp"], False) or p["Maximum"] >= float(percent)
    return busy


def idle_seconds(busy, now, period=PERIOD):
    """How long no node has been busy, to the end of the newest period: None without a recent one.

    The idle run goes back from the newest period to a busy one, or to a gap of two or more missing
    periods (nodes replaced or gone: no evidence either way), or to the first period reported.
    """
    if not busy:
        return None
    starts = sorted(busy)
    end = starts[-1] + datetime.timedelta(seconds=period)
    if (now - end).total_seconds() > 3 * period:
        return None
    since = end
    for start in reversed(starts):
        if busy[start] or (since - start).total_seconds() > 2 * period:
            break
        since = start
    return (end - since).total_seconds()


def check(now):
    idle = idle_seconds(periods(boto3.client("cloudwatch"), now, IDLE_MINUTES), now)
    if idle is None or idle < IDLE_MINUTES * 60:
        print(f"idle {idle} s of {IDLE_MINUTES:g} min: keeping the stack")
        return {"idle_s": idle}
    boto3.client("cloudformation").delete_stack(StackName=STACK_ID)
    print(f"idle {idle:.0f} s >= {IDLE_MINUTES:g} min: deleting {STACK_ID}")
    return {"idle_s": idle, "deleting": STACK_ID}
