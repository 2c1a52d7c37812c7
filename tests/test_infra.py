"""CDK assertion tests for the cluster stack: one synth per configuration, shared by module-scoped fixtures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_cdk")

from aws_cdk import Stack  # noqa: E402
from aws_cdk.assertions import Annotations, Match, Template  # noqa: E402
from cfnlint.api import ManualArgs, lint  # noqa: E402

from infra import catalog  # noqa: E402
from infra.app import build  # noqa: E402
from infra.spec import ClusterSpec, SpecError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CONTEXT: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]


class Synth:
    """One synthesized configuration: the stack, its template and its template as a dict."""

    def __init__(self, **overrides: Any) -> None:
        _, self.stack = build({**DEFAULT_CONTEXT, **overrides})
        self.template = Template.from_stack(self.stack)
        self.json: dict[str, Any] = self.template.to_json()

    def resources(self, kind: str) -> dict[str, Any]:
        return {k: v for k, v in self.json["Resources"].items() if v["Type"] == kind}

    def one(self, kind: str) -> dict[str, Any]:
        found = list(self.resources(kind).values())
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]["Properties"]

    def interfaces(self) -> list[dict[str, Any]]:
        return self.one("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["NetworkInterfaces"]


@pytest.fixture(scope="module")
def p4d() -> Synth:
    return Synth(instance_type="p4d.24xlarge", nodes="8", ssh_cidr="203.0.113.0/24")


@pytest.fixture(scope="module")
def p4d_256() -> Synth:
    return Synth(instance_type="p4d.24xlarge", nodes="256")


@pytest.fixture(scope="module")
def p3() -> Synth:
    return Synth(instance_type="p3.16xlarge", nodes="2", ami="ami-0123456789abcdef0")


@pytest.fixture(scope="module")
def p5_spot() -> Synth:
    return Synth(instance_type="p5.48xlarge", nodes="4", spot="true", az="us-east-1b")


ALL = ["p4d", "p3", "p5_spot"]


# --- Network interfaces: the EFA layout per family -----------------------------------------------


def test_p4d_has_one_efa_interface_per_network_card(p4d: Synth) -> None:
    interfaces = p4d.interfaces()
    assert catalog.get("p4d.24xlarge").efa_cards == 4
    assert [i["NetworkCardIndex"] for i in interfaces] == [0, 1, 2, 3]
    assert [i["DeviceIndex"] for i in interfaces] == [0, 1, 1, 1]
    assert {i["InterfaceType"] for i in interfaces} == {"efa"}


def test_p5_has_32_efa_interfaces(p5_spot: Synth) -> None:
    interfaces = p5_spot.interfaces()
    assert len(interfaces) == catalog.get("p5.48xlarge").efa_cards == 32
    assert [i["NetworkCardIndex"] for i in interfaces] == list(range(32))
    assert [i["DeviceIndex"] for i in interfaces] == [0] + [1] * 31


def test_p3_without_efa_has_one_ordinary_interface(p3: Synth) -> None:
    (interface,) = p3.interfaces()
    assert interface["DeviceIndex"] == 0
    assert "InterfaceType" not in interface and "NetworkCardIndex" not in interface
    p3.template.has_output("EfaDevicesPerNode", {"Value": "0"})


@pytest.mark.parametrize("name", ALL)
def test_interfaces_carry_the_node_group_and_no_public_ip(name: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(name)
    group_id = _node_group(synth)
    for interface in synth.interfaces():
        assert interface["AssociatePublicIpAddress"] is False
        assert interface["Groups"] == [{"Fn::GetAtt": [group_id, "GroupId"]}]


# --- Placement, security, instance settings ------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_cluster_placement_group_holds_the_node_group(name: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(name)
    synth.template.resource_count_is("AWS::EC2::PlacementGroup", 1)
    synth.template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    (pg_id,) = synth.resources("AWS::EC2::PlacementGroup")
    assert synth.one("AWS::AutoScaling::AutoScalingGroup")["PlacementGroup"] == {"Ref": pg_id}


def _node_group(synth: Synth) -> str:
    (group_id,) = (
        k
        for k, v in synth.resources("AWS::EC2::SecurityGroup").items()
        if v["Properties"]["GroupDescription"].startswith("scaletrain nodes")
    )
    return group_id


def _endpoint_groups(synth: Synth) -> set[str]:
    return synth.resources("AWS::EC2::SecurityGroup").keys() - {_node_group(synth)}


def test_security_group_allows_all_traffic_to_and_from_itself(p4d: Synth) -> None:
    group_id = _node_group(p4d)
    group = {"Fn::GetAtt": [group_id, "GroupId"]}
    p4d.template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress", {"IpProtocol": "-1", "GroupId": group, "SourceSecurityGroupId": group}
    )
    p4d.template.has_resource_properties(
        "AWS::EC2::SecurityGroupEgress", {"IpProtocol": "-1", "GroupId": group, "DestinationSecurityGroupId": group}
    )


def test_ssh_only_from_ssh_cidr(p4d: Synth, p3: Synth) -> None:
    def ssh_rules(synth: Synth) -> list[dict[str, Any]]:
        rules = [
            r
            for g in synth.resources("AWS::EC2::SecurityGroup").values()
            for r in g["Properties"].get("SecurityGroupIngress", [])
        ]
        return [r for r in rules if r.get("FromPort") == 22]

    assert [r["CidrIp"] for r in ssh_rules(p4d)] == ["203.0.113.0/24"]
    assert ssh_rules(p3) == []


def test_endpoints_accept_https_from_the_nodes_only(p4d: Synth) -> None:
    assert len(p4d.resources("AWS::EC2::VPCEndpoint")) == 4  # S3 gateway + ssm, ssmmessages, ec2messages
    assert len(_endpoint_groups(p4d)) == 3
    for group in _endpoint_groups(p4d):
        p4d.template.has_resource_properties(
            "AWS::EC2::SecurityGroupIngress",
            {"IpProtocol": "tcp", "FromPort": 443, "ToPort": 443, "GroupId": {"Fn::GetAtt": [group, "GroupId"]}},
        )
        assert "SecurityGroupIngress" not in p4d.json["Resources"][group]["Properties"]


def test_nodes_have_no_route_to_the_internet(p4d: Synth) -> None:
    for kind in ("AWS::EC2::InternetGateway", "AWS::EC2::NatGateway", "AWS::EC2::EIP"):
        p4d.template.resource_count_is(kind, 0)
    p4d.template.resource_count_is("AWS::EC2::FlowLog", 1)


@pytest.mark.parametrize("name", ALL)
def test_imdsv2_required_and_root_volume_encrypted(name: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(name)
    data = synth.one("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    (root,) = data["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] is True and root["Ebs"]["VolumeType"] == "gp3"


def test_ami_default_is_resolved_at_deploy_time(p4d: Synth, p3: Synth) -> None:
    parameter = p4d.json["Parameters"]["DeepLearningAmi"]
    assert parameter["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert parameter["Default"].startswith("/aws/service/deeplearning/ami/")
    assert p4d.one("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["ImageId"] == {"Ref": "DeepLearningAmi"}
    assert p3.one("AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["ImageId"] == "ami-0123456789abcdef0"
    assert "DeepLearningAmi" not in p3.json.get("Parameters", {})


def test_instance_profile_has_ssm_core(p4d: Synth) -> None:
    (role,) = (r for k, r in p4d.resources("AWS::IAM::Role").items() if k.startswith("WorkersInstanceRole"))
    assert ":iam::aws:policy/AmazonSSMManagedInstanceCore" in json.dumps(role["Properties"]["ManagedPolicyArns"])
    profile = p4d.one("AWS::IAM::InstanceProfile")
    assert profile["Roles"] == [{"Ref": next(k for k in p4d.resources("AWS::IAM::Role") if k.startswith("Workers"))}]


# --- Capacity, spot, outputs ----------------------------------------------------------------------


def test_group_capacity_is_nodes_on_demand(p4d: Synth) -> None:
    group = p4d.one("AWS::AutoScaling::AutoScalingGroup")
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == ("8", "8", "8")
    assert "LaunchTemplate" in group and "MixedInstancesPolicy" not in group
    assert len(group["VPCZoneIdentifier"]) == 1


def test_spot_uses_a_mixed_instances_policy(p5_spot: Synth) -> None:
    group = p5_spot.one("AWS::AutoScaling::AutoScalingGroup")
    assert "LaunchTemplate" not in group
    policy = group["MixedInstancesPolicy"]
    assert policy["InstancesDistribution"]["OnDemandPercentageAboveBaseCapacity"] == 0
    assert policy["LaunchTemplate"]["Overrides"] == [{"InstanceType": "p5.48xlarge"}]
    assert group["DesiredCapacity"] == "4"
    p5_spot.template.has_resource_properties("AWS::EC2::Subnet", {"AvailabilityZone": "us-east-1b"})


def test_outputs(p4d: Synth) -> None:
    assert set(p4d.json["Outputs"]) >= {"ClusterName", "NodeGroupName", "EfaDevicesPerNode", "InstanceType", "Storage"}
    p4d.template.has_output("ClusterName", {"Value": "scaletrain"})
    p4d.template.has_output("EfaDevicesPerNode", {"Value": "4"})
    p4d.template.has_output("InstanceType", {"Value": "p4d.24xlarge"})
    p4d.template.has_output("Storage", {"Value": "none"})
    (group_id,) = p4d.resources("AWS::AutoScaling::AutoScalingGroup")
    p4d.template.has_output("NodeGroupName", {"Value": {"Ref": group_id}})


def test_synth_cost_does_not_grow_with_nodes(p4d: Synth, p4d_256: Synth) -> None:
    assert len(p4d_256.json["Resources"]) == len(p4d.json["Resources"])
    assert p4d_256.one("AWS::AutoScaling::AutoScalingGroup")["DesiredCapacity"] == "256"


# --- Linters ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL)
def test_cfn_lint_reports_no_errors(name: str, request: pytest.FixtureRequest) -> None:
    synth: Synth = request.getfixturevalue(name)
    # The stack's own region: cfn-lint checks instance types against that region's offerings.
    region = synth.stack.region
    matches = lint(json.dumps(synth.json), config=ManualArgs(regions=[region]))
    errors = [m for m in matches if m.rule.id.startswith("E")]
    assert errors == [], "\n".join(f"{m.rule.id} {'/'.join(map(str, m.path))}: {m.message[:200]}" for m in errors)


@pytest.mark.parametrize("name", ALL)
def test_cdk_nag_has_no_unsuppressed_errors(name: str, request: pytest.FixtureRequest) -> None:
    stack: Stack = request.getfixturevalue(name).stack
    findings = Annotations.from_stack(stack).find_error("*", Match.string_like_regexp("AwsSolutions-.*"))
    assert findings == [], "\n".join(f"{f.id}: {f.entry.data}" for f in findings)


# --- Bad input ---------------------------------------------------------------------------------------


BASE = {"cluster_name": "scaletrain", "instance_type": "p4d.24xlarge", "nodes": "2"}


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"nodes": "0"}, "nodes='0': input should be greater than or equal to 1"),
        ({"instance_type": "p9.huge"}, "instance_type='p9.huge': not in the instance catalog; allowed: p3.2xlarge"),
        ({"instance_type": "c5n.18xlarge"}, "instance_type='c5n.18xlarge': has no GPUs; allowed: p3.2xlarge"),
        ({"ttl_hours": "0"}, "ttl_hours='0': input should be greater than 0"),
        ({"storage": "nfs"}, "storage='nfs': input should be 'fsx', 'beegfs' or 'none'"),
        ({"reducer_type": "p3.2xlarge"}, "reducer_type='p3.2xlarge': has GPUs; reducers are CPU nodes"),
        ({"ssh_cidr": "0.0.0.0/0"}, "ssh_cidr='0.0.0.0/0': allowed: a narrower IPv4 CIDR"),
        ({"az": "eu-west-1a"}, "az='eu-west-1a': allowed: an availability zone of region us-east-1"),
        ({"spot": "true", "capacity_reservation_id": "cr-0123456789abcdef0"}, "spot=True: allowed: false when"),
        ({"cluster_name": "has_underscore"}, "cluster_name='has_underscore': allowed: a letter, then"),
    ],
)
def test_bad_context_gives_one_line_spec_error(override: dict[str, str], expected: str) -> None:
    with pytest.raises(SpecError) as caught:
        ClusterSpec.from_context({**BASE, **override})
    message = str(caught.value)
    assert message.startswith(expected) and "\n" not in message


def test_context_strings_are_coerced_and_transport_is_derived() -> None:
    spec = ClusterSpec.from_context({**BASE, "nodes": "3", "spot": "false", "reducers": "2", "ssh_cidr": ""})
    assert (spec.nodes, spec.spot, spec.reducers, spec.ssh_cidr) == (3, False, 2, None)
    assert spec.reducer_transport == "tcp"  # P4d talks to other families over TCP only
    assert ClusterSpec.from_context({**BASE, "instance_type": "p3dn.24xlarge"}).reducer_transport == "efa"
    assert ClusterSpec.from_context({**BASE, "instance_type": "p3.16xlarge"}).reducer_transport == "tcp"


def test_app_exits_1_with_one_error_line() -> None:
    env = {
        **os.environ,
        "CDK_CONTEXT_JSON": json.dumps({**DEFAULT_CONTEXT, "nodes": "0"}),
        "CDK_OUTDIR": "/nonexistent-outdir-not-written",
        "JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20",
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
    }
    result = subprocess.run(
        [sys.executable, "infra/app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == ["error: nodes='0': input should be greater than or equal to 1"]
    assert result.stdout == ""
