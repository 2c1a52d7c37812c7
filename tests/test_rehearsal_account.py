"""The local cluster's stand-in account (launcher/local/rehearsal_account.py, launcher/local/account_server.py): made
as the stack makes its part of the real one, then locked, so that a node's role credentials do what the stack's role
lets them and nothing else. In process, against moto's threaded server with the account server's change."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

from infra import policies, ttl
from launcher.local import account_server
from launcher.local import rehearsal_account as account_


@pytest.fixture(scope="module")
def made() -> Iterator[dict]:
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    from moto import settings
    from moto.core.authorization import ActionAuthenticatorMixin

    free = settings.INITIAL_NO_AUTH_ACTION_COUNT  # moto's globals: the lock must not outlive this module
    before = account_server.name_resources()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    try:
        sm = account_.client(endpoint, "secretsmanager")
        munge = sm.create_secret(Name="scaletrain-t-munge", SecretString="K" * 16)["ARN"]
        other = sm.create_secret(Name="someone-elses", SecretString="not yours")["ARN"]
        yield {"endpoint": endpoint, "munge": munge, "other": other,
               "account": account_.bootstrap(endpoint, "t", secret_arn=munge, subnet="10.213.7.0/24")}
    finally:
        server.stop()
        settings.INITIAL_NO_AUTH_ACTION_COUNT = free
        ActionAuthenticatorMixin.request_count = 0
        for cls, attr, value in before:
            if value is None:
                delattr(cls, attr)
            else:
                setattr(cls, attr, value)


def _as(made: dict, role: str, service: str):
    c = made["account"].roles[role]
    return boto3.client(service, endpoint_url=made["endpoint"], region_name="us-east-1",
                        aws_access_key_id=c.access_key_id, aws_secret_access_key=c.secret_access_key,
                        aws_session_token=c.token)


def _refused(call, action: str, role: str) -> None:
    with pytest.raises(ClientError) as refused:
        call()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    assert f"assumed-role/scaletrain-t-{role}/scaletrain-t-{role} is not authorized to perform: {action}" in \
        refused.value.response["Error"]["Message"]


def test_each_role_does_what_the_stack_lets_it_and_nothing_else(made: dict) -> None:
    parameter = ttl.parameter_name("t")
    for role in (policies.NODE_ROLE, policies.HEAD_ROLE):
        assert _as(made, role, "secretsmanager").get_secret_value(SecretId=made["munge"])["SecretString"] == "K" * 16
        assert _as(made, role, "secretsmanager").get_secret_value(SecretId="scaletrain-t-munge")["ARN"] == made["munge"]
        _refused(lambda r=role: _as(made, r, "secretsmanager").get_secret_value(SecretId=made["other"]),
                 "secretsmanager:GetSecretValue", role)
        _refused(lambda r=role: _as(made, r, "ssm").put_parameter(Name="/scaletrain/cluster/another/ttl-expires-at",
                                                                   Value="x", Type="String", Overwrite=True),
                 "ssm:PutParameter", role)
    _refused(lambda: _as(made, "node", "ssm").put_parameter(Name=parameter, Value="x", Type="String", Overwrite=True),
             "ssm:PutParameter", "node")
    _as(made, "head", "ssm").put_parameter(Name=parameter, Value="2030-01-01T00:00:00Z", Type="String",
                                           Overwrite=True)
    # Session Manager's own grant (AmazonSSMManagedInstanceCore: ssm:GetParameter on "*"), as on an instance
    assert _as(made, "node", "ssm").get_parameter(Name=parameter)["Parameter"]["Value"] == "2030-01-01T00:00:00Z"


def test_once_made_the_account_is_locked_and_the_launcher_has_its_own_key(made: dict, tmp_path: Path) -> None:
    with pytest.raises(ClientError) as refused:
        account_.client(made["endpoint"], "ssm").describe_parameters()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    with pytest.raises(ClientError):  # the lock covers making more: no caller without a key makes a role
        account_.client(made["endpoint"], "iam").create_role(RoleName="mine", AssumeRolePolicyDocument="{}")
    launcher = account_.client(made["endpoint"], "iam", made["account"].key, made["account"].secret)
    assert launcher.get_role(RoleName="scaletrain-t-head")["Role"]["MaxSessionDuration"] == account_.SESSION_S
    trust = launcher.get_role(RoleName="scaletrain-t-node")["Role"]["AssumeRolePolicyDocument"]
    assert (json.loads(trust) if isinstance(trust, str) else trust) == policies.trust_policy()
    account_.save(tmp_path, made["account"])
    assert account_.load(tmp_path) == made["account"]
    assert account_.load(tmp_path / "none") is None


def test_a_roles_policy_is_the_stacks_statements_with_this_accounts_arns_and_session_managers() -> None:
    arn = "arn:aws:secretsmanager:us-east-1:123456789012:secret:scaletrain-t-munge-AbCdEf"
    doc = account_.role_document("head", secret_arn=arn, parameter_arn=account_.parameter_arn("t"))
    assert doc["Statement"][:2] == policies.role_statements(
        "head", secret_arn=arn,
        parameter_arn="arn:aws:ssm:us-east-1:123456789012:parameter/scaletrain/cluster/t/ttl-expires-at")
    assert {"ssm:UpdateInstanceInformation", "ssmmessages:CreateControlChannel"} <= {
        a for st in doc["Statement"][2:] for a in ([st["Action"]] if isinstance(st["Action"], str) else st["Action"])}


def test_a_node_is_an_instance_the_accounts_ec2_launched_as_the_stacks_launch_template_does(made: dict) -> None:
    """RunInstances, signed by the launcher's key: the cluster's subnet and image, the role's instance profile,
    IMDSv2 required, the user data; describe-instances then sees the node as it would see the stack's. A replacement
    terminates its predecessor, and a node of no role the account knows is refused."""
    acct: account_.Account = made["account"]
    ec2 = account_.client(made["endpoint"], "ec2", acct.key, acct.secret)
    user_data = "#!/bin/bash\necho the stack's user data\n"
    got = account_.run_instance(made["endpoint"], acct, cluster="t", node="node0", role=policies.NODE_ROLE,
                                address="10.213.7.2", user_data=user_data)
    inst = ec2.describe_instances(InstanceIds=[got.instance_id])["Reservations"][0]["Instances"][0]
    assert inst["PrivateIpAddress"] == "10.213.7.2" and inst["SubnetId"] == acct.subnet_id
    assert inst["ImageId"] == acct.image_id and inst["Placement"]["AvailabilityZone"] == "us-east-1a"
    assert inst["IamInstanceProfile"]["Arn"].endswith(":instance-profile/scaletrain-t-node")
    assert inst["MetadataOptions"]["HttpTokens"] == "required"
    assert {t["Key"]: t["Value"] for t in inst["Tags"]} == {"Name": "node0", "scaletrain:cluster": "t"}
    assert inst["NetworkInterfaces"][0]["MacAddress"] == got.mac
    import base64

    said = ec2.describe_instance_attribute(InstanceId=got.instance_id, Attribute="userData")["UserData"]["Value"]
    assert base64.b64decode(said).decode() == user_data
    iam = account_.client(made["endpoint"], "iam", acct.key, acct.secret)
    profile = iam.get_instance_profile(InstanceProfileName=acct.profiles[policies.HEAD_ROLE])["InstanceProfile"]
    assert [r["RoleName"] for r in profile["Roles"]] == [acct.role_names[policies.HEAD_ROLE]]

    account_.terminate(made["endpoint"], acct, got.instance_id)
    state = ec2.describe_instances(InstanceIds=[got.instance_id])["Reservations"][0]["Instances"][0]["State"]
    assert state["Name"] in ("shutting-down", "terminated")
    again = account_.run_instance(made["endpoint"], acct, cluster="t", node="node0", role=policies.NODE_ROLE,
                                  address="10.213.7.9", user_data=user_data)
    assert again.instance_id != got.instance_id
    with pytest.raises(ClientError):  # the launcher's key alone launches: a node's role may not
        _as(made, "node", "ec2").run_instances(ImageId=acct.image_id, MinCount=1, MaxCount=1,
                                               InstanceType=account_.plan.INSTANCE_TYPE, SubnetId=acct.subnet_id)
