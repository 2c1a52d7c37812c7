"""The AWS backend: a deployed CloudFormation stack's instances as a Cluster.

``discover``, ``access``, ``readiness`` and ``lifecycle`` decide (pure: facts in, verdicts and text out);
``api`` is the boto3 shell that reads the facts and carries the decisions out. Nothing is imported here, so the
pure modules load without boto3.
"""
