"""The AWS backend against moto (in-process ``mock_aws``): discovery, readiness timeouts, TTL extension, status,
and teardown, including teardown after a failed run, after Ctrl-C and after a node that never became ready.

The stack is a CloudFormation template shaped like infra's: Auto Scaling groups (moto launches their instances
and propagates the scaletrain:* tags) and the outputs infra/README.md lists. No real account, no network.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import os
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from ami.render import ami_tags, load_versions
from infra import catalog, ttl
from infra.layout import beegfs_layout
from launcher import cli
from launcher import cluster as clusters
from launcher.cluster.aws import api as aws
from launcher.errors import LaunchError
from launcher.execute import awsrun

RECORDED = (Path(__file__).parent / "data" / "console-output-cloud-init.txt").read_text()


@pytest.fixture
def env(monkeypatch, tmp_path):
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    with mock_aws():
        yield tmp_path


def deploy(name: str = "c1", *, workers: int = 2, reducers: int = 0, instance_type: str = "p4d.24xlarge",
           groups: list[dict] | None = None, head: bool = False, storage: str = "beegfs") -> None:
    """A stack with the outputs the launcher reads, and Auto Scaling groups that really launch instances.

    ``groups``: the NodeGroups output as the stack writes it (roles, types, counts, transports, EFA devices); by
    default a worker group of ``workers`` and a c5n reducer group of ``reducers``, both on EFA. ``head``: the Slurm
    head node as infra/head.py makes it (an instance tagged scaletrain:role=head, the HeadNode output); ``storage``:
    beegfs, or fsx (an FSx mount at /fsx), or none."""
    if groups is None:
        groups = [{"role": role, "group_name": f"{name}-{role}", "instance_type": itype, "nodes": count,
                   "transport": "efa", "efa_devices": []}
                  for role, count, itype in (("worker", workers, instance_type), ("reducer", reducers, "c5n.18xlarge"))
                  if count]
    ec2 = boto3.client("ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    ec2.create_tags(Resources=[image], Tags=[{"Key": k, "Value": v}
                                             for k, v in ami_tags(load_versions(), "ubuntu").items()])
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/18")["Subnet"]["SubnetId"]
    resources = {}
    for group in groups:
        role, count, itype = group["role"], group["nodes"], group["instance_type"]
        lt, grp = f"{role.title()}Template", f"{role.title()}Group"
        resources[lt] = {"Type": "AWS::EC2::LaunchTemplate",
                         "Properties": {"LaunchTemplateData": {"ImageId": image, "InstanceType": itype}}}
        resources[grp] = {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {
            "MinSize": str(count), "MaxSize": str(count), "DesiredCapacity": str(count), "VPCZoneIdentifier": [subnet],
            "LaunchTemplate": {"LaunchTemplateId": {"Ref": lt}, "Version": {"Fn::GetAtt": [lt, "LatestVersionNumber"]}},
            "Tags": [{"Key": "scaletrain:cluster", "Value": name, "PropagateAtLaunch": True},
                     {"Key": "scaletrain:role", "Value": role, "PropagateAtLaunch": True}]}}
    # The cost guard's expiry, where infra's stack keeps it (infra.ttl) and `launch status --extend-ttl` writes it.
    resources["TtlExpiry"] = {"Type": "AWS::SSM::Parameter", "Properties": {
        "Name": ttl.parameter_name(name), "Type": "String", "Value": "2030-01-01T00:00:00Z"}}
    if head:
        resources["HeadInstance"] = {"Type": "AWS::EC2::Instance", "Properties": {
            "ImageId": image, "InstanceType": "m5.large", "SubnetId": subnet,
            "Tags": [{"Key": "scaletrain:cluster", "Value": name}, {"Key": "scaletrain:role", "Value": "head"}]}}
    fsx = {"type": "fsx", "file_system_id": "fs-0123456789abcdef0", "mount_name": "abcdefgh", "mount_point": "/fsx",
           "dns_name": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com", "mount_options": "relatime,flock",
           "capacity_gib": 1200, "deployment_type": "SCRATCH_2"}
    mount = {"beegfs": beegfs_layout(catalog.get(instance_type), reducers=reducers), "none": {}, "fsx": fsx}[storage]
    outputs = {"ClusterName": name, "InstanceType": instance_type, "NodeGroups": json.dumps(groups),
               "Storage": storage, "StorageMount": json.dumps(mount),
               "DataBucket": "none", "TtlHours": "24", "TtlExpiresAt": "2030-01-01T00:00:00Z",
               "TtlParameterName": ttl.parameter_name(name), "TtlScheduleName": f"{name}-ttl",
               "TtlScheduleGroup": "default"}
    template = {"Resources": resources, "Outputs": {k: {"Value": v} for k, v in outputs.items()}}
    if head:  # infra/head.py's description, as CloudFormation resolves it (Fn::Join of the JSON around the tokens)
        template["Outputs"]["HeadNode"] = {"Value": {"Fn::Join": ["", [
            '{"instance_id":"', {"Ref": "HeadInstance"}, '","private_ip":"',
            {"Fn::GetAtt": ["HeadInstance", "PrivateIp"]},
            '","host_name":"ip-head","instance_type":"m5.large","slurmctld_port":6817}']]}}
    boto3.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))
    boto3.client("scheduler").create_schedule(
        Name=f"{name}-ttl", ScheduleExpression="rate(15 minutes)", FlexibleTimeWindow={"Mode": "OFF"},
        StartDate=dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc), Description="scaletrain cost guard",
        Target={"Arn": "arn:aws:lambda:us-east-1:123456789012:function:guard",
                "RoleArn": "arn:aws:iam::123456789012:role/guard", "Input": json.dumps({"stack": name})})


def live_instances(name: str = "c1") -> list[str]:
    return [i for i, _ in aws.leftover_instances(boto3.Session(), name)]


def stack_exists(name: str = "c1") -> bool:
    try:
        boto3.client("cloudformation").describe_stacks(StackName=name)
    except boto3.client("cloudformation").exceptions.ClientError:
        return False
    return True


def ready_probe(c, nodes):
    return {n.name: (True, "cloud_init=done\ngpus=8\nefa=4\n", "") if n.role == "worker" else
            (True, "cloud_init=done\ngpus=0\nefa=1\n", "") for n in nodes}


def test_discovery_reads_nodes_roles_addresses_storage_and_software(env):
    deploy(workers=3, reducers=1)
    c = aws.discover_cluster(aws.session(), "c1", console=lambda iid: aws.access.host_keys_from_console(RECORDED))
    assert [n.name for n in c.nodes] == ["node0", "node1", "node2", "reducer0"]
    addresses = [n.address for n in c.workers]
    assert addresses == sorted(addresses, key=lambda a: tuple(int(p) for p in a.split(".")))
    assert [n.slots for n in c.nodes] == [8, 8, 8, 0] and c.instance_type == "p4d.24xlarge"
    assert c.aws.storage["type"] == "beegfs" and c.aws.storage["roles"]["management"] == ["worker:0"]
    assert c.aws.software["aws-ofi-nccl"] == load_versions().aws_ofi_nccl
    assert c.aws.ttl_schedule_name == "c1-ttl" and c.aws.region == "us-east-1"
    config = Path(c.ssh_config).read_text()
    assert f"HostName {c.nodes[0].instance_id}" in config and "AWS-StartSSHSession" in config
    known = Path(c.known_hosts).read_text().splitlines()
    assert len(known) == 2 * 4 and known[0].startswith(c.nodes[0].instance_id + " ecdsa-sha2-nistp256 ")
    assert clusters.load("c1") == c  # saved for every later command
    node_known = (Path(c.ssh_config).parent / "node_known_hosts").read_text()
    assert f"node0,{c.nodes[0].address} ssh-ed25519" in node_known


def test_no_stack_wrong_region_and_missing_credentials_are_one_line(env, monkeypatch):
    deploy()
    with pytest.raises(LaunchError, match="no stack 'nope' in us-east-1 \\(wrong region"):
        aws.discover_cluster(aws.session(), "nope")
    with pytest.raises(LaunchError, match="no stack 'c1' in eu-west-1"):
        aws.discover_cluster(aws.session("eu-west-1"), "c1")
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(LaunchError, match="no AWS credentials found"):
        aws.discover_cluster(aws.session(), "c1")


def test_readiness_times_out_naming_nodes_whose_agent_never_came_online(env):
    deploy(workers=2)
    now = [0.0]
    with pytest.raises(LaunchError) as e:
        awsrun.connect_ready(aws.session(), "c1", timeout_s=120, interval_s=60, console=lambda iid: [],
                             agent=lambda ids: set(ids[:1]), probe=ready_probe, clock=lambda: now[0],
                             sleep=lambda s: now.__setitem__(0, now[0] + s), on_progress=None)
    assert str(e.value) == "1 of 2 node(s) not ready after 120 s: node1 (SSM agent not online yet)"
    assert now[0] == 120


def test_ready_cluster_and_more_nodes_than_deployed(env):
    deploy(workers=2, reducers=1)
    c = awsrun.connect_ready(aws.session(), "c1", timeout_s=0, console=lambda iid: [],
                             agent=lambda ids: set(ids), probe=ready_probe, on_progress=None)
    assert len(c.workers) == 2
    with pytest.raises(LaunchError, match="--nodes 8 is more than the 2 worker node"):
        c.select_workers(8)


def test_ttl_extension_moves_the_expiry_and_leaves_the_schedule_alone(env):
    deploy()
    sess = aws.session()
    c = aws.discover_cluster(sess, "c1", console=lambda iid: [])
    now = dt.datetime(2029, 12, 31, tzinfo=dt.timezone.utc)
    start = aws.extend_ttl(sess, c, 6, now)
    assert start == dt.datetime(2030, 1, 1, 6, tzinfo=dt.timezone.utc)
    value = boto3.client("ssm").get_parameter(Name=ttl.parameter_name("c1"))["Parameter"]["Value"]
    assert value == "2030-01-01T06:00:00Z"
    # The schedule is not updated: that would need iam:PassRole on its role (infra/ttl.py).
    got = boto3.client("scheduler").get_schedule(Name="c1-ttl", GroupName="default")
    assert got["StartDate"].astimezone(dt.timezone.utc) == dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)
    assert clusters.load("c1").aws.ttl_expires_at == "2030-01-01T06:00:00Z"


def test_status_reports_uptime_and_cost_so_far(env):
    deploy()
    sess = aws.session()
    c = aws.discover_cluster(sess, "c1", console=lambda iid: [])
    launched = dt.datetime.fromisoformat(c.nodes[0].launched_at.replace("Z", "+00:00"))
    rows = aws.status(sess, c, launched + dt.timedelta(hours=2))
    assert [r.state for r in rows] == ["running", "running"]
    assert rows[0].cost_usd == pytest.approx(2 * catalog.get("p4d.24xlarge").price_usd_per_hour, rel=1e-3)
    boto3.client("ec2").terminate_instances(InstanceIds=[c.nodes[1].instance_id])
    assert [r.state for r in aws.status(sess, c)][1] in ("shutting-down", "terminated")


def test_launch_down_deletes_the_stack_and_verifies_no_instance_remains(env, capsys):
    deploy(workers=2, reducers=1)
    assert len(live_instances()) == 3
    assert cli.main(["down", "--cluster", "c1"]) == 0
    assert not stack_exists() and live_instances() == []
    assert "no instance tagged scaletrain:cluster=c1 remains" in capsys.readouterr().out


def test_down_reports_an_instance_left_behind(env, capsys):
    deploy(workers=1)
    ec2 = boto3.client("ec2")
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    stray = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p4d.24xlarge", TagSpecifications=[
        {"ResourceType": "instance", "Tags": [{"Key": "scaletrain:cluster", "Value": "c1"},
                                              {"Key": "scaletrain:role", "Value": "worker"}]}])["Instances"][0]
    assert cli.main(["down", "--cluster", "c1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: stack 'c1' is deleted but 1 instance(s)") and stray["InstanceId"] in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("fault", [LaunchError("training failed: mpirun on node0 exited 1"), KeyboardInterrupt()])
def test_teardown_runs_after_a_failed_run_and_after_ctrl_c(env, fault):
    deploy(workers=2)
    sess = aws.session()

    def body():
        assert len(live_instances()) == 2
        raise fault

    with pytest.raises(type(fault)):
        awsrun.with_teardown(sess, "c1", True, body)
    assert not stack_exists() and live_instances() == []


def test_no_teardown_without_the_flag(env):
    deploy(workers=1)
    with pytest.raises(LaunchError):
        awsrun.with_teardown(aws.session(), "c1", False, lambda: (_ for _ in ()).throw(LaunchError("boom")))
    assert stack_exists() and len(live_instances()) == 1


def test_train_teardown_when_a_node_never_becomes_ready(env, monkeypatch, capsys):
    """The whole CLI path: `launch train --cluster c1 --teardown` on a stack whose agents never come online."""
    deploy(workers=2)
    monkeypatch.setattr(aws, "ssm_online", lambda sess, ids: set())
    monkeypatch.setattr(aws.ConsoleReader, "__call__", lambda self, iid: [])
    rc = cli.main(["train", "--cluster", "c1", "--nodes", "2", "--teardown", "--ready-timeout", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1
    assert err[-1] == ("error: 2 of 2 node(s) not ready after 0 s: node0 (SSM agent not online yet); "
                       "node1 (SSM agent not online yet)")
    assert not stack_exists() and live_instances() == []


def test_train_on_a_missing_stack_is_one_line(env, capsys):
    assert cli.main(["train", "--cluster", "ghost", "--nodes", "8"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: unknown cluster 'ghost'; known clusters: none; on AWS: no stack 'ghost' in us-east-1 "
                   "(wrong region? pass --region); deploy one with `npx cdk deploy -c cluster_name=ghost`"]


def test_a_replaced_worker_is_discovered_with_its_new_key_pinned_and_the_old_one_gone(env):
    """A reclaimed spot instance: its Auto Scaling group launches another (new id, address, host key); the next
    discovery (every `launch train`, so also `--resume`) names nodes by the same rule and pins only live keys."""
    deploy(workers=2)
    keys: dict[str, str] = {}

    def console(iid: str) -> list[str]:  # each boot prints its own freshly generated key
        keys.setdefault(iid, "ssh-ed25519 " + base64.b64encode(b"\0\0\0\x0bssh-ed25519\0\0\0\x20"
                                                                + os.urandom(32)).decode())
        return aws.access.host_keys_from_console(
            f"-----BEGIN SSH HOST KEY KEYS-----\n{keys[iid]} root@{iid}\n-----END SSH HOST KEY KEYS-----\n")

    sess = aws.session()
    before = aws.discover_cluster(sess, "c1", console=console)
    node0, old = before.node("node0"), before.node("node1")
    boto3.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=old.instance_id, ShouldDecrementDesiredCapacity=False)

    after = aws.discover_cluster(sess, "c1", console=console)
    new = after.node("node1")
    assert after.names() == ["node0", "node1"] and after.node("node0") == node0
    assert new.instance_id not in (old.instance_id, node0.instance_id) and new.address != old.address
    assert new.slots == old.slots and new.instance_type == old.instance_type
    known = Path(after.known_hosts).read_text()
    assert known.splitlines() == [f"{node0.instance_id} {keys[node0.instance_id]}",
                                  f"{new.instance_id} {keys[new.instance_id]}"]
    node_known = (Path(after.ssh_config).parent / "node_known_hosts").read_text()
    assert f"node1,{new.address} {keys[new.instance_id]}\n" in node_known
    config = Path(after.ssh_config).read_text()
    assert f"HostName {new.instance_id}" in config
    for text in (known, node_known, config):
        assert old.instance_id not in text and keys[old.instance_id] not in text and f"{old.address} " not in text
    assert clusters.load("c1") == after

    # Names follow ascending private address, not the instance replaced: a new node0 ranks after the survivor.
    boto3.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=node0.instance_id, ShouldDecrementDesiredCapacity=False)
    last = aws.discover_cluster(sess, "c1", console=console)
    assert last.node("node0").instance_id == new.instance_id
    assert last.node("node1").instance_id not in (node0.instance_id, new.instance_id, old.instance_id)
    assert node0.instance_id not in Path(last.known_hosts).read_text()


# --- P3 (Xen) consoles: EC2 refuses the latest output there ---------------------------------------------------------

@pytest.fixture
def xen_console(monkeypatch):
    """moto's GetConsoleOutput made to answer as EC2 does: Latest=True is for Nitro instances only
    (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GetConsoleOutput.html), so a P3 (Xen; P3dn is
    Nitro) refuses it with UnsupportedOperation; its buffered output is posted a while after boot (here: from the
    fifth read on), then shows cloud-init's host keys. The wording of EC2's message is not documented; the launcher
    reads only the code. Counts what was asked."""
    from moto.core.responses import ActionResult
    from moto.core.utils import utcnow
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.general import General
    from moto.ec2.utils import Base64EncodedString

    asked = {"latest": 0, "refused": 0, "buffered": 0}

    def get_console_output(self):
        instance = self.ec2_backend.get_instance(self._get_param("InstanceId"))
        xen = instance.instance_type.startswith("p3.")
        if self._get_bool_param("Latest", False):
            asked["latest"] += 1
            if xen:
                asked["refused"] += 1
                raise EC2ClientError("UnsupportedOperation", "The requested operation is not supported for "
                                                             "this instance type.")
            text = RECORDED
        else:
            asked["buffered"] += 1
            text = RECORDED if asked["buffered"] > 4 or not xen else ""
        return ActionResult({"InstanceId": instance.id, "Timestamp": utcnow(),
                             "Output": Base64EncodedString.from_raw_string(text)})

    monkeypatch.setattr(General, "get_console_output", get_console_output)
    return asked


def pinned_probe(c, nodes):
    """SSH answers only where the node's host key is pinned (StrictHostKeyChecking yes)."""
    known = Path(c.known_hosts).read_text() if Path(c.known_hosts).is_file() else ""
    return {n.name: ready_probe(c, [n])[n.name] if f"{n.instance_id} " in known else
            (False, "", "Host key verification failed.") for n in nodes}


def test_a_p3_console_is_read_buffered_and_said_once(env, xen_console, capsys):
    deploy(workers=2, instance_type="p3.16xlarge")
    now = [0.0]
    c = awsrun.connect_ready(aws.session(), "c1", timeout_s=600, interval_s=60, agent=lambda ids: set(ids),
                             probe=pinned_probe, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                             on_progress=None)
    # Nothing was pinned from the first (empty) buffered output; a later discovery pinned both nodes' keys.
    known = Path(c.known_hosts).read_text().splitlines()
    assert sorted(line.split()[0] for line in known) == sorted([n.instance_id for n in c.nodes] * 2)
    assert now[0] > 0  # it waited for the buffered output to be posted
    # The latest output was asked once per instance, then never again; the reason was said once.
    assert xen_console["refused"] == 2 and xen_console["buffered"] >= 4
    err = capsys.readouterr().err
    assert err.count("EC2 gives the latest console output on Nitro instances only") == 1
    assert "may take several minutes" in err


def test_a_nitro_console_is_read_latest_and_other_console_errors_stay_errors(env, xen_console, monkeypatch):
    deploy(workers=2, instance_type="p4d.24xlarge")
    c = aws.discover_cluster(aws.session(), "c1")
    assert len(Path(c.known_hosts).read_text().splitlines()) == 2 * 2
    assert xen_console == {"latest": 2, "refused": 0, "buffered": 0}
    from moto.ec2.exceptions import EC2ClientError
    from moto.ec2.responses.general import General

    def denied(self):
        raise EC2ClientError("UnauthorizedOperation", "You are not authorized to perform this operation.")

    monkeypatch.setattr(General, "get_console_output", denied)
    with pytest.raises(LaunchError) as e:
        aws.discover_cluster(aws.session(), "c1")
    assert str(e.value).startswith("console output of i-") and "UnauthorizedOperation" in str(e.value)


# --- The launcher's key over SSM --------------------------------------------------------------------------------

class SsmAgents:
    """What moto's SSM does not model, added to it: SendCommand refuses instances whose agent has not registered
    (InvalidInstanceId, as https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_SendCommand.html
    lists it), or refuses the next ``refuse`` commands whatever their targets (an agent that answers its ping before
    it takes commands); GetCommandInvocation answers per instance what ``invocations`` scripts (the last step
    repeats; "missing" is InvocationDoesNotExist, as right after SendCommand), else moto's Success."""

    def __init__(self):
        self.registered: set[str] = set()
        self.refuse = 0
        self.sent: list[list[str]] = []
        self.invocations: dict[str, list] = {}

    def agent(self, ids: list[str]) -> set[str]:
        """Every agent online and registered."""
        self.registered |= set(ids)
        return set(ids)


@pytest.fixture
def ssm_agents(monkeypatch):
    from moto.ssm.exceptions import SSMException
    from moto.ssm.models import SimpleSystemManagerBackend as SSMBackend

    agents = SsmAgents()
    send, invocation = SSMBackend.send_command, SSMBackend.get_command_invocation

    def send_command(self, **kwargs):
        ids = kwargs["instance_ids"]
        if agents.refuse or not set(ids) <= agents.registered:
            agents.refuse = max(0, agents.refuse - 1)
            raise SSMException("InvalidInstanceId",
                               f"Instances [[{', '.join(ids)}]] not in a valid state for account 123456789012")
        agents.sent.append(sorted(ids))
        return send(self, **kwargs)

    def get_command_invocation(self, command_id, instance_id, plugin_name):
        steps = agents.invocations.get(instance_id)
        if not steps:
            return invocation(self, command_id, instance_id, plugin_name)
        step = steps.pop(0) if len(steps) > 1 else steps[0]
        if step == "missing":
            raise SSMException("InvocationDoesNotExist", "")
        return {**invocation(self, command_id, instance_id, plugin_name), **step}

    monkeypatch.setattr(SSMBackend, "send_command", send_command)
    monkeypatch.setattr(SSMBackend, "get_command_invocation", get_command_invocation)
    return agents


def keyed_probe(c, nodes):
    """SSH answers only on nodes that have the launcher's key."""
    have = aws.keys_installed(c)
    return {n.name: ready_probe(c, [n])[n.name] if n.instance_id in have else
            (False, "", "Permission denied (publickey)") for n in nodes}


def fake_time():
    now, slept = [0.0], []

    def sleep(s):
        slept.append(s)
        now[0] += s
    return now, slept, (lambda: now[0]), sleep


def test_keys_reach_each_node_once_its_agent_registers_and_a_replacement_gets_them_too(env, ssm_agents, capsys):
    deploy(workers=2)
    sess = aws.session()
    rounds = [0]

    def agent(ids):  # node agents register one round apart
        rounds[0] += 1
        up = set(sorted(ids)[:rounds[0]])
        ssm_agents.registered |= up
        return up

    now, slept, clock, sleep = fake_time()
    c = awsrun.connect_ready(sess, "c1", timeout_s=600, interval_s=15, console=lambda iid: access_keys(),
                             agent=agent, probe=keyed_probe, clock=clock, sleep=sleep, on_progress=None)
    first, second = sorted(n.instance_id for n in c.nodes)
    assert ssm_agents.sent == [[first], [second]]  # each instance once, once its agent registered
    assert aws.keys_installed(c) == {first, second}
    assert "the launcher's key is on" in capsys.readouterr().err

    # node1's instance is reclaimed; its Auto Scaling group launches another. The next `launch train` (--resume)
    # sends the keys to the new instance only.
    old = c.node("node1").instance_id
    boto3.client("autoscaling").terminate_instance_in_auto_scaling_group(InstanceId=old,
                                                                         ShouldDecrementDesiredCapacity=False)
    after = awsrun.connect_ready(sess, "c1", timeout_s=600, console=lambda iid: access_keys(),
                                 agent=ssm_agents.agent, probe=keyed_probe, on_progress=None)
    new = after.node("node1").instance_id
    assert new != old and ssm_agents.sent[2:] == [[new]]
    assert {c.node("node0").instance_id, new} <= aws.keys_installed(after)


def access_keys() -> list[str]:
    return aws.access.host_keys_from_console(RECORDED)


def two_discovered_nodes():
    """A 2-worker stack, discovered (no host keys yet): the session, the cluster and its instance ids."""
    deploy(workers=2)
    sess = aws.session()
    c = aws.discover_cluster(sess, "c1", console=lambda iid: [])
    return sess, c, {n.instance_id for n in c.nodes}


def test_send_command_is_retried_with_backoff_while_ssm_says_invalid_instance_id(env, ssm_agents):
    sess, c, ids = two_discovered_nodes()
    ssm_agents.registered |= ids
    ssm_agents.refuse = 2  # the agents answer their ping, but SSM refuses the first two commands
    now, slept, clock, sleep = fake_time()
    assert aws.install_keys(sess, c, online=ids, clock=clock, sleep=sleep) == ["node0", "node1"]
    assert slept == [2, 4] and ssm_agents.sent == [sorted(ids)]
    # Done once: a second call sends nothing.
    assert aws.install_keys(sess, c, online=ids, clock=clock, sleep=sleep) == [] and len(ssm_agents.sent) == 1


def test_send_command_refused_until_the_deadline_is_one_line_naming_the_nodes(env, ssm_agents):
    sess, c, ids = two_discovered_nodes()  # online, never registered for commands
    now, slept, clock, sleep = fake_time()
    with pytest.raises(LaunchError) as e:
        aws.install_keys(sess, c, online=ids, clock=clock, sleep=sleep)
    msg = str(e.value)
    assert "\n" not in msg and "InvalidInstanceId" in msg and "after 300 s" in msg
    assert all(f"{n.name} ({n.instance_id})" in msg for n in c.nodes)
    assert now[0] <= 300 and len(slept) > 3 and aws.keys_installed(c) == set()


def test_a_failed_key_install_names_the_node_its_status_and_stderr(env, ssm_agents):
    sess, c, ids = two_discovered_nodes()
    ssm_agents.registered |= ids
    node0, node1 = c.node("node0").instance_id, c.node("node1").instance_id
    ssm_agents.invocations = {
        node0: ["missing", {"Status": "InProgress", "StatusDetails": "InProgress"},
                {"Status": "Success", "StatusDetails": "Success"}],
        node1: ["missing", {"Status": "Failed", "StatusDetails": "Failed", "ResponseCode": 1,
                            "StandardErrorContent": "install: invalid user 'ubuntu'\n"}]}
    now, slept, clock, sleep = fake_time()
    with pytest.raises(LaunchError) as e:
        aws.install_keys(sess, c, online=ids, clock=clock, sleep=sleep)
    assert str(e.value) == (f"installing the launcher's key over SSM failed on node1 ({node1}): Failed: "
                            f"install: invalid user 'ubuntu'")
    assert aws.keys_installed(c) == {node0}  # node0's success is kept: the next attempt sends to node1 only
    ssm_agents.invocations = {}
    assert aws.install_keys(sess, c, online=ids, clock=clock, sleep=sleep) == ["node1"]
    assert ssm_agents.sent[-1] == [node1]


def test_a_key_install_that_never_ends_is_one_line(env, ssm_agents):
    deploy(workers=1)
    sess = aws.session()
    c = aws.discover_cluster(sess, "c1", console=lambda iid: [])
    iid = c.node("node0").instance_id
    ssm_agents.registered.add(iid)
    ssm_agents.invocations = {iid: [{"Status": "Delayed", "StatusDetails": "Delayed"}]}
    now, slept, clock, sleep = fake_time()
    with pytest.raises(LaunchError) as e:
        aws.install_keys(sess, c, online={iid}, clock=clock, sleep=sleep)
    assert str(e.value) == f"installing the launcher's key over SSM failed on node0 ({iid}): still Delayed after 300 s"


def test_discovery_reads_the_expiry_as_it_is_now_not_as_deployed(env):
    """Another machine ran `launch status --extend-ttl`: the guard's parameter moved, the stack's TtlExpiresAt output
    did not. Discovery here must show the deadline the guard will act on."""
    deploy()
    boto3.client("ssm").put_parameter(Name=ttl.parameter_name("c1"), Value="2030-01-02T03:00:00Z", Type="String",
                                      Overwrite=True)
    c = aws.discover_cluster(aws.session(), "c1", console=lambda iid: [])
    assert c.aws.ttl_expires_at == "2030-01-02T03:00:00Z"
