"""CDK assertion tests for the cluster stack: one synth per configuration, shared by module-scoped fixtures.

Shapes (issue #3): p3.16xlarge + BeeGFS, p3dn + 4 c5n reducers + FSx, p4d + FSx, p5 + spot; and p4d at 256
nodes to show the template does not grow with the node count.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_cdk")

from aws_cdk import Stack  # noqa: E402
from aws_cdk import aws_ec2 as ec2  # noqa: E402
from aws_cdk.assertions import Annotations, Match, Template  # noqa: E402
from cfnlint.api import ManualArgs, lint  # noqa: E402

from ami import paths  # noqa: E402
from infra import catalog, ttl  # noqa: E402
from infra.app import build  # noqa: E402
from infra.guard import FUNCTION_SOURCE, IDLE_FUNCTION_SOURCE  # noqa: E402
from infra.spec import REMOVED_KEYS  # noqa: E402
from infra.stack import IMAGE_PARAMETER_ID, PINNED_LOGICAL_IDS  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONTEXT: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]
CDK_ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}
AMI = "ami-0123456789abcdef0"
CR = "cr-0123456789abcdef0"
LUSTRE_PORTS = [(988, 988), (1018, 1023)]


def render(value: Any) -> str:
    """A template value as text, with deploy-time references shown as <LogicalId> or <LogicalId.Attribute>."""
    if isinstance(value, str):
        return value
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(render(part) for part in parts)
    if "Ref" in value:
        return f"<{value['Ref']}>"
    if "Fn::GetAtt" in value:
        return "<{}.{}>".format(*value["Fn::GetAtt"])
    raise AssertionError(f"unexpected template value {value!r}")


class Synth:
    """One synthesized configuration: the stack, its template, and lookups the tests share."""

    def __init__(self, **overrides: Any) -> None:
        self.context = {**DEFAULT_CONTEXT, **overrides}
        _, self.stack = build(self.context)
        self.template = Template.from_stack(self.stack)
        self.json: dict[str, Any] = self.template.to_json()
        self.resources_all: dict[str, Any] = self.json["Resources"]

    def resources(self, kind: str) -> dict[str, Any]:
        return {k: v for k, v in self.resources_all.items() if v["Type"] == kind}

    def props(self, logical_id: str) -> dict[str, Any]:
        return self.resources_all[logical_id]["Properties"]

    def output(self, name: str) -> str:
        return render(self.json["Outputs"][name]["Value"])

    def output_json(self, name: str) -> Any:
        return json.loads(self.output(name))

    def launch_template(self, group_id: str) -> dict[str, Any]:
        group = self.props(group_id)
        spec = (
            group.get("LaunchTemplate")
            or group["MixedInstancesPolicy"]["LaunchTemplate"]["LaunchTemplateSpecification"]
        )
        return self.props(spec["LaunchTemplateId"]["Ref"])["LaunchTemplateData"]

    def interfaces(self, group_id: str = "WorkerGroup") -> list[dict[str, Any]]:
        return self.launch_template(group_id)["NetworkInterfaces"]

    def groups(self) -> list[str]:
        return list(self.resources("AWS::AutoScaling::AutoScalingGroup"))

    def node_group(self) -> str:
        (group_id,) = (
            k
            for k, v in self.resources("AWS::EC2::SecurityGroup").items()
            if v["Properties"]["GroupDescription"].startswith("scaletrain nodes")
        )
        return group_id

    def storage_group(self) -> str | None:
        found = [
            k
            for k, v in self.resources("AWS::EC2::SecurityGroup").items()
            if v["Properties"]["GroupDescription"].startswith("scaletrain FSx")
        ]
        assert len(found) <= 1
        return found[0] if found else None

    def rules(self, kind: str) -> list[dict[str, Any]]:
        """Every ingress or egress rule, standalone or inline, with its owning group as GroupId."""
        inline = "SecurityGroupIngress" if kind == "AWS::EC2::SecurityGroupIngress" else "SecurityGroupEgress"
        rules = [r["Properties"] for r in self.resources(kind).values()]
        for group_id, group in self.resources("AWS::EC2::SecurityGroup").items():
            for rule in group["Properties"].get(inline, []):
                rules.append({**rule, "GroupId": {"Fn::GetAtt": [group_id, "GroupId"]}})
        return rules


@pytest.fixture(scope="module")
def p3_beegfs() -> Synth:
    return Synth(instance_type="p3.16xlarge", nodes="2", storage="beegfs", ami=AMI, ttl_hours="6")


@pytest.fixture(scope="module")
def p3dn_fsx() -> Synth:
    return Synth(
        instance_type="p3dn.24xlarge",
        nodes="4",
        reducers="4",
        reducer_type="c5n.18xlarge",
        storage="fsx",
        fsx_capacity_gib="2400",
        data_bucket="my-imagenet-shards",
        ami=AMI,
    )


P4D = {
    "instance_type": "p4d.24xlarge",
    "storage": "fsx",
    "capacity_reservation_id": CR,
    "az": "us-east-1d",  # the reservation's zone
    "reducers": "2",
}


@pytest.fixture(scope="module")
def p4d_fsx() -> Synth:
    return Synth(nodes="8", **P4D)


@pytest.fixture(scope="module")
def p4d_256() -> Synth:
    return Synth(nodes="256", **P4D)


@pytest.fixture(scope="module")
def p5_spot() -> Synth:
    return Synth(instance_type="p5.48xlarge", nodes="4", spot="true", az="us-east-1b", cluster_name="big-h100")


SHAPES = ["p3_beegfs", "p3dn_fsx", "p4d_fsx", "p5_spot"]


def shape(request: pytest.FixtureRequest, name: str) -> Synth:
    return request.getfixturevalue(name)


# --- Network interfaces: the EFA layout per family ----------------------------------------------------------------


def test_p3_without_efa_has_one_ordinary_interface(p3_beegfs: Synth) -> None:
    (interface,) = p3_beegfs.interfaces()
    assert interface["DeviceIndex"] == 0
    assert "InterfaceType" not in interface and "NetworkCardIndex" not in interface
    assert p3_beegfs.output("EfaDevicesPerNode") == "0"


def test_p3dn_workers_and_c5n_reducers_each_have_one_efa(p3dn_fsx: Synth) -> None:
    for group in ("WorkerGroup", "ReducerGroup"):
        (interface,) = p3dn_fsx.interfaces(group)
        assert (interface["NetworkCardIndex"], interface["DeviceIndex"], interface["InterfaceType"]) == (0, 0, "efa")
    assert p3dn_fsx.output("ReducerTransport") == "efa"


def test_p4d_has_one_efa_device_per_network_card(p4d_fsx: Synth) -> None:
    interfaces = p4d_fsx.interfaces()
    assert catalog.get("p4d.24xlarge").efa_cards == 4
    assert [i["NetworkCardIndex"] for i in interfaces] == [0, 1, 2, 3]
    # efa-only at device index 0 of cards 1..3 (EC2 User Guide, efa-acc-inst-types.html, basic configuration).
    assert [i["DeviceIndex"] for i in interfaces] == [0, 0, 0, 0]
    assert [i["InterfaceType"] for i in interfaces] == ["efa", "efa-only", "efa-only", "efa-only"]


def test_p4d_reducers_talk_tcp_through_one_plain_interface(p4d_fsx: Synth) -> None:
    (interface,) = p4d_fsx.interfaces("ReducerGroup")
    assert "InterfaceType" not in interface and interface["DeviceIndex"] == 0
    assert p4d_fsx.output("ReducerTransport") == "tcp"


def test_p5_has_32_efa_devices(p5_spot: Synth) -> None:
    interfaces = p5_spot.interfaces()
    assert len(interfaces) == catalog.get("p5.48xlarge").efa_cards == 32
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(32))
    assert [i["DeviceIndex"] for i in interfaces] == [0] * 32
    assert [i["InterfaceType"] for i in interfaces] == ["efa"] + ["efa-only"] * 31


@pytest.mark.parametrize("name", SHAPES)
def test_every_interface_is_in_the_node_group_without_an_address_of_its_own(
    name: str, request: pytest.FixtureRequest
) -> None:
    synth = shape(request, name)
    group = {"Fn::GetAtt": [synth.node_group(), "GroupId"]}
    for group_id in synth.groups():
        for interface in synth.interfaces(group_id):
            assert interface["Groups"] == [group]
            # EFA-only interfaces must not carry addresses; the subnet comes from the Auto Scaling group.
            assert not {"PrivateIpAddress", "PrivateIpAddresses", "SubnetId"} & interface.keys()


@pytest.mark.parametrize("name", SHAPES)
def test_several_interfaces_never_carry_associate_public_ip_address(name: str, request: pytest.FixtureRequest) -> None:
    """EC2 refuses a launch whose interfaces set AssociatePublicIpAddress when there is more than one of them
    (InvalidParameterCombination: "The associatePublicIPAddress parameter cannot be specified when launching with
    multiple network interfaces"), whatever the value; a single interface may say false."""
    synth = shape(request, name)
    for group_id in synth.groups():
        interfaces = synth.interfaces(group_id)
        if len(interfaces) > 1:
            assert [i for i in interfaces if "AssociatePublicIpAddress" in i] == [], group_id
        else:
            assert interfaces[0].get("AssociatePublicIpAddress", False) is False
    # The subnet gives no public address either way.
    for subnet in synth.resources("AWS::EC2::Subnet").values():
        assert subnet["Properties"]["MapPublicIpOnLaunch"] is False


def test_p4d_and_p5_launch_templates_leave_associate_public_ip_address_out(p4d_fsx: Synth, p5_spot: Synth) -> None:
    for synth, cards in ((p4d_fsx, 4), (p5_spot, 32)):
        interfaces = synth.interfaces()
        assert len(interfaces) == cards
        assert not any("AssociatePublicIpAddress" in i for i in interfaces)


# --- Placement, security, instance settings ------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_one_cluster_placement_group_holds_every_node_group(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    assert list(synth.resources("AWS::EC2::PlacementGroup")) == ["PlacementGroup"]
    assert synth.props("PlacementGroup")["Strategy"] == "cluster"
    for group_id in synth.groups():
        assert synth.props(group_id)["PlacementGroup"] == {"Ref": "PlacementGroup"}
    assert synth.output("PlacementGroupName") == "<PlacementGroup>"


def test_an_existing_placement_group_is_used_instead_of_a_new_one() -> None:
    synth = Synth(nodes="2", capacity_reservation_id=CR, az="us-east-1c", placement_group="my-reserved-pg")
    synth.template.resource_count_is("AWS::EC2::PlacementGroup", 0)
    assert synth.props("WorkerGroup")["PlacementGroup"] == "my-reserved-pg"
    assert synth.output("PlacementGroupName") == "my-reserved-pg"


@pytest.mark.parametrize("name", SHAPES)
def test_node_group_allows_all_traffic_to_and_from_itself(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    group = {"Fn::GetAtt": [synth.node_group(), "GroupId"]}
    synth.template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress", {"IpProtocol": "-1", "GroupId": group, "SourceSecurityGroupId": group}
    )
    synth.template.has_resource_properties(
        "AWS::EC2::SecurityGroupEgress", {"IpProtocol": "-1", "GroupId": group, "DestinationSecurityGroupId": group}
    )


@pytest.mark.parametrize("name", SHAPES)
def test_nothing_is_open_to_the_internet(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    for rule in synth.rules("AWS::EC2::SecurityGroupIngress"):
        # Every ingress rule names a security group: nothing is admitted by address.
        assert not {"CidrIp", "CidrIpv6", "SourcePrefixListId"} & rule.keys(), rule
    for kind in ("AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EIP"):
        synth.template.resource_count_is(kind, 0)
    synth.template.resource_count_is("AWS::EC2::FlowLog", 1)


@pytest.mark.parametrize("name", SHAPES)
def test_no_ssh_from_outside_the_vpc_ssm_is_the_way_in(name: str, request: pytest.FixtureRequest) -> None:
    """The VPC has no internet gateway, so a rule admitting SSH from outside it would promise a route that does not
    exist; operators come in through SSM Session Manager over the interface endpoints."""
    synth = shape(request, name)
    nodes = {"Fn::GetAtt": [synth.node_group(), "GroupId"]}
    for rule in synth.rules("AWS::EC2::SecurityGroupIngress"):
        if rule["GroupId"] == nodes:
            # Only the group's own traffic (EFA, MPI, SSH between nodes) and Lustre callbacks from FSx come in.
            assert rule.get("SourceSecurityGroupId") in (nodes, {"Fn::GetAtt": [synth.storage_group(), "GroupId"]})
    synth.template.resource_count_is("AWS::EC2::InternetGateway", 0)
    assert {"ssmmessages", "ec2messages", "ssm", "autoscaling"} <= {
        render(e["Properties"]["ServiceName"]).rsplit(".", 1)[-1]
        for e in synth.resources("AWS::EC2::VPCEndpoint").values()
    }


@pytest.mark.parametrize("name", ["p3dn_fsx", "p4d_fsx"])
def test_fsx_group_opens_lustre_ports_to_the_nodes_and_itself(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    storage_group = synth.storage_group()
    assert storage_group is not None
    fsx = {"Fn::GetAtt": [storage_group, "GroupId"]}
    nodes = {"Fn::GetAtt": [synth.node_group(), "GroupId"]}
    ingress = synth.rules("AWS::EC2::SecurityGroupIngress")
    egress = synth.rules("AWS::EC2::SecurityGroupEgress")
    for low, high in LUSTRE_PORTS:
        port = {"IpProtocol": "tcp", "FromPort": low, "ToPort": high}
        assert {**port, "GroupId": fsx, "SourceSecurityGroupId": nodes} in _strip(ingress)
        assert {**port, "GroupId": fsx, "SourceSecurityGroupId": fsx} in _strip(ingress)
        assert {**port, "GroupId": nodes, "DestinationSecurityGroupId": fsx} in _strip(egress)
    # The file system group admits nothing but Lustre.
    fsx_ports = sorted((r["FromPort"], r["ToPort"]) for r in ingress if r["GroupId"] == fsx)
    assert fsx_ports == sorted(LUSTRE_PORTS * 2)
    assert synth.props("FileSystem")["SecurityGroupIds"] == [fsx]


def _strip(rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k != "Description"} for r in rules]


def test_no_fsx_group_without_fsx(p3_beegfs: Synth, p5_spot: Synth) -> None:
    assert p3_beegfs.storage_group() is None and p5_spot.storage_group() is None
    p5_spot.template.resource_count_is("AWS::FSx::FileSystem", 0)


def test_endpoints_accept_https_from_the_nodes_only(p4d_fsx: Synth) -> None:
    # S3 gateway + ssm, ssmmessages, ec2messages, secretsmanager for the munge key (infra/head.py), and autoscaling
    # for a drained node's SetInstanceHealth (launcher/doctor/health.mark_unhealthy)
    assert len(p4d_fsx.resources("AWS::EC2::VPCEndpoint")) == 6
    endpoint_groups = p4d_fsx.resources("AWS::EC2::SecurityGroup").keys() - {
        p4d_fsx.node_group(),
        p4d_fsx.storage_group(),
    }
    assert len(endpoint_groups) == 5
    nodes = {"Fn::GetAtt": [p4d_fsx.node_group(), "GroupId"]}
    for group in endpoint_groups:
        rules = [r for r in p4d_fsx.rules("AWS::EC2::SecurityGroupIngress") if r["GroupId"]["Fn::GetAtt"][0] == group]
        assert [(r["FromPort"], r["ToPort"], r["SourceSecurityGroupId"]) for r in rules] == [(443, 443, nodes)]


@pytest.mark.parametrize("name", SHAPES)
def test_imdsv2_required_and_root_volume_encrypted(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    for group_id in synth.groups():
        data = synth.launch_template(group_id)
        assert data["MetadataOptions"]["HttpTokens"] == "required"
        (root,) = data["BlockDeviceMappings"]
        assert root["DeviceName"] == "/dev/sda1"
        assert root["Ebs"]["Encrypted"] is True and root["Ebs"]["VolumeType"] == "gp3"


@pytest.mark.parametrize("image_root_gib", [60, 200, 2000])  # what ami/ allows its root_volume_gib to be
@pytest.mark.parametrize("name", SHAPES)
def test_every_image_the_pipeline_may_build_fits_the_root_volume(
    name: str, image_root_gib: int, request: pytest.FixtureRequest
) -> None:
    """EC2 refuses a root volume smaller than the image's snapshot. The image may be built with up to 2,000 GiB, so
    the launch template leaves the size out (the snapshot's size) unless root_volume_gib says more."""
    synth = shape(request, name)
    for group_id in synth.groups():
        (root,) = synth.launch_template(group_id)["BlockDeviceMappings"]
        assert root["Ebs"].get("VolumeSize", image_root_gib) >= image_root_gib


def test_root_volume_gib_sets_a_larger_root_volume() -> None:
    synth = Synth(nodes="1", root_volume_gib="500")
    for group_id in synth.groups():
        (root,) = synth.launch_template(group_id)["BlockDeviceMappings"]
        assert root["Ebs"]["VolumeSize"] == 500


def test_amazon_linux_images_map_their_own_root_device() -> None:
    synth = Synth(nodes="1", ami=AMI, root_device="/dev/xvda")
    (root,) = synth.launch_template("WorkerGroup")["BlockDeviceMappings"]
    assert root["DeviceName"] == "/dev/xvda" and root["Ebs"]["Encrypted"] is True


def test_default_image_is_the_projects_own_resolved_at_deploy_time(p5_spot: Synth, p3_beegfs: Synth) -> None:
    """The stock Deep Learning Base AMI has no trainer venv, Horovod or BeeGFS, and the private subnet cannot install
    them at boot: the default is the image ami/ builds, whose pipeline publishes its id to IMAGE_ID_PARAMETER."""
    parameter = p5_spot.json["Parameters"][IMAGE_PARAMETER_ID]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert parameter["Default"] == paths.IMAGE_ID_PARAMETER
    # A user whose deploy fails on a missing parameter is told what builds it, in the stack's own region.
    assert 'npx cdk deploy --app ".venv/bin/python ami/app.py" -c region=us-east-1`' in parameter["Description"]
    for group_id in p5_spot.groups():
        assert p5_spot.launch_template(group_id)["ImageId"] == {"Ref": IMAGE_PARAMETER_ID}
    assert p5_spot.output("ImageParameter") == paths.IMAGE_ID_PARAMETER
    # -c ami=... still overrides, and then nothing is resolved.
    assert p3_beegfs.launch_template("WorkerGroup")["ImageId"] == AMI
    assert "Parameters" not in p3_beegfs.json or IMAGE_PARAMETER_ID not in p3_beegfs.json["Parameters"]
    assert p3_beegfs.output("ImageParameter") == "none"


def test_v100_clusters_default_to_the_image_built_with_proprietary_kernel_modules() -> None:
    synth = Synth(instance_type="p3dn.24xlarge", nodes="2", reducers="1", region="us-west-2")
    parameter = synth.json["Parameters"][IMAGE_PARAMETER_ID]
    assert parameter["Default"] == paths.IMAGE_ID_PARAMETER_PROPRIETARY
    assert "-c region=us-west-2 -c nvidia_kernel_modules=proprietary`" in parameter["Description"]
    for group_id in ("WorkerGroup", "ReducerGroup"):
        assert synth.launch_template(group_id)["ImageId"] == {"Ref": IMAGE_PARAMETER_ID}


def _instance_role(synth: Synth) -> tuple[str, dict[str, Any]]:
    """The nodes' role (the head node has its own: tests/test_infra_head.py)."""
    profile_id = synth.launch_template("WorkerGroup")["IamInstanceProfile"]["Arn"]["Fn::GetAtt"][0]
    (role_ref,) = synth.props(profile_id)["Roles"]
    return role_ref["Ref"], synth.props(role_ref["Ref"])


MUNGE_KEY_READ = (("secretsmanager:GetSecretValue",), "<MungeKey>")  # every node reads the cluster's munge key


@pytest.mark.parametrize("name", SHAPES)
def test_every_node_uses_the_one_instance_profile(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    # Two profiles: the nodes' and the head node's.
    profiles = set(synth.resources("AWS::IAM::InstanceProfile"))
    (head_profile,) = {synth.props(synth.props("HeadNode")["LaunchTemplate"]["LaunchTemplateId"]["Ref"])[
        "LaunchTemplateData"]["IamInstanceProfile"]["Arn"]["Fn::GetAtt"][0]}
    (profile_id,) = profiles - {head_profile}
    for group_id in synth.groups():
        assert synth.launch_template(group_id)["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile_id, "Arn"]}}


def _group_arn(logical_id: str) -> str:
    return (f"arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:autoScalingGroup:*:"
            f"autoScalingGroupName/<{logical_id}>")


def _rendered(resource: Any) -> Any:
    return tuple(sorted(render(r) for r in resource)) if isinstance(resource, list) else render(resource)


def _set_health(synth: Synth) -> tuple[str, Any]:
    """A node scaletrain drained marks its own instance Unhealthy (launcher/doctor/health.py): the statement that
    lets it, on the stack's own groups only."""
    groups = sorted(synth.resources("AWS::AutoScaling::AutoScalingGroup"))
    arns = tuple(_group_arn(g) for g in groups)
    return "autoscaling:SetInstanceHealth", arns if len(arns) > 1 else arns[0]


def test_instance_role_is_ssm_core_plus_reading_the_data_bucket(p3dn_fsx: Synth, p5_spot: Synth) -> None:
    role_id, role = _instance_role(p3dn_fsx)
    assert json.dumps(role["ManagedPolicyArns"]).count("policy/") == 1
    assert ":iam::aws:policy/AmazonSSMManagedInstanceCore" in json.dumps(role["ManagedPolicyArns"])
    (policy,) = (
        p for p in p3dn_fsx.resources("AWS::IAM::Policy").values() if p["Properties"]["Roles"] == [{"Ref": role_id}]
    )
    statements = {
        tuple(sorted([s["Action"]] if isinstance(s["Action"], str) else s["Action"])): _rendered(s["Resource"])
        for s in policy["Properties"]["PolicyDocument"]["Statement"]
    }
    assert statements == {
        ("s3:GetBucketLocation", "s3:ListBucket"): "arn:<AWS::Partition>:s3:::my-imagenet-shards",
        ("s3:GetObject",): "arn:<AWS::Partition>:s3:::my-imagenet-shards/*",
        MUNGE_KEY_READ[0]: MUNGE_KEY_READ[1],
        ("autoscaling:SetInstanceHealth",): (_group_arn("ReducerGroup"), _group_arn("WorkerGroup")),
    }
    # Without a data bucket the nodes get SSM, the munge key and their own groups' health, nothing else.
    role_id, _ = _instance_role(p5_spot)
    assert [
        (s["Action"], _rendered(s["Resource"]))
        for p in p5_spot.resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ] == [(MUNGE_KEY_READ[0][0], MUNGE_KEY_READ[1]), _set_health(p5_spot)]


@pytest.fixture(scope="module")
def p4d_checkpoints() -> Synth:
    # The same bucket for data and checkpoints: the read grant must not widen the write one, nor the reverse.
    return Synth(nodes="2", data_bucket="my-ckpts", checkpoint_bucket="my-ckpts", checkpoint_prefix="team/runs")


S3_WRITES = {"s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:*", "*"}


def _role_statements(synth: Synth) -> list[dict[str, Any]]:
    role_id, _ = _instance_role(synth)
    return [
        s
        for p in synth.resources("AWS::IAM::Policy").values()
        if {"Ref": role_id} in p["Properties"]["Roles"]
        for s in p["Properties"]["PolicyDocument"]["Statement"]
    ]


def _actions(statement: dict[str, Any]) -> set[str]:
    return {statement["Action"]} if isinstance(statement["Action"], str) else set(statement["Action"])


def test_checkpoint_bucket_lets_the_nodes_write_under_its_prefix_only(p4d_checkpoints: Synth) -> None:
    """What training/durable.py's AWS CLI calls need (s3 cp up and down, s3 rm of the marker, s3api
    list-objects-v2 --prefix PREFIX/), on PREFIX/* and nowhere else: without it they fail with AccessDenied."""
    statements = {
        (tuple(sorted(_actions(s))), _rendered(s["Resource"]), json.dumps(s.get("Condition"), sort_keys=True))
        for s in _role_statements(p4d_checkpoints)
    }
    assert statements == {
        # data_bucket: read-only, as before
        (("s3:GetBucketLocation", "s3:ListBucket"), "arn:<AWS::Partition>:s3:::my-ckpts", "null"),
        (("s3:GetObject",), "arn:<AWS::Partition>:s3:::my-ckpts/*", "null"),
        # checkpoint_bucket: objects under the prefix, and listing that prefix only
        (
            ("s3:AbortMultipartUpload", "s3:DeleteObject", "s3:GetObject", "s3:PutObject"),
            "arn:<AWS::Partition>:s3:::my-ckpts/team/runs/*",
            "null",
        ),
        (
            ("s3:ListBucket",),
            "arn:<AWS::Partition>:s3:::my-ckpts",
            json.dumps({"StringLike": {"s3:prefix": "team/runs/*"}}, sort_keys=True),
        ),
        (*MUNGE_KEY_READ, "null"),
        ((_set_health(p4d_checkpoints)[0],), _set_health(p4d_checkpoints)[1], "null"),
    }
    matches = lint(json.dumps(p4d_checkpoints.json), config=ManualArgs(regions=[p4d_checkpoints.stack.region]))
    assert [m for m in matches if m.rule.id.startswith("E")] == []
    assert _nag_findings(p4d_checkpoints.stack) == []


@pytest.mark.parametrize("name", SHAPES)
def test_without_checkpoint_bucket_the_nodes_write_to_no_bucket(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    assert [s for s in _role_statements(synth) if _actions(s) & S3_WRITES] == []
    _, role = _instance_role(synth)
    assert "Policies" not in role  # no inline policy either


# --- Capacity, spot, reservations -------------------------------------------------------------------------------------


def _sizes(synth: Synth, group_id: str) -> tuple[str, str, str]:
    group = synth.props(group_id)
    return group["MinSize"], group["MaxSize"], group["DesiredCapacity"]


def test_group_sizes_are_nodes_and_reducers(p4d_fsx: Synth, p3dn_fsx: Synth, p3_beegfs: Synth) -> None:
    assert _sizes(p4d_fsx, "WorkerGroup") == ("8", "8", "8")
    assert _sizes(p4d_fsx, "ReducerGroup") == ("2", "2", "2")
    assert _sizes(p3dn_fsx, "WorkerGroup") == _sizes(p3dn_fsx, "ReducerGroup") == ("4", "4", "4")
    assert p3_beegfs.groups() == ["WorkerGroup"]
    for synth in (p4d_fsx, p3dn_fsx, p3_beegfs):
        for group_id in synth.groups():
            group = synth.props(group_id)
            assert "LaunchTemplate" in group and "MixedInstancesPolicy" not in group
            assert len(group["VPCZoneIdentifier"]) == 1


def test_reducers_use_reducer_type_and_workers_the_worker_type(p3dn_fsx: Synth) -> None:
    assert p3dn_fsx.launch_template("WorkerGroup")["InstanceType"] == "p3dn.24xlarge"
    assert p3dn_fsx.launch_template("ReducerGroup")["InstanceType"] == "c5n.18xlarge"


def test_capacity_reservation_is_for_the_workers_only(p4d_fsx: Synth, p3dn_fsx: Synth) -> None:
    target = p4d_fsx.launch_template("WorkerGroup")["CapacityReservationSpecification"]
    assert target == {"CapacityReservationTarget": {"CapacityReservationId": CR}}
    assert "CapacityReservationSpecification" not in p4d_fsx.launch_template("ReducerGroup")
    assert "CapacityReservationSpecification" not in p3dn_fsx.launch_template("WorkerGroup")
    # An ordinary reservation is bought On-Demand: no market type.
    assert "InstanceMarketOptions" not in p4d_fsx.launch_template("WorkerGroup")


def test_capacity_reservation_puts_the_subnet_in_its_zone(p4d_fsx: Synth) -> None:
    (subnet,) = p4d_fsx.resources("AWS::EC2::Subnet").values()
    assert subnet["Properties"]["AvailabilityZone"] == "us-east-1d"
    assert p4d_fsx.props("FileSystem")["SubnetIds"] == [{"Ref": next(iter(p4d_fsx.resources("AWS::EC2::Subnet")))}]


@pytest.fixture(scope="module")
def p5_block() -> Synth:
    return Synth(
        instance_type="p5.48xlarge", nodes="4", capacity_reservation_id=CR, capacity_block="true", az="us-east-2a",
        region="us-east-2", reducers="1", cluster_name="block",
    )  # fmt: skip


def test_capacity_block_asks_for_its_market_type_and_targets_the_block(p5_block: Synth) -> None:
    """A Capacity Block is used only by a launch with market type capacity-block that targets its reservation."""
    data = p5_block.launch_template("WorkerGroup")
    assert data["InstanceMarketOptions"] == {"MarketType": "capacity-block"}
    assert data["CapacityReservationSpecification"] == {"CapacityReservationTarget": {"CapacityReservationId": CR}}
    group = p5_block.props("WorkerGroup")
    assert "LaunchTemplate" in group and "MixedInstancesPolicy" not in group  # never Spot
    # Reducers are ordinary On-Demand instances beside the block.
    reducers = p5_block.launch_template("ReducerGroup")
    assert not {"InstanceMarketOptions", "CapacityReservationSpecification"} & reducers.keys()
    (subnet,) = p5_block.resources("AWS::EC2::Subnet").values()
    assert subnet["Properties"]["AvailabilityZone"] == "us-east-2a"


def test_capacity_block_nodes_are_placed_by_the_block_not_a_placement_group(p5_block: Synth) -> None:
    p5_block.template.resource_count_is("AWS::EC2::PlacementGroup", 0)
    for group_id in p5_block.groups():
        assert "PlacementGroup" not in p5_block.props(group_id)
    assert p5_block.output("PlacementGroupName") == "none"


def test_capacity_block_passes_the_linters(p5_block: Synth) -> None:
    matches = lint(json.dumps(p5_block.json), config=ManualArgs(regions=[p5_block.stack.region]))
    assert [m for m in matches if m.rule.id.startswith("E")] == []
    assert _nag_findings(p5_block.stack) == []


def test_spot_uses_a_mixed_instances_policy(p5_spot: Synth) -> None:
    group = p5_spot.props("WorkerGroup")
    assert "LaunchTemplate" not in group
    policy = group["MixedInstancesPolicy"]
    assert policy["InstancesDistribution"]["OnDemandPercentageAboveBaseCapacity"] == 0
    assert policy["InstancesDistribution"]["OnDemandBaseCapacity"] == 0
    assert policy["LaunchTemplate"]["Overrides"] == [{"InstanceType": "p5.48xlarge"}]
    assert _sizes(p5_spot, "WorkerGroup") == ("4", "4", "4")
    p5_spot.template.has_resource_properties("AWS::EC2::Subnet", {"AvailabilityZone": "us-east-1b"})


# --- The TTL guard ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "ttl_hours", "schedule"), [("p3_beegfs", "6", "scaletrain-ttl"), ("p5_spot", "24", "big-h100-ttl")]
)
def test_ttl_schedule_invokes_the_guard_from_the_deploy_on_so_a_teardown_acts_within_its_period(
    name: str, ttl_hours: str, schedule: str, request: pytest.FixtureRequest
) -> None:
    synth = shape(request, name)
    clock = synth.resources_all["TtlClock"]
    assert clock["Type"] == "Custom::TtlClock"
    assert clock["Properties"]["TtlHours"] == ttl_hours
    function_id = _guard_function(synth)

    props = synth.props("TtlSchedule")
    assert (props["Name"], props["GroupName"], props["State"]) == (schedule, "default", "ENABLED")
    # Scheduler invokes nothing before a schedule's StartDate (CreateSchedule, EventBridge Scheduler API Reference):
    # with StartDate at the deploy-time expiry, an epilog's --teardown (the parameter moved to now) waited for it,
    # up to the whole TTL. No StartDate: the guard reads the parameter every 15 minutes from the deploy on, so the
    # stack goes within 15 minutes of the time written there, whichever way it moved. The parameter is made first:
    # the guard counts a missing one as expired.
    assert "StartDate" not in props
    assert props["ScheduleExpression"] == "rate(15 minutes)"
    parameter_id = next(k for k, r in synth.resources_all.items() if r["Type"] == "AWS::SSM::Parameter"
                        and "ttl-expires-at" in json.dumps(r["Properties"].get("Name", "")))
    assert parameter_id in synth.resources_all["TtlSchedule"].get("DependsOn", []), "the schedule before its parameter"
    assert "EndDate" not in props
    assert props["FlexibleTimeWindow"] == {"Mode": "OFF"}
    target = props["Target"]
    assert target["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]}
    assert json.loads(target["Input"]) == {"action": "expire"}
    assert synth.output("TtlExpiresAt") == "<TtlClock.ExpiresAt>"
    assert (synth.output("TtlScheduleName"), synth.output("TtlScheduleGroup")) == (schedule, "default")
    assert synth.output("TtlHours") == ttl_hours


@pytest.mark.parametrize(("name", "cluster"), [("p3_beegfs", "scaletrain"), ("p5_spot", "big-h100")])
def test_the_expiry_lives_in_a_parameter_the_guard_reads_and_the_launcher_writes(
    name: str, cluster: str, request: pytest.FixtureRequest
) -> None:
    """Extending the TTL must not need iam:PassRole: the launcher writes the expiry to an SSM parameter (the
    schedule, which UpdateSchedule would have to pass its role again to move, is never touched)."""
    synth = shape(request, name)
    expiry = synth.resources_all["TtlExpiry"]
    assert expiry["Type"] == "AWS::SSM::Parameter"
    props = expiry["Properties"]
    assert (props["Name"], props["Type"]) == (ttl.parameter_name(cluster), "String")
    assert props["Value"] == {"Fn::GetAtt": ["TtlClock", "ExpiresAt"]}  # the deploy-time expiry, until extended
    function = synth.props(_guard_function(synth))
    assert function["Environment"]["Variables"]["TTL_PARAMETER"] == ttl.parameter_name(cluster)
    assert synth.output("TtlParameterName") == ttl.parameter_name(cluster)
    description = synth.json["Outputs"]["TtlParameterName"]["Description"]
    assert all(action in description for action in ttl.EXTEND_PERMISSIONS) and "no iam:PassRole" in description


def test_ttl_counts_from_when_the_nodes_and_file_system_exist(p3dn_fsx: Synth, p5_spot: Synth) -> None:
    assert set(p3dn_fsx.resources_all["TtlClock"]["DependsOn"]) == {"WorkerGroup", "ReducerGroup", "FileSystem"}
    assert p5_spot.resources_all["TtlClock"]["DependsOn"] == ["WorkerGroup"]


def _guard_function(synth: Synth) -> str:
    """The function behind the TTL clock (the VPC's default-group custom resource has a function too)."""
    function_id = synth.props("TtlClock")["ServiceToken"]["Fn::GetAtt"][0]
    assert synth.resources_all[function_id]["Type"] == "AWS::Lambda::Function"
    return function_id


def _policy_of(synth: Synth, role_id: str) -> list[dict[str, Any]]:
    (policy,) = (
        p for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
    )
    return policy["Properties"]["PolicyDocument"]["Statement"]


def test_guard_function_may_only_read_its_expiry_and_describe_and_delete_this_stack(p5_spot: Synth) -> None:
    props = p5_spot.props(_guard_function(p5_spot))
    assert props["Code"]["ZipFile"] == FUNCTION_SOURCE.read_text()
    assert props["Environment"]["Variables"] == {
        "STACK_ID": {"Ref": "AWS::StackId"},
        "TTL_PARAMETER": ttl.parameter_name("big-h100"),
    }
    assert props["LoggingConfig"] == {"LogGroup": {"Ref": "GuardLogGroup"}}
    role_id = props["Role"]["Fn::GetAtt"][0]
    assert "ManagedPolicyArns" not in p5_spot.props(role_id)
    statements = _policy_of(p5_spot, role_id)
    # The one parameter, named in the stack's own region (the partition is a literal there).
    parameter_arn = "arn:aws:ssm:us-east-1:<AWS::AccountId>:parameter" + ttl.parameter_name("big-h100")
    assert [
        (sorted([s["Action"]] if isinstance(s["Action"], str) else s["Action"]), render(s["Resource"]))
        for s in statements
    ] == [
        (["cloudformation:DeleteStack", "cloudformation:DescribeStacks"], "<AWS::StackId>"),
        (["logs:CreateLogStream", "logs:PutLogEvents"], "<GuardLogGroup.Arn>"),
        (["ssm:GetParameter"], parameter_arn),
    ]


def test_scheduler_may_only_invoke_the_guard(p5_spot: Synth) -> None:
    role_id = p5_spot.props("TtlSchedule")["Target"]["RoleArn"]["Fn::GetAtt"][0]
    function_id = _guard_function(p5_spot)
    trust = p5_spot.props(role_id)["AssumeRolePolicyDocument"]["Statement"]
    assert [s["Principal"] for s in trust] == [{"Service": "scheduler.amazonaws.com"}]
    assert [(s["Action"], s["Resource"]) for s in _policy_of(p5_spot, role_id)] == [
        ("lambda:InvokeFunction", {"Fn::GetAtt": [function_id, "Arn"]})
    ]


# --- Idle autostop (-c idle_minutes) ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def p3dn_idle() -> Synth:
    return Synth(instance_type="p3dn.24xlarge", nodes="2", reducers="1", reducer_type="c5n.18xlarge", ami=AMI,
                 idle_minutes="45", cluster_name="idle")


def _idle_function(synth: Synth) -> str:
    (function_id,) = (k for k, v in synth.resources("AWS::Lambda::Function").items()
                      if v["Properties"].get("Code", {}).get("ZipFile") == IDLE_FUNCTION_SOURCE.read_text())
    return function_id


def test_idle_minutes_adds_a_schedule_that_runs_the_idle_check_every_5_minutes(p3dn_idle: Synth) -> None:
    function_id = _idle_function(p3dn_idle)
    env = p3dn_idle.props(function_id)["Environment"]["Variables"]
    assert env["IDLE_MINUTES"] == "45" and env["STACK_ID"] == {"Ref": "AWS::StackId"}
    # Each group with its own busy threshold: half a vCPU of a p3dn (96 vCPUs) and of a c5n.18xlarge (72).
    groups = json.loads(render(env["GROUPS"]))
    assert groups == [["<WorkerGroup>", ttl.idle_cpu_percent(96)], ["<ReducerGroup>", ttl.idle_cpu_percent(72)]]
    (schedule_id,) = (k for k, v in p3dn_idle.resources("AWS::Scheduler::Schedule").items()
                      if v["Properties"]["Target"]["Arn"] == {"Fn::GetAtt": [function_id, "Arn"]})
    props = p3dn_idle.props(schedule_id)
    assert props["ScheduleExpression"] == "rate(5 minutes)" and "StartDate" not in props
    assert set(p3dn_idle.resources_all[schedule_id]["DependsOn"]) >= {"WorkerGroup", "ReducerGroup"}
    assert p3dn_idle.output("IdleMinutes") == "45"


def test_idle_function_may_only_read_cpu_metrics_and_delete_this_stack(p3dn_idle: Synth) -> None:
    props = p3dn_idle.props(_idle_function(p3dn_idle))
    assert props["LoggingConfig"] == {"LogGroup": {"Ref": "GuardLogGroup"}}
    role_id = props["Role"]["Fn::GetAtt"][0]
    assert "ManagedPolicyArns" not in p3dn_idle.props(role_id)
    assert [
        (sorted([s["Action"]] if isinstance(s["Action"], str) else s["Action"]), render(s["Resource"]))
        for s in _policy_of(p3dn_idle, role_id)
    ] == [
        (["cloudformation:DeleteStack"], "<AWS::StackId>"),
        (["cloudwatch:GetMetricStatistics"], "*"),
        (["logs:CreateLogStream", "logs:PutLogEvents"], "<GuardLogGroup.Arn>"),
    ]


def test_without_idle_minutes_there_is_no_idle_check(p5_spot: Synth) -> None:
    assert len(p5_spot.resources("AWS::Scheduler::Schedule")) == 1
    assert "GetMetricStatistics" not in json.dumps(p5_spot.resources("AWS::IAM::Policy"))
    assert p5_spot.output("IdleMinutes") == "none"


def test_idle_stop_passes_the_linters(p3dn_idle: Synth) -> None:
    assert _nag_findings(p3dn_idle.stack) == []
    matches = lint(json.dumps(p3dn_idle.json), config=ManualArgs(regions=[p3dn_idle.stack.region]))
    assert [m for m in matches if m.rule.id.startswith("E")] == []


# --- Storage ----------------------------------------------------------------------------------------------------------


def test_fsx_lustre_with_its_s3_data_repository(p3dn_fsx: Synth) -> None:
    props = p3dn_fsx.props("FileSystem")
    assert (props["FileSystemType"], props["StorageCapacity"]) == ("LUSTRE", 2400)
    assert props["SubnetIds"] == [{"Ref": next(iter(p3dn_fsx.resources("AWS::EC2::Subnet")))}]
    lustre = props["LustreConfiguration"]
    assert lustre["DeploymentType"] == "SCRATCH_2"
    assert lustre["ImportPath"] == "s3://my-imagenet-shards"
    mount = p3dn_fsx.output_json("StorageMount")
    assert mount == {
        "type": "fsx",
        "file_system_id": "<FileSystem>",
        "dns_name": "<FileSystem.DNSName>",
        "mount_name": "<FileSystem.LustreMountName>",
        "mount_point": "/fsx",
        "mount_options": "relatime,flock",
        "capacity_gib": 2400,
        "deployment_type": "SCRATCH_2",
        "data_repository": "s3://my-imagenet-shards",
    }


def test_fsx_without_a_bucket_has_no_repository(p4d_fsx: Synth) -> None:
    assert p4d_fsx.props("FileSystem")["StorageCapacity"] == 1200
    assert "ImportPath" not in p4d_fsx.props("FileSystem")["LustreConfiguration"]
    assert "data_repository" not in p4d_fsx.output_json("StorageMount")
    assert p4d_fsx.output("DataBucket") == "none"


def test_beegfs_records_ram_disks_and_roles_and_creates_no_file_system(p3_beegfs: Synth) -> None:
    p3_beegfs.template.resource_count_is("AWS::FSx::FileSystem", 0)
    assert p3_beegfs.output("Storage") == "beegfs"
    mount = p3_beegfs.output_json("StorageMount")
    assert mount["type"] == "beegfs" and mount["mount_point"] == "/beegfs"
    assert mount["ramdisk_gib_per_node"] == 122  # a quarter of p3.16xlarge's 488 GiB
    assert mount["roles"]["management"] == ["worker:0"] and mount["roles"]["storage"] == ["worker:*"]


FSX_FSTAB = "<FileSystem.DNSName>@tcp:/<FileSystem.LustreMountName> /fsx lustre defaults,relatime,flock,_netdev 0 0"


def _boots(synth: Synth) -> dict[str, dict[str, Any]]:
    """Each instance's launch template data, by what launches it: the head node and every node group."""
    head = synth.props("HeadNode")["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
    return {"HeadNode": synth.props(head)["LaunchTemplateData"]} | {g: synth.launch_template(g) for g in synth.groups()}


def _depends_on(synth: Synth, logical_id: str) -> set[str]:
    """Every resource CloudFormation creates before ``logical_id``: its Ref, Fn::GetAtt and DependsOn, transitively."""
    def refs(value: Any) -> set[str]:
        if isinstance(value, dict):
            found = {value["Ref"]} if isinstance(value.get("Ref"), str) else set()
            if "Fn::GetAtt" in value:
                found.add(value["Fn::GetAtt"][0])
            return found.union(*(refs(v) for v in value.values()))
        return set().union(*(refs(v) for v in value)) if isinstance(value, list) else set()

    seen: set[str] = set()
    todo = [logical_id]
    while todo:
        resource = synth.resources_all[todo.pop()]
        direct = refs(resource.get("Properties", {})) | set(resource.get("DependsOn", []))
        for found in direct & set(synth.resources_all) - seen:
            seen.add(found)
            todo.append(found)
    return seen


@pytest.mark.parametrize("name", ["p3dn_fsx", "p4d_fsx"])
def test_with_fsx_every_instance_mounts_it_from_fstab_in_its_own_boot_before_slurm(
    name: str, request: pytest.FixtureRequest
) -> None:
    """The head node, the workers and the reducers (an Auto Scaling replacement too) mount FSx themselves: the
    file system's names reach their user data as Fn::GetAtt, so CloudFormation creates it before any of them, and the
    fstab line and its mount come before Slurm's daemons start, so slurmd's first health check can ask for it."""
    synth = shape(request, name)
    boots = _boots(synth)
    assert set(boots) == {"HeadNode", "WorkerGroup", "ReducerGroup"}
    for launcher_id, data in boots.items():
        raw = json.dumps(data["UserData"])
        for attribute in ("DNSName", "LustreMountName"):
            assert json.dumps({"Fn::GetAtt": ["FileSystem", attribute]}) in raw, launcher_id
        assert "FileSystem" in _depends_on(synth, launcher_id), launcher_id
        script = render(data["UserData"]["Fn::Base64"])
        lines = script.splitlines()
        (fstab,) = [i for i, line in enumerate(lines) if line.endswith(" >> /etc/fstab")]
        assert f"echo '{FSX_FSTAB}' >> /etc/fstab" in lines[fstab]
        mount = lines.index("until mountpoint -q /fsx || mount /fsx; do")
        daemon = "slurmctld.service" if launcher_id == "HeadNode" else "slurmd.service"
        (start,) = [i for i, line in enumerate(lines) if line.startswith("systemctl enable --now") and daemon in line]
        assert fstab < mount < lines.index("systemctl enable --now munge.service") < start, launcher_id
        subprocess.run(["bash", "-n", "-c", script], check=True)
        if launcher_id != "HeadNode":  # slurmd's health check now asks for the mount the boot made
            assert f"--shared-mount /fsx --instance-type {data['InstanceType']} --storage fsx " in script


@pytest.mark.parametrize("name", ["p3_beegfs", "p5_spot"])
def test_without_fsx_no_boot_mounts_storage(name: str, request: pytest.FixtureRequest) -> None:
    """BeeGFS (RAM disks the launcher sets up after boot) and none: no fstab line, and health checks without it."""
    synth = shape(request, name)
    for launcher_id, data in _boots(synth).items():
        script = render(data["UserData"]["Fn::Base64"])
        assert "/etc/fstab" not in script and "mount " not in script and "FileSystem" not in script, launcher_id
        if launcher_id != "HeadNode":
            assert " --storage none " in script and "--shared-mount" not in script, launcher_id


# --- Outputs and logical IDs ------------------------------------------------------------------------------------------


OUTPUT_KEYS = {
    "ClusterName", "InstanceType", "NodeGroupName", "ReducerGroupName", "NodeGroups", "EfaDevicesPerNode",
    "EfaDevices", "ReducerTransport", "Storage", "StorageMount", "DataBucket", "PlacementGroupName", "TtlHours",
    "TtlExpiresAt", "TtlParameterName", "TtlScheduleName", "TtlScheduleGroup", "ImageParameter", "IdleMinutes",
    "HeadNode",
}  # fmt: skip


@pytest.mark.parametrize("name", SHAPES)
def test_outputs_are_complete_and_structured_ones_parse(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    assert set(synth.json["Outputs"]) == OUTPUT_KEYS
    for key in ("NodeGroups", "EfaDevices", "StorageMount"):
        synth.output_json(key)
        assert len(synth.output(key)) < 4096
    assert synth.output("ClusterName") == synth.context["cluster_name"]
    assert synth.output("NodeGroupName") == "<WorkerGroup>"
    assert synth.output_json("EfaDevices") == synth.output_json("NodeGroups")[0]["efa_devices"]
    assert int(synth.output("EfaDevicesPerNode")) == len(
        [i for i in synth.output_json("EfaDevices") if i["interface_type"] != "interface"]
    )


def test_outputs_describe_workers_and_reducers(p4d_fsx: Synth, p5_spot: Synth) -> None:
    workers, reducers = p4d_fsx.output_json("NodeGroups")
    assert workers == {
        "role": "worker",
        "group_name": "<WorkerGroup>",
        "instance_type": "p4d.24xlarge",
        "nodes": 8,
        "transport": "efa",
        "efa_devices": [
            {"network_card_index": 0, "device_index": 0, "interface_type": "efa"},
            {"network_card_index": 1, "device_index": 0, "interface_type": "efa-only"},
            {"network_card_index": 2, "device_index": 0, "interface_type": "efa-only"},
            {"network_card_index": 3, "device_index": 0, "interface_type": "efa-only"},
        ],
    }
    assert reducers == {
        "role": "reducer",
        "group_name": "<ReducerGroup>",
        "instance_type": "c5n.18xlarge",
        "nodes": 2,
        "transport": "tcp",
        "efa_devices": [{"network_card_index": 0, "device_index": 0, "interface_type": "interface"}],
    }
    assert (p4d_fsx.output("EfaDevicesPerNode"), p4d_fsx.output("ReducerGroupName")) == ("4", "<ReducerGroup>")
    assert [g["role"] for g in p5_spot.output_json("NodeGroups")] == ["worker"]
    assert (p5_spot.output("EfaDevicesPerNode"), p5_spot.output("ReducerGroupName")) == ("32", "none")
    assert (p5_spot.output("ReducerTransport"), p5_spot.output("Storage")) == ("none", "none")
    assert p5_spot.output_json("StorageMount") == {"type": "none"}


def test_every_output_is_documented() -> None:
    readme = (ROOT / "infra" / "README.md").read_text()
    assert sorted(key for key in OUTPUT_KEYS if f"| `{key}` |" not in readme) == []


PINNED_TYPES = {
    "PlacementGroup": "AWS::EC2::PlacementGroup",
    "WorkerGroup": "AWS::AutoScaling::AutoScalingGroup",
    "ReducerGroup": "AWS::AutoScaling::AutoScalingGroup",
    "FileSystem": "AWS::FSx::FileSystem",
    "FlowLogGroup": "AWS::Logs::LogGroup",
    "GuardLogGroup": "AWS::Logs::LogGroup",
    "TtlClock": "Custom::TtlClock",
    "TtlExpiry": "AWS::SSM::Parameter",
    "TtlSchedule": "AWS::Scheduler::Schedule",
    "HeadNode": "AWS::EC2::Instance",
    "MungeKey": "AWS::SecretsManager::Secret",
    "CustomVpcRestrictDefaultSGCustomResourceProviderLogGroup": "AWS::Logs::LogGroup",
}


def test_stateful_resources_keep_pinned_logical_ids(p3dn_fsx: Synth, p5_spot: Synth) -> None:
    assert set(PINNED_TYPES) == set(PINNED_LOGICAL_IDS)
    for logical_id, kind in PINNED_TYPES.items():
        assert p3dn_fsx.resources_all[logical_id]["Type"] == kind
    absent = {"ReducerGroup", "FileSystem"}  # p5_spot has no reducers and no file system
    assert {k for k in PINNED_TYPES if k in p5_spot.resources_all} == set(PINNED_TYPES) - absent
    for kind in set(PINNED_TYPES.values()):
        assert set(p3dn_fsx.resources(kind)) <= set(PINNED_TYPES)


# --- Scale: 256 nodes synthesize to the same template as 8 ------------------------------------------------------------


def test_synth_cost_does_not_grow_with_nodes(p4d_fsx: Synth, p4d_256: Synth) -> None:
    assert set(p4d_256.resources_all) == set(p4d_fsx.resources_all)
    small, large = json.dumps(p4d_fsx.json, sort_keys=True), json.dumps(p4d_256.json, sort_keys=True)
    assert abs(len(large) - len(small)) <= 20  # "8" -> "256" in four places, MaxNodeCount 20 -> 516
    # Only the worker group's size differs, the node count in the NodeGroups output, and the head node's slurm.conf
    # MaxNodeCount (infra.boot.max_nodes) in its boot script.
    resized = json.loads(small)
    for key in ("MinSize", "MaxSize", "DesiredCapacity"):
        resized["Resources"]["WorkerGroup"]["Properties"][key] = "256"
    resized["Outputs"]["NodeGroups"] = p4d_256.json["Outputs"]["NodeGroups"]
    head_template = p4d_fsx.props("HeadNode")["LaunchTemplate"]["LaunchTemplateId"]["Ref"]
    resized_user_data = json.dumps(resized["Resources"][head_template]["Properties"]["LaunchTemplateData"]["UserData"])
    assert resized_user_data.count("MaxNodeCount=20\\n") == 1
    resized["Resources"][head_template]["Properties"]["LaunchTemplateData"]["UserData"] = json.loads(
        resized_user_data.replace("MaxNodeCount=20\\n", "MaxNodeCount=516\\n")
    )
    assert resized == json.loads(large)
    assert p4d_256.output_json("NodeGroups")[0]["nodes"] == 256


# --- Linters ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_cfn_lint_reports_no_errors(name: str, request: pytest.FixtureRequest) -> None:
    synth = shape(request, name)
    # The stack's own region: cfn-lint checks instance types against that region's offerings.
    matches = lint(json.dumps(synth.json), config=ManualArgs(regions=[synth.stack.region]))
    errors = [m for m in matches if m.rule.id.startswith("E")]
    assert errors == [], "\n".join(f"{m.rule.id} {'/'.join(map(str, m.path))}: {m.message[:200]}" for m in errors)


def _nag_findings(stack: Stack) -> list[str]:
    annotations = Annotations.from_stack(stack)
    errors = annotations.find_error("*", Match.string_like_regexp("AwsSolutions-.*"))
    # A rule that threw is a rule that did not check anything: count it as a finding too.
    failures = annotations.find_warning("*", Match.string_like_regexp("CdkNagValidationFailure.*"))
    return [f"{f.id}: {f.entry.data}" for f in errors + failures]


@pytest.mark.parametrize("name", SHAPES)
def test_cdk_nag_has_no_unsuppressed_findings(name: str, request: pytest.FixtureRequest) -> None:
    findings = _nag_findings(shape(request, name).stack)
    assert findings == [], "\n".join(findings)


def test_cdk_nag_runs_on_every_synth() -> None:
    """The same build() with one careless resource added: AwsSolutions must report it."""
    _, stack = build({**DEFAULT_CONTEXT, "nodes": "1"})
    careless = ec2.CfnSecurityGroup(
        stack,
        "Careless",
        group_description="open SSH",
        vpc_id="vpc-12345678",
        security_group_ingress=[
            ec2.CfnSecurityGroup.IngressProperty(ip_protocol="tcp", from_port=22, to_port=22, cidr_ip="0.0.0.0/0")
        ],
    )
    findings = _nag_findings(stack)
    assert any(careless.node.path in f and "AwsSolutions-EC23" in f for f in findings), findings


# --- The app: bad input and the CDK CLI -------------------------------------------------------------------------------


def _run_app(context: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CDK_ENV, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": "/nonexistent-not-written"}
    return subprocess.run(
        [sys.executable, "infra/app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ({"nodes": "0"}, "error: nodes='0': allowed: 1 to 4096 worker nodes"),
        ({"storage": "fsx", "fsx_capacity_gib": "3000"},
         "error: fsx_capacity_gib='3000': allowed: 1200 or a multiple of 2400 GiB (1200, 2400, 4800, 7200, ...)"),
        ({"ssh_cidr": "203.0.113.0/24"}, "error: ssh_cidr='203.0.113.0/24': " + REMOVED_KEYS["ssh_cidr"]),
        ({"capacity_reservation_id": CR}, "error: az: required with capacity_reservation_id='cr-0123456789abcdef0'"),
    ],
)  # fmt: skip
def test_app_exits_1_with_one_error_line(override: dict[str, str], line: str) -> None:
    result = _run_app({**DEFAULT_CONTEXT, **override})
    assert result.returncode == 1
    (got,) = result.stderr.strip().splitlines()
    assert got.startswith(line), got
    assert result.stdout == ""


CDK_CLI = ROOT / "node_modules" / ".bin" / "cdk"
needs_cli = pytest.mark.skipif(not CDK_CLI.exists() or not shutil.which("node"), reason="CDK CLI not installed")


def _cli_env(tmp_path: Path) -> dict[str, str]:
    """No credentials, no profile, no instance metadata: synth must not need AWS."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, **CDK_ENV, "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true", "CI": "1"}


@needs_cli
def test_cdk_cli_synth_needs_no_credentials_and_no_lookups(tmp_path: Path) -> None:
    out = tmp_path / "cdk.out"
    argv = [str(CDK_CLI), "synth", "-q", "-o", str(out), "-c", "instance_type=p4d.24xlarge", "-c", "nodes=8",
            "-c", "storage=fsx"]  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, env=_cli_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert "missing" not in manifest  # no context lookup was needed
    template = json.loads((out / "scaletrain.template.json").read_text())
    assert template["Resources"]["WorkerGroup"]["Properties"]["DesiredCapacity"] == "8"
    assert template["Resources"]["FileSystem"]["Type"] == "AWS::FSx::FileSystem"
    assert not (ROOT / "cdk.context.json").exists()


@needs_cli
def test_cdk_cli_bad_context_is_one_error_line_and_no_traceback(tmp_path: Path) -> None:
    argv = [str(CDK_CLI), "synth", "-q", "-o", str(tmp_path / "cdk.out"), "-c", "nodes=0"]
    result = subprocess.run(argv, cwd=ROOT, env=_cli_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: nodes='0': allowed: 1 to 4096 worker nodes"]
    assert "Traceback" not in result.stderr + result.stdout


# Services an instance calls whose requests go to another service and not to its own endpoint: none of the stack's
# calls today but KMS, which S3 calls for an SSE-KMS object (the statement's kms:ViaService says so).
def _via_another_service(statement: dict[str, Any]) -> bool:
    return any("kms:ViaService" in cond for cond in statement.get("Condition", {}).values())


@pytest.mark.parametrize("name", [*SHAPES, "p4d_checkpoints"])
def test_every_service_an_instance_may_call_has_an_endpoint_in_its_subnet(name: str,
                                                                           request: pytest.FixtureRequest) -> None:
    """The node subnet has no route out (no internet or NAT gateway): an instance reaches an AWS service only through
    a VPC endpoint for it, and a call to any other finds no route and hangs until its timeout. So every service an
    instance role's policies allow an action of has an endpoint: a permission without a route is a call that cannot
    be made (a drained node's autoscaling:SetInstanceHealth had none, and the node was never replaced: issue 46's
    fourth review). "To use AWS PrivateLink, create a VPC endpoint ... for each service"
    (https://docs.aws.amazon.com/vpc/latest/privatelink/privatelink-access-aws-services.html)."""
    synth = shape(request, name)
    resources = synth.template.to_json()["Resources"]
    instance_roles = {k for k, v in resources.items() if v["Type"] == "AWS::IAM::Role"
                      and v["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]
                      == {"Service": "ec2.amazonaws.com"}}
    assert len(instance_roles) == 2   # the nodes' and the head node's
    called: dict[str, str] = {}
    for policy in (v for v in resources.values() if v["Type"] == "AWS::IAM::Policy"):
        if not {r["Ref"] for r in policy["Properties"]["Roles"]} & instance_roles:
            continue
        for statement in policy["Properties"]["PolicyDocument"]["Statement"]:
            if _via_another_service(statement):
                continue
            actions = statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
            called |= {a.split(":")[0]: a for a in actions}
    # AmazonSSMManagedInstanceCore: the SSM agent's own calls (https://docs.aws.amazon.com/systems-manager/latest/userguide/setup-create-vpc.html)
    called |= {"ssm": "ssm:UpdateInstanceInformation", "ssmmessages": "ssmmessages:CreateControlChannel",
               "ec2messages": "ec2messages:GetMessages"}
    reached = {render(e["Properties"]["ServiceName"]).rsplit(".", 1)[-1]
               for e in synth.resources("AWS::EC2::VPCEndpoint").values()}
    assert {"autoscaling", "secretsmanager"} <= set(called)
    unreachable = {service: action for service, action in called.items() if service not in reached}
    assert not unreachable, f"no VPC endpoint for {unreachable}"
