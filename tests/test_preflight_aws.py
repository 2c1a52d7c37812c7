"""`launch preflight` against AWS as moto serves it: instance type offerings (moto's per-AZ data), the SSM image
parameter, images, CloudWatch usage metrics. What moto does not implement (Service Quotas for EC2, capacity
reservations, Capacity Block offerings) is answered by canned responses that botocore first checks against its
model of the real API, so a field the real API does not return cannot slip into a test."""

from __future__ import annotations

import datetime as dt

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.validate import ParamValidator
from test_aws_moto import env  # noqa: F401 -- the moto fixture

from ami.paths import IMAGE_ID_PARAMETER
from infra.spec import ClusterSpec
from launcher import cli
from launcher.cluster.aws import api as aws
from launcher.execute import preflight as preflight_shell

# A machine set up for the AWS path has the Session Manager plugin (README); its absence is tested in test_preflight.
pytestmark = pytest.mark.usefixtures("ssm_plugin")

NOW = dt.datetime.now(dt.timezone.utc)
CR = "cr-0123456789abcdef0"
UBUNTU = "ami-785db401"  # one of moto's default images: Ubuntu, x86_64, root /dev/sda1
P_QUOTA = {"ServiceCode": "ec2", "QuotaCode": "L-417A185B", "QuotaName": "Running On-Demand P instances",
           "Value": 1536.0, "Unit": "None", "Adjustable": True, "GlobalQuota": False,
           "UsageMetric": {"MetricNamespace": "AWS/Usage", "MetricName": "ResourceCount",
                           "MetricDimensions": {"Class": "P/OnDemand", "Resource": "vCPU", "Service": "EC2",
                                                "Type": "Resource"},
                           "MetricStatisticRecommendation": "Maximum"}}


def answer(sess: boto3.Session, service: str, operation: str, response: dict | None = None, *,
           error: tuple[str, str] | None = None) -> None:
    """Every client of ``sess`` answers ``operation`` with ``response`` (valid for the real API's output shape) or
    fails with ``error`` (code, message), as AWS would; a later answer replaces an earlier one."""
    model = sess.client(service).meta.service_model
    if error is None:
        report = ParamValidator().validate(response, model.operation_model(operation).output_shape)
        assert not report.has_errors(), report.generate_report()
        reply = (AWSResponse("https://aws", 200, {}, None), response)
    else:
        reply = (AWSResponse("https://aws", 400, {}, None), {"Error": {"Code": error[0], "Message": error[1]}})
    replies = sess.__dict__.setdefault("_answers", {})
    event = f"before-call.{model.service_id.hyphenize()}.{operation}"
    if event not in replies:
        sess.events.register(event, lambda **_: replies[event])
    replies[event] = reply


def quota(value: float, code: str = "L-417A185B", name: str = "Running On-Demand P instances") -> dict:
    return {"Quota": {**P_QUOTA, "QuotaCode": code, "QuotaName": name, "Value": value}}


def reservation(**kw) -> dict:
    return {"CapacityReservations": [{
        "CapacityReservationId": CR, "InstanceType": "p5.48xlarge", "AvailabilityZone": "us-east-1b",
        "Tenancy": "default", "InstancePlatform": "Linux/UNIX", "State": "active", "TotalInstanceCount": 8,
        "AvailableInstanceCount": 8, "ReservationType": "capacity-block", "InstanceMatchCriteria": "targeted",
        "StartDate": NOW - dt.timedelta(hours=1), "EndDate": NOW + dt.timedelta(days=3), **kw}]}


@pytest.fixture
def sess(env, monkeypatch):  # noqa: F811
    """The session `launch preflight` gets, with Service Quotas answering for EC2 (moto serves only VPC's) and no
    Capacity Block on offer (moto has no such API)."""
    s = boto3.Session(region_name="us-east-1")
    answer(s, "service-quotas", "GetServiceQuota", quota(1536))
    answer(s, "ec2", "DescribeCapacityBlockOfferings", {"CapacityBlockOfferings": []})
    monkeypatch.setattr(aws, "session", lambda region=None, profile=None: s)
    return s


def publish_image(s: boto3.Session) -> str:
    """What the ami/ pipeline leaves behind: an available x86_64 image, its id in the SSM parameter."""
    image = s.client("ec2").describe_images(ImageIds=[UBUNTU])["Images"][0]
    assert image["Architecture"] == "x86_64" and image["RootDeviceName"] == "/dev/sda1"
    s.client("ssm").put_parameter(Name=IMAGE_ID_PARAMETER, Value=UBUNTU, Type="String", DataType="aws:ec2:image")
    return UBUNTU


def spec(**context) -> ClusterSpec:
    return ClusterSpec.from_context({"cluster_name": "c1", "instance_type": "p4d.24xlarge", "nodes": 8, **context})


# --- the shell's reads -------------------------------------------------------------------------------------------

def test_offerings_are_read_per_az_for_every_type_the_stack_launches(sess):
    zones, offered = preflight_shell.read_offerings(sess.client("ec2"), ["p5en.48xlarge", "c5n.18xlarge"])
    assert zones == ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f")
    assert offered["p5en.48xlarge"] == {"us-east-1a", "us-east-1c"}  # moto's copy of EC2's offerings
    assert "us-east-1e" not in offered["c5n.18xlarge"]


def test_the_image_is_read_from_the_ssm_parameter_the_pipeline_publishes(sess):
    ec2, ssm = sess.client("ec2"), sess.client("ssm")
    missing = preflight_shell.read_image(ec2, ssm, None, IMAGE_ID_PARAMETER)
    assert missing.ami is None and missing.parameter == IMAGE_ID_PARAMETER
    ami = publish_image(sess)
    found = preflight_shell.read_image(ec2, ssm, None, IMAGE_ID_PARAMETER)
    assert found.ami == ami and found.image["State"] == "available"
    gone = preflight_shell.read_image(ec2, ssm, "ami-0123456789abcdef0", None)
    assert gone.ami == "ami-0123456789abcdef0" and gone.image is None and gone.parameter is None


def test_quota_usage_comes_from_the_quotas_own_cloudwatch_metric(sess):
    sq, cw = sess.client("service-quotas"), sess.client("cloudwatch")
    q = preflight_shell.read_quota(sq, cw, "L-417A185B", NOW)
    assert q.value == 1536 and q.usage is None  # nothing running: no datapoint, and nothing is made up
    dims = [{"Name": k, "Value": v} for k, v in P_QUOTA["UsageMetric"]["MetricDimensions"].items()]
    cw.put_metric_data(Namespace="AWS/Usage", MetricData=[
        {"MetricName": "ResourceCount", "Dimensions": dims, "Value": 192, "Timestamp": NOW - dt.timedelta(minutes=9)}])
    assert preflight_shell.read_quota(sq, cw, "L-417A185B", NOW).usage == 192


def test_a_quota_without_an_applied_value_falls_back_to_the_aws_default(env):  # noqa: F811
    s = boto3.Session(region_name="us-east-1")
    answer(s, "service-quotas", "GetServiceQuota", error=("NoSuchResourceException", "not applied"))
    answer(s, "service-quotas", "GetAWSDefaultServiceQuota", quota(0))
    assert preflight_shell.read_quota(s.client("service-quotas"), s.client("cloudwatch"), "L-417A185B", NOW).value == 0


def test_a_reservation_the_account_cannot_see_reads_as_none(env):  # noqa: F811
    s = boto3.Session(region_name="us-east-1")
    answer(s, "ec2", "DescribeCapacityReservations",
           error=("InvalidCapacityReservationId.NotFound", f"The capacity reservation ID '{CR}' does not exist"))
    assert preflight_shell.read_reservation(s.client("ec2"), CR) is None


def test_a_refused_call_costs_one_check_not_the_preflight(sess):
    answer(sess, "service-quotas", "GetServiceQuota", error=("AccessDeniedException", "not authorized"))
    facts = preflight_shell.gather(sess, spec(az="us-east-1a"), now=NOW)
    assert facts.quotas["L-417A185B"] == "AccessDeniedException: not authorized"
    assert facts.offered["p4d.24xlarge"]  # the other reads went on


# --- the command ---------------------------------------------------------------------------------------------

def run(capsys, *args: str) -> tuple[int, list[str], str]:
    code = cli.main(["preflight", *args])
    out = capsys.readouterr()
    return code, out.out.splitlines(), out.err


def test_preflight_fails_with_one_line_per_problem_and_each_names_its_fix(sess, capsys):
    answer(sess, "service-quotas", "GetServiceQuota", quota(192))
    code, out, _ = run(capsys, "-c", "instance_type=p5en.48xlarge", "-c", "nodes=2")
    assert code == 1
    fails = [line for line in out if line.startswith("FAIL")]
    assert len(fails) == 5, out
    assert any("p5en.48xlarge (workers) is offered only in us-east-1a, us-east-1c" in f and "pass -c az=us-east-1a"
               in f for f in fails)
    # The head node's m5.large too: EC2's offerings (as moto serves them) leave out us-east-1e.
    assert any("m5.large (head) is offered only in us-east-1a, us-east-1b, us-east-1c, us-east-1d, us-east-1f" in f
               for f in fails)
    assert any("(L-417A185B) is 192 vCPUs" in f and f.endswith("--desired-value 384`") for f in fails)
    assert any("no training image in us-east-1" in f and 'ami/app.py" -c region=us-east-1' in f for f in fails)
    # With no image, what its build needs: moto's default VPC, unlike AWS's, has no route to an internet gateway.
    assert any(f.startswith("FAIL  image-build") and "has no route to an internet gateway" in f for f in fails)
    assert "info  capacity-block  no Capacity Block offered for 2 x p5en.48xlarge for 24 h in us-east-1 now" in out
    assert out[-1].startswith("preflight: 5 of ") and "fix them before `npx cdk deploy`" in out[-1]


def test_preflight_passes_when_the_account_is_ready_and_prints_the_deploy_command(sess, capsys):
    publish_image(sess)
    code, out, err = run(capsys, "-c", "instance_type=p5en.48xlarge", "-c", "nodes=2", "-c", "az=us-east-1a")
    assert code == 0, out + [err]
    assert [line.split()[:2] for line in out[:-1]] == [["ok", "offering"], ["ok", "offering"], ["ok", "quota"],
                                                       ["ok", "quota"], ["ok", "interfaces"],
                                                       ["info", "capacity-block"], ["ok", "image"],
                                                       ["ok", "ssm-plugin"]], out
    assert any(line.startswith("ok    quota           Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) "
                               "instances (L-1216C47A): 2 vCPUs needed (head: 1 x m5.large x 2)") for line in out), out
    assert out[-1].endswith("deploy with `npx cdk deploy -c instance_type=p5en.48xlarge -c nodes=2 -c "
                            "az=us-east-1a`")


def test_preflight_checks_a_capacity_block_against_the_stack(sess, capsys):
    publish_image(sess)
    answer(sess, "ec2", "DescribeCapacityReservations", reservation())
    args = ["-c", "instance_type=p5.48xlarge", "-c", f"capacity_reservation_id={CR}", "-c", "az=us-east-1b"]
    code, out, _ = run(capsys, *args)
    assert code == 1
    assert any(line.startswith("FAIL  reservation") and "is a Capacity Block" in line
               and line.endswith("pass -c capacity_block=true") for line in out), out
    code, out, _ = run(capsys, *args, "-c", "capacity_block=true")
    assert code == 0, out
    assert any(line.startswith("ok    reservation") and "Capacity Block" in line for line in out)


def test_preflight_help_and_bad_input_are_one_line(sess, capsys):
    with pytest.raises(SystemExit) as done:
        cli.app(["preflight", "--help"], prog_name="launch")
    assert done.value.code == 0 and "KEY=VALUE" in capsys.readouterr().out
    for args, fragment in [(["-c", "node=8"], "unknown context key 'node'"),
                           (["-c", "nodes"], "expected KEY=VALUE"),
                           (["-c", "nodes=x"], "nodes='x'"),
                           (["-c", "region=us-west-2", "--region", "us-east-2"], "disagree")]:
        code, out, err = run(capsys, *args)
        lines = err.strip().splitlines()
        assert code != 0 and len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], (args, err)


def test_region_comes_from_the_stacks_context_not_the_shell(sess, capsys, monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")  # the stack still deploys to cdk.json's us-east-1
    publish_image(sess)
    regions = []
    monkeypatch.setattr(aws, "session", lambda region=None, profile=None: regions.append(region) or sess)
    run(capsys, "-c", "az=us-east-1a")
    run(capsys, "--region", "us-west-2")
    assert regions == ["us-east-1", "us-west-2"]
