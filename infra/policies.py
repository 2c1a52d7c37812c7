"""The IAM statements the boot and the head's epilog need, one function each, in IAM's JSON: the stack grants them
to its roles (infra/head.py, through ``iam.PolicyStatement.from_json``, with CloudFormation's tokens as the ARNs) and
the local cluster's stand-in account grants the same statements to the same two roles, with the ARNs of what it made
(launcher/local/rehearsal_account.py). tests/test_infra_head.py holds the template's statements equal to these.

Each cites the page behind it where the stack uses it; the roles' other grants (the data bucket, the checkpoint
prefix, its KMS key, Session Manager's managed policy) are the stack's alone: no rehearsal node has those buckets.
"""

from __future__ import annotations

from typing import Any

VERSION = "2012-10-17"
NODE_ROLE = "node"      # the stack's NodeIdentity role: every worker and reducer
HEAD_ROLE = "head"      # the head node's


def munge_key_read(secret_arn: str) -> dict[str, Any]:
    """GetSecretValue on the munge key's secret only (every node and the head read it at boot)."""
    return {"Effect": "Allow", "Action": "secretsmanager:GetSecretValue", "Resource": secret_arn}


def ttl_write(parameter_arn: str) -> dict[str, Any]:
    """PutParameter on the cluster's TTL parameter only (the head's epilog moves the expiry for --teardown)."""
    return {"Effect": "Allow", "Action": "ssm:PutParameter", "Resource": parameter_arn}


def role_statements(role: str, *, secret_arn: str, parameter_arn: str) -> list[dict[str, Any]]:
    """What ``role`` (NODE_ROLE or HEAD_ROLE) is granted for the boot and the epilog."""
    if role == HEAD_ROLE:
        return [munge_key_read(secret_arn), ttl_write(parameter_arn)]
    if role == NODE_ROLE:
        return [munge_key_read(secret_arn)]
    raise ValueError(f"unknown role {role!r}; allowed: {NODE_ROLE}, {HEAD_ROLE}")


def trust_policy() -> dict[str, Any]:
    """Who may assume the roles: EC2, for the instance profile (as the stack's ServicePrincipal)."""
    return {"Version": VERSION, "Statement": [{"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                                               "Action": "sts:AssumeRole"}]}
