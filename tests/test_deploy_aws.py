"""`launch up` against moto: the CDK CLI replaced by a fake that does what `cdk deploy` does to the account (creates
the stack, node groups that launch instances, prints CloudFormation's failure), everything else real boto3. The
sequence a user would see: a deploy that finds no capacity, its stack deleted, the next AZ deployed."""

from __future__ import annotations

import datetime as dt
import json

import boto3
import pytest
from botocore.awsrequest import AWSResponse
from botocore.validate import ParamValidator
from test_aws_moto import env  # noqa: F401 -- the moto fixture
from test_capacity import ASG_MESSAGE, CDK_OUTPUT
from test_preflight_aws import answer, publish_image, quota, sess  # noqa: F401 -- sess: moto, quotas answered

from launcher import cli
from launcher.cluster.aws import api as aws
from launcher.cluster.aws import deploy
from launcher.errors import LaunchError
from launcher.plans import capacity

# A machine set up for the AWS path has the Session Manager plugin (README): `launch up`'s preflight looks for it.
pytestmark = pytest.mark.usefixtures("ssm_plugin")

STACK = "scaletrain"


def _pairs(argv: list[str]) -> dict[str, str]:
    return dict(argv[k + 1].split("=", 1) for k, a in enumerate(argv) if a == "-c")


def _template(nodes: int, instance_type: str) -> str:
    ec2 = boto3.client("ec2")
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.0.0/18")["Subnet"]["SubnetId"]
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    return json.dumps({"Resources": {
        "WorkerTemplate": {"Type": "AWS::EC2::LaunchTemplate",
                           "Properties": {"LaunchTemplateData": {"ImageId": image, "InstanceType": instance_type}}},
        "WorkerGroup": {"Type": "AWS::AutoScaling::AutoScalingGroup", "Properties": {
            "MinSize": str(nodes), "MaxSize": str(nodes), "DesiredCapacity": str(nodes), "VPCZoneIdentifier": [subnet],
            "LaunchTemplate": {"LaunchTemplateId": {"Ref": "WorkerTemplate"},
                               "Version": {"Fn::GetAtt": ["WorkerTemplate", "LatestVersionNumber"]}},
            "Tags": [{"Key": "scaletrain:cluster", "Value": STACK, "PropagateAtLaunch": True},
                     {"Key": "scaletrain:role", "Value": "worker", "PropagateAtLaunch": True}]}}},
        "Outputs": {"ClusterName": {"Value": STACK}}})


class FakeCdk:
    """`npx cdk deploy`, as far as the account sees it. ``no_room``: AZs where CloudFormation gives up on the group
    (the stack is left failed, CDK prints the reason, exit 1)."""

    def __init__(self, no_room: set[str] = frozenset(), output: str = CDK_OUTPUT) -> None:
        self.no_room, self.output, self.calls, self.seen_before = no_room, output, [], []

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        cfn = boto3.client("cloudformation")
        # What each deploy found in the account when it started: no stack left over from the attempt before.
        self.seen_before.append(deploy.stack_status(cfn, STACK))
        self.calls.append(argv)
        ctx = _pairs(argv)
        cfn.create_stack(StackName=STACK, TemplateBody=_template(int(ctx.get("nodes", 2)), "p4d.24xlarge"))
        if ctx["az"] in self.no_room:
            return 1, self.output
        return 0, "✅  scaletrain\n"


def _live_instances() -> list[str]:
    return [i for i, _ in aws.leftover_instances(boto3.Session(), STACK)]


def _up(fake: FakeCdk, plan_azs: list[str], **context: str) -> tuple[capacity.Outcome, list[str]]:
    from infra.spec import ClusterSpec

    spec = ClusterSpec.from_context({"cluster_name": STACK, "instance_type": "p4d.24xlarge", "nodes": "2",
                                     **context})
    plan = capacity.attempts(spec, ["nodes=2"], zones=plan_azs, offered={"p4d.24xlarge": frozenset(plan_azs)})
    said: list[str] = []
    outcome = deploy.deploy_all(boto3.Session(), spec, plan, cdk=fake, say=said.append, delay_s=0,
                                teardown_delay_s=0, wait_s=5)
    return outcome, said


def test_no_capacity_in_the_first_az_deletes_that_stack_and_deploys_in_the_next(sess):  # noqa: F811
    fake = FakeCdk(no_room={"us-east-1a"})
    outcome, said = _up(fake, ["us-east-1a", "us-east-1c"])
    assert [_pairs(argv)["az"] for argv in fake.calls] == ["us-east-1a", "us-east-1c"]
    # The second deploy found the account clean: the failed stack was deleted (and checked) in between.
    assert fake.seen_before == [None, None]
    assert (outcome.result, outcome.attempt.az) == ("ok", "us-east-1c")
    assert deploy.stack_status(boto3.client("cloudformation"), STACK) == "CREATE_COMPLETE"
    assert len(_live_instances()) == 2
    text = "\n".join(said)
    assert "attempt 1 of 2: us-east-1a (offers p4d.24xlarge): npx cdk deploy scaletrain --require-approval never " \
           "-c nodes=2 -c az=us-east-1a" in text
    assert "no capacity in us-east-1a: " in text and "InsufficientInstanceCapacity" in text
    assert "stack 'scaletrain' is deleted; no instance tagged scaletrain:cluster=scaletrain remains" in text
    assert said[-1].startswith("launch up: stack 'scaletrain' is up in us-east-1c: 2 node(s) in service")


def test_a_stack_that_deployed_but_whose_group_cannot_launch_moves_too(sess):  # noqa: F811
    """CloudFormation may call the stack complete while Auto Scaling retries launches EC2 refuses; the group's failed
    scaling activities say why (moto keeps no activities and always launches: the first AZ's answers are AWS's)."""
    fake = FakeCdk()
    events = sess.events

    failed = {"Activities": [{"ActivityId": "a1", "AutoScalingGroupName": "scaletrain-WorkerGroup",
                              "Cause": "At 2030-01-01T00:00:00Z an instance was started in response to a difference "
                                       "between desired and actual capacity, increasing the capacity from 0 to 2.",
                              "StartTime": dt.datetime.now(dt.timezone.utc), "StatusCode": "Failed", "Progress": 100,
                              "StatusMessage": ASG_MESSAGE}]}
    model = sess.client("autoscaling").meta.service_model.operation_model("DescribeScalingActivities")
    assert not ParamValidator().validate(failed, model.output_shape).has_errors()  # the real API's shape

    def activities(**_):
        if _pairs(fake.calls[-1])["az"] != "us-east-1a":
            return None
        failed["Activities"][0]["StartTime"] = dt.datetime.now(dt.timezone.utc)  # during this attempt
        return AWSResponse("https://aws", 200, {}, None), failed

    def none_in_service(parsed, **_):
        if _pairs(fake.calls[-1])["az"] == "us-east-1a":
            for group in parsed.get("AutoScalingGroups", []):
                group["Instances"] = []

    events.register("before-call.auto-scaling.DescribeScalingActivities", activities)
    events.register("after-call.auto-scaling.DescribeAutoScalingGroups", none_in_service)
    from infra.spec import ClusterSpec

    spec = ClusterSpec.from_context({"cluster_name": STACK, "instance_type": "p4d.24xlarge", "nodes": "2"})
    plan = capacity.attempts(spec, [], zones=["us-east-1a", "us-east-1b"],
                             offered={"p4d.24xlarge": frozenset({"us-east-1a", "us-east-1b"})})
    said: list[str] = []
    outcome = deploy.deploy_all(sess, spec, plan, cdk=fake, say=said.append, delay_s=0, teardown_delay_s=0)
    assert [_pairs(a)["az"] for a in fake.calls] == ["us-east-1a", "us-east-1b"] and fake.seen_before == [None, None]
    assert outcome.attempt.az == "us-east-1b"
    assert any(line.startswith("launch up: no capacity in us-east-1a: Could not launch On-Demand Instances. "
                               "InsufficientInstanceCapacity") for line in said)


def test_no_capacity_anywhere_is_one_line_naming_every_az_and_leaves_nothing(sess):  # noqa: F811
    azs = ["us-east-1a", "us-east-1b", "us-east-1c"]
    fake = FakeCdk(no_room=set(azs))
    with pytest.raises(LaunchError) as caught:
        _up(fake, azs)
    line = str(caught.value)
    assert line.startswith("no capacity for 2 x p4d.24xlarge in us-east-1a, us-east-1b, us-east-1c (3 attempt(s)")
    assert "\n" not in line
    assert deploy.stack_status(boto3.client("cloudformation"), STACK) is None and _live_instances() == []


def test_another_failure_stops_at_once_and_leaves_the_stack_to_inspect(sess):  # noqa: F811
    fake = FakeCdk(no_room={"us-east-1a"}, output="WorkerGroup CREATE_FAILED You have requested more vCPU capacity "
                                                 "than your current vCPU limit of 96 allows (VcpuLimitExceeded)\n")
    with pytest.raises(LaunchError) as caught:
        _up(fake, ["us-east-1a", "us-east-1b"])
    assert len(fake.calls) == 1
    assert str(caught.value).startswith("deploy in us-east-1a failed, not for capacity: cdk deploy exited 1: "
                                        "WorkerGroup CREATE_FAILED You have requested more vCPU")
    assert deploy.stack_status(boto3.client("cloudformation"), STACK) == "CREATE_COMPLETE"


def test_an_existing_stack_is_refused_before_anything_is_deployed(sess):  # noqa: F811
    boto3.client("cloudformation").create_stack(StackName=STACK, TemplateBody=_template(1, "p4d.24xlarge"))
    fake = FakeCdk()
    with pytest.raises(LaunchError, match="stack 'scaletrain' already exists \\(CREATE_COMPLETE\\)"):
        _up(fake, ["us-east-1a"])
    assert fake.calls == []


def test_failure_texts_reads_the_stacks_failed_events_and_activities(sess):  # noqa: F811
    """Against moto the stack deployed cleanly: no failed event, no failed activity, nothing to report."""
    since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(minutes=1)
    boto3.client("cloudformation").create_stack(StackName=STACK, TemplateBody=_template(1, "p4d.24xlarge"))
    assert deploy.failure_texts(sess, STACK, since) == []
    assert deploy.failure_texts(sess, "no-such-stack", since) == []
    (group,) = deploy.group_states(sess, STACK, since)
    assert (group.desired, group.in_service, group.failures) == (1, 1, ())


# --- Through the CLI: preflight, then the attempts --------------------------------------------------------------------


def test_launch_up_runs_the_preflight_then_moves_to_the_next_az(sess, monkeypatch, capsys):  # noqa: F811
    publish_image(sess)
    fake = FakeCdk(no_room={"us-east-1a"})
    monkeypatch.setattr(deploy, "run_cdk", lambda argv, cwd=None: fake(argv))
    code = cli.main(["up", "-c", "instance_type=p4d.24xlarge", "-c", "nodes=2", "--capacity-wait", "5"])
    out = capsys.readouterr().out
    assert code == 0, out
    # moto offers p4d.24xlarge in us-east-1a..d: the first two are tried.
    assert [_pairs(a)["az"] for a in fake.calls] == ["us-east-1a", "us-east-1b"]
    assert fake.calls[0][:6] == ["npx", "cdk", "deploy", STACK, "--require-approval", "never"]
    assert "ok    offering        p4d.24xlarge (workers) is offered in us-east-1a" in out
    assert "attempt 1 of 4: us-east-1a" in out and "next: launch discover --cluster scaletrain" in out


def test_launch_up_stops_on_a_failing_preflight_before_deploying(sess, monkeypatch, capsys):  # noqa: F811
    fake = FakeCdk()
    monkeypatch.setattr(deploy, "run_cdk", lambda argv, cwd=None: fake(argv))
    answer(sess, "service-quotas", "GetServiceQuota", quota(96))
    code = cli.main(["up", "-c", "instance_type=p4d.24xlarge", "-c", "nodes=2"])
    captured = capsys.readouterr()
    assert code == 1 and fake.calls == []
    assert "FAIL  quota" in captured.out and "FAIL  image" in captured.out
    # No image yet, so its build is checked too: moto's default VPC, unlike AWS's, has no route out.
    assert "FAIL  image-build" in captured.out
    assert captured.err.strip() == "error: preflight: 3 check(s) fail (FAIL above); nothing was deployed"


def test_launch_up_bad_flags_are_one_line(sess, capsys):  # noqa: F811
    assert cli.main(["up", "--capacity-block"]) == 2  # usage errors exit 2, as click's own (issue 26)
    assert capsys.readouterr().err.strip() == ("error: --capacity-block describes --fallback-reservation; pass both "
                                               "(see `launch up --help`)")
    assert cli.main(["up", "-c", "idle_minutes=5"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: idle_minutes='5': allowed: 15 to 1440 minutes")


def test_run_cdk_shows_and_keeps_what_the_cli_printed(capsys):
    import sys

    rc, printed = deploy.run_cdk([sys.executable, "-c", "print('CREATE_FAILED WorkerGroup'); raise SystemExit(3)"])
    assert (rc, printed) == (3, "CREATE_FAILED WorkerGroup\n")
    assert capsys.readouterr().out == "CREATE_FAILED WorkerGroup\n"
