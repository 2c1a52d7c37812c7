"""The cost guard's contract, shared by the stack (:mod:`infra.guard`), the guard function and the launcher: where a
cluster's expiry lives, how it is written, and what extending it takes. Pure; nothing here imports aws-cdk-lib, so
the launcher reads it without the ``infra`` extra.

The expiry lives in an SSM String parameter the stack creates (:func:`parameter_name`), not in the schedule. The
schedule runs on its own rate from the deploy-time expiry on; each run the guard function reads the parameter and
deletes the stack only once that time has passed. Extending the TTL is then one ``ssm:PutParameter`` on that one
parameter. Moving the schedule instead (UpdateSchedule) would need ``iam:PassRole`` on the schedule's execution
role as well: every UpdateSchedule call passes the target's ``RoleArn`` again, and EventBridge Scheduler requires the
caller to be allowed to pass it (https://docs.aws.amazon.com/scheduler/latest/UserGuide/security_iam_id-based-policy-examples.html,
"EventBridge Scheduler permissions"; the Service Authorization Reference lists iam:PassRole as a dependent action of
scheduler:UpdateSchedule), which a user allowed to run clusters should not need.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["EXPIRY_FORMAT", "EXTEND_PERMISSIONS", "IDLE_PERIOD_S", "format_expiry", "idle_cpu_percent",
           "parameter_name", "parse_expiry"]

EXPIRY_FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # UTC, to the second; the TtlExpiresAt output and the parameter's value
# Everything `launch status --extend-ttl` calls, as IAM actions, on the one parameter named below. No iam:PassRole.
EXTEND_PERMISSIONS = ("ssm:GetParameter", "ssm:PutParameter")


def parameter_name(cluster_name: str) -> str:
    """The SSM parameter holding ``cluster_name``'s expiry (the stack's name is the cluster's name)."""
    return f"/scaletrain/cluster/{cluster_name}/ttl-expires-at"


def format_expiry(when: dt.datetime) -> str:
    return when.astimezone(dt.timezone.utc).strftime(EXPIRY_FORMAT)


def parse_expiry(text: str) -> dt.datetime:
    """The parameter's value as an aware UTC datetime; ValueError if it is not in :data:`EXPIRY_FORMAT`."""
    return dt.datetime.strptime(text, EXPIRY_FORMAT).replace(tzinfo=dt.timezone.utc)


# --- Idle autostop (-c idle_minutes) -----------------------------------------------------------------------------
#
# The guard's idle check (infra/idle_function.py) reads each node group's CPUUtilization from CloudWatch: the AWS/EC2
# metric EC2 publishes itself for every instance, aggregated per Auto Scaling group by the AutoScalingGroupName
# dimension ("available only for Amazon EC2 metrics when the instances are in such an Auto Scaling group", basic or
# detailed monitoring: https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/viewing_metrics_with_cloudwatch.html,
# "Amazon EC2 metric dimensions"). No agent, no permission on the nodes, no CloudWatch endpoint in their VPC.
# GPU utilisation would need the CloudWatch agent with its nvidia_smi section on the image, PutMetricData on the
# nodes' role and a monitoring endpoint in the isolated subnet
# (https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/CloudWatch-Agent-NVIDIA-GPU.html): more moving
# parts for a signal CPU already gives, since every training rank keeps at least one core busy (the loop launching
# kernels, the data loader, Horovod's background thread), as does staging data or converting shards.
IDLE_PERIOD_S = 300  # one CloudWatch period; basic monitoring's resolution, so it holds with detailed monitoring off


def idle_cpu_percent(vcpus: int) -> float:
    """The CPUUtilization (percent of the whole instance) below which a node counts as idle: half of one vCPU.

    One busy core on a p5.48xlarge (192 vCPUs) is 0.52%: a fixed percentage would either call a training node idle
    or never call a big one idle. Half a core is twice below what one rank uses, and above an idle node's agents.
    """
    return round(50.0 / vcpus, 3)
