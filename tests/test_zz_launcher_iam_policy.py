"""The README's IAM policy for the launcher allows every AWS call the launcher makes (issue 25, item 10): it named a
few actions and lacked cloudformation:DescribeStacks and DeleteStack, ssm:GetParameter/PutParameter (the image, and
--extend-ttl) and more, so a user who created exactly that policy could discover no stack.

tests/conftest.py records, as IAM actions, every call botocore makes with launcher/ code nearest on the stack, in
every test of the session. The calls are kept in tests/golden/launcher-aws-calls.txt; this module runs last in a full
run (file order), so a call the launcher makes that the golden file lacks fails here, and so does a golden call the
README's policy does not allow. Refresh with UPDATE_GOLDEN=1 on a run of AWS_MODULES (or the whole suite)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path

import boto3
import conftest
import pytest
from test_aws_moto import env  # noqa: F401  (the moto fixture)
from test_preflight_aws import answer

from launcher.cluster.aws import api as aws

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "launcher-aws-calls.txt"
# The launcher's tests against moto (the ones marked cluster drive the nodes' AWS CLI, another identity).
AWS_MODULES = ("test_aws_cli", "test_aws_moto", "test_aws_slurm", "test_aws_slurm_train", "test_aws_staging",
               "test_aws_transport", "test_cluster_cli", "test_cost_pricing", "test_deploy_aws", "test_idle_status",
               "test_preflight_aws", "test_preflight_limits", "test_infra_guard", "test_infra_head",
               "test_zz_launcher_iam_policy")
# What the launcher's identity calls outside botocore in this process, so the recorder cannot see it.
OUTSIDE_PYTHON = {
    "ssm:StartSession": "ssh's ProxyCommand, `aws ssm start-session --document-name AWS-StartSSHSession` "
                        "(launcher/cluster/aws/access.py)",
    "sts:AssumeRole": "`npx cdk deploy` (launch up, the image build) assumes the roles `npx cdk bootstrap` made",
}


def readme_policy() -> dict:
    text = (ROOT / "README.md").read_text()
    section = text.split("**The launcher's IAM policy.**", 1)[1]
    return json.loads(re.search(r"```json\n(.*?)\n```", section, re.S).group(1))


def allowed(policy: dict, action: str) -> bool:
    for statement in policy["Statement"]:
        actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        if statement["Effect"] == "Allow" and any(fnmatch.fnmatch(action.lower(), a.lower()) for a in actions):
            return True
    return False


def golden() -> set[str]:
    return set(GOLDEN.read_text().split()) if GOLDEN.exists() else set()


@pytest.mark.usefixtures("env")
def test_the_launcher_asks_ssm_which_agents_are_online():
    # The tests of discovery stand in for ssm_online (moto does not serve DescribeInstanceInformation); here the call
    # is made, answered as SSM would (the answer checked against botocore's model of the API).
    sess = boto3.Session(region_name="us-east-1")
    answer(sess, "ssm", "DescribeInstanceInformation", {"InstanceInformationList": [
        {"InstanceId": "i-0123456789abcdef0", "PingStatus": "Online"},
        {"InstanceId": "i-0123456789abcdef1", "PingStatus": "ConnectionLost"}]})
    assert aws.ssm_online(sess, ["i-0123456789abcdef0", "i-0123456789abcdef1"]) == {"i-0123456789abcdef0"}


def test_the_readme_policy_allows_every_call_the_launcher_makes(request):
    recorded = set(conftest.LAUNCHER_AWS_CALLS)
    ran = {item.module.__name__ for item in request.session.items}
    complete = ran >= set(AWS_MODULES) and request.session.testsfailed == 0
    if os.environ.get("UPDATE_GOLDEN") == "1" and complete:
        GOLDEN.write_text("".join(f"{call}\n" for call in sorted(recorded)))
    known = golden()
    new = sorted(recorded - known)
    assert not new, (f"the launcher now calls {', '.join(new)}: allow it in README.md's launcher IAM policy and "
                     f"refresh {GOLDEN.name} (UPDATE_GOLDEN=1 on the AWS tests)")
    if complete:
        stale = sorted(known - recorded)
        assert not stale, f"{GOLDEN.name} lists calls no test made: {', '.join(stale)} (refresh with UPDATE_GOLDEN=1)"
    policy = readme_policy()
    missing = sorted(a for a in known | set(OUTSIDE_PYTHON) if not allowed(policy, a))
    assert not missing, f"README.md's launcher IAM policy does not allow {', '.join(missing)}"
    # The ones the issue found missing are among the calls, and allowed.
    assert {"cloudformation:DescribeStacks", "cloudformation:DeleteStack", "ssm:GetParameter",
            "ssm:PutParameter"} <= known


def test_the_policy_check_would_catch_a_missing_action():
    policy = {"Statement": [{"Effect": "Allow", "Action": ["ec2:Describe*"], "Resource": "*"},
                            {"Effect": "Deny", "Action": "ssm:*", "Resource": "*"}]}
    assert allowed(policy, "ec2:DescribeInstances") and not allowed(policy, "ec2:GetConsoleOutput")
    assert not allowed(policy, "ssm:GetParameter")
