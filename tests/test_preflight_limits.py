"""What still stops a large cluster or the image build (issue 25, item 7): the Region's network-interface quota (a
p5.48xlarge takes 32 interfaces, so 150 of them take most of the default 5,000), and, with no image yet, the G and VT
vCPU quota the image build's G types draw on (0 in many new accounts) and a default VPC that routes out. Pure decisions
at their boundaries, on both sides; then the shell against moto (its default VPC, unlike AWS's, has no internet
gateway: the very case a user who deleted theirs is in)."""

from __future__ import annotations

import json

import boto3
import pytest
from test_aws_moto import env  # noqa: F401  (the moto fixture)
from test_preflight import facts, lines, spec
from test_preflight_aws import answer, publish_image, sess  # noqa: F401  (fixtures)

from infra import catalog
from launcher import cli
from launcher.execute import preflight as preflight_shell
from launcher.plans import preflight
from launcher.plans import preflight_limits as limits
from launcher.plans.preflight import Quota
from launcher.plans.preflight_limits import BuildFacts, InterfaceFacts

ENI, G_OD = "L-DF5E4CA3", "L-DB2E81BA"


# --- network interfaces ------------------------------------------------------------------------------------------

def test_a_p5_node_takes_one_interface_per_network_card_as_the_catalog_says():
    s = spec(instance_type="p5.48xlarge", nodes=150, az="us-east-1a")
    want, how = limits.interfaces_needed(s)
    assert catalog.get("p5.48xlarge").efa_cards == 32
    assert want == 150 * 32 + 1 + 5 and how.startswith("workers: 150 x 32 + head node 1 + VPC endpoints 5")
    assert limits.interfaces_needed(spec(instance_type="p4d.24xlarge", nodes=2))[0] == 2 * 4 + 6
    r = spec(instance_type="p4d.24xlarge", nodes=2, reducers=2)  # c5n reducers beside P4d: TCP, one interface
    assert limits.interfaces_needed(r)[0] == 2 * 4 + 2 * 1 + 6


@pytest.mark.parametrize(("in_use", "status"), [(194, "ok"), (195, "FAIL")])
def test_interfaces_fail_when_the_stack_would_pass_the_regional_quota_by_one(in_use, status):
    s = spec(instance_type="p5.48xlarge", nodes=150, az="us-east-1a")  # 4,806 interfaces
    [v] = limits.check_interfaces(s, InterfaceFacts(Quota(ENI, "Network interfaces per Region", 5000, in_use)))
    assert v.status == status, v
    if status == "FAIL":
        assert v.line.startswith(f"Network interfaces per Region ({ENI}) is 5000 in us-east-1 (195 in use); the "
                                 f"stack makes 4806")
        assert v.line.endswith(f"--service-code vpc --quota-code {ENI} --desired-value 5001`")


def test_unread_interfaces_are_skipped_and_not_asked_is_silent():
    s = spec()
    [v] = limits.check_interfaces(s, InterfaceFacts(preflight.Unread("AccessDeniedException: no")))
    assert v.status == "skip" and "AccessDeniedException" in v.line
    assert limits.check_interfaces(s, None) == []


# --- the image build -------------------------------------------------------------------------------------------

def build(**kw) -> BuildFacts:
    base = dict(instance_types=("g5.xlarge", "g6.xlarge", "g4dn.xlarge"), vcpus=4,
                quota=Quota(G_OD, "Running On-Demand G and VT instances", 4, 0),
                default_vpc="vpc-1", routes_out=True)
    return BuildFacts(**{**base, **kw})


@pytest.mark.parametrize(("quota", "status"), [(4, "ok"), (3, "FAIL"), (0, "FAIL")])
def test_the_image_build_needs_its_g5s_vcpus_under_the_g_and_vt_quota(quota, status):
    q = Quota(G_OD, "Running On-Demand G and VT instances", quota, None)
    [v, _] = limits.check_image_build(spec(), build(quota=q))
    assert v.status == status, v
    if status == "FAIL":
        assert (f"Running On-Demand G and VT instances (L-DB2E81BA) is {quota} vCPUs in us-east-1; the image build's "
                "g5.xlarge or g6.xlarge or g4dn.xlarge (whichever has capacity) needs 4") in v.line
        assert v.line.endswith("--service-code ec2 --quota-code L-DB2E81BA --desired-value 4`")
    else:
        assert v.line == ("Running On-Demand G and VT instances (L-DB2E81BA): the image build's g5.xlarge or g6.xlarge "
                          "or g4dn.xlarge (whichever has capacity) needs 4 of 4 vCPUs")


def test_one_build_type_is_named_alone():
    [v, _] = limits.check_image_build(spec(), build(instance_types=("g5.xlarge",)))
    assert v.line.endswith("the image build's g5.xlarge needs 4 of 4 vCPUs")


def test_the_image_build_needs_a_default_vpc_that_routes_out():
    [_, v] = limits.check_image_build(spec(), build(default_vpc=None))
    assert v.status == "FAIL" and v.line.endswith("`aws ec2 create-default-vpc --region us-east-1`")
    [_, v] = limits.check_image_build(spec(), build(routes_out=False))
    assert v.status == "FAIL" and "vpc-1 of us-east-1 has no route to an internet gateway" in v.line
    assert [v.status for v in limits.check_image_build(spec(), build())] == ["ok", "ok"]


def test_a_route_out_is_an_internet_gateway_with_public_addresses_or_a_nat_gateway():
    main = {"Associations": [{"Main": True}], "Routes": [{"DestinationCidrBlock": "0.0.0.0/0", "GatewayId": "igw-1"}]}
    public = {"SubnetId": "s-1", "MapPublicIpOnLaunch": True}
    private = {"SubnetId": "s-1", "MapPublicIpOnLaunch": False}
    assert limits.routes_out([main], [public])
    assert not limits.routes_out([main], [private])  # an internet gateway without a public address: no way out
    own = {"Associations": [{"SubnetId": "s-1"}], "Routes": [{"DestinationCidrBlock": "172.31.0.0/16",
                                                             "GatewayId": "local"}]}
    assert not limits.routes_out([main, own], [public])  # the subnet's own table wins over the main one
    nat = {"Associations": [{"SubnetId": "s-1"}], "Routes": [{"DestinationCidrBlock": "0.0.0.0/0",
                                                             "NatGatewayId": "nat-1"}]}
    assert limits.routes_out([main, nat], [private])
    blackhole = {**main, "Routes": [{**main["Routes"][0], "State": "blackhole"}]}
    assert not limits.routes_out([blackhole], [public])


def test_the_build_checks_run_only_with_no_image_and_decide_says_them():
    verdicts = preflight.decide(spec(), facts(build=build(routes_out=False)))
    assert lines(verdicts, "image-build", "FAIL") and preflight.failed(verdicts)
    assert not lines(preflight.decide(spec(), facts()), "image-build")


def test_the_build_types_are_the_image_stacks_and_draw_on_the_g_and_vt_quota():
    from ami.stack import ImageSpec

    assert ImageSpec().build_instance_types == limits.IMAGE_BUILD_TYPES
    assert len(limits.IMAGE_BUILD_TYPES) > 1  # one type's InsufficientInstanceCapacity must not fail the build
    assert {limits.build_quota_class(t).on_demand[0] for t in limits.IMAGE_BUILD_TYPES} == {G_OD}


# --- the shell, against moto -------------------------------------------------------------------------------------

def quotas(s: boto3.Session, values: dict[str, float]) -> None:
    """Service Quotas answers each quota code with its own value (moto serves no EC2 or VPC quotas)."""
    def reply(params, **_):
        code = json.loads(params["body"])["QuotaCode"]
        return answer_for(code)

    def answer_for(code):
        from botocore.awsrequest import AWSResponse
        return (AWSResponse("https://aws", 200, {}, None),
                {"Quota": {"ServiceCode": "vpc" if code == ENI else "ec2", "QuotaCode": code, "QuotaName": code,
                           "Value": values[code], "Unit": "None", "Adjustable": True, "GlobalQuota": False}})
    event = "before-call.service-quotas.GetServiceQuota"
    s.__dict__.setdefault("_answers", {})[event] = None  # the fixture's one answer for every code steps aside
    s.events.register(event, reply, unique_id="quotas-by-code")


def test_the_shell_counts_the_interfaces_that_exist_against_the_vpc_quota(sess, capsys, ssm_plugin):  # noqa: F811
    publish_image(sess)
    ec2 = sess.client("ec2")
    subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
    quotas(sess, {"L-417A185B": 1536, "L-1216C47A": 1000, ENI: 40})  # one p5 node: 32 + head 1 + endpoints 5 = 38
    for _ in range(2):
        ec2.create_network_interface(SubnetId=subnet)
    args = ["-c", "instance_type=p5.48xlarge", "-c", "nodes=1", "-c", "az=us-east-1a"]
    assert cli.main(["preflight", *args]) == 0, capsys.readouterr().out
    assert f"ok    interfaces      Network interfaces per Region ({ENI}): 38 needed" in capsys.readouterr().out
    ec2.create_network_interface(SubnetId=subnet)
    assert cli.main(["preflight", *args]) == 1
    out = capsys.readouterr().out
    assert f"FAIL  interfaces      Network interfaces per Region ({ENI}) is 40 in us-east-1 (3 in use)" in out


def test_with_no_image_the_shell_reads_the_build_quota_and_the_default_vpcs_route_out(sess):  # noqa: F811
    quotas(sess, {"L-417A185B": 1536, "L-1216C47A": 1000, ENI: 5000, G_OD: 0})
    ec2 = sess.client("ec2")
    facts_ = preflight_shell.gather(sess, spec(az="us-east-1a"))
    b = facts_.build
    assert (b.instance_types, b.vcpus, b.quota.value, b.routes_out) == (limits.IMAGE_BUILD_TYPES, 4, 0, False)
    assert b.default_vpc.startswith("vpc-")
    # Give it what AWS's default VPC has: an internet gateway and the main table's route to it.
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=b.default_vpc)
    main = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [b.default_vpc]},
                                              {"Name": "association.main", "Values": ["true"]}])["RouteTables"][0]
    ec2.create_route(RouteTableId=main["RouteTableId"], DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    assert preflight_shell.gather(sess, spec(az="us-east-1a")).build.routes_out
    # An image published: nothing to build, nothing read for it.
    publish_image(sess)
    assert preflight_shell.gather(sess, spec(az="us-east-1a")).build is None


def test_the_endpoints_counted_are_the_endpoints_the_stack_makes():
    from infra import network

    assert len(network.INTERFACE_ENDPOINT_SERVICES) == limits.ENDPOINT_INTERFACES
