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

__all__ = ["EXPIRY_FORMAT", "EXTEND_PERMISSIONS", "format_expiry", "parameter_name", "parse_expiry"]

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
