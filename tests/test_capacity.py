"""`launch up`'s decisions, pure: which AZs to try and in which order, what a failure means, when to stop."""

from __future__ import annotations

import pytest

from infra.spec import ClusterSpec
from launcher.plans import capacity
from launcher.plans.capacity import Attempt, GroupState, Outcome

CR = "cr-0123456789abcdef0"
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1e", "us-east-1f")
OFFERED = {"p4d.24xlarge": frozenset({"us-east-1d", "us-east-1a", "us-east-1c"}),
           "c5n.18xlarge": frozenset({"us-east-1a", "us-east-1b", "us-east-1d"})}
# As Auto Scaling words it in a failed scaling activity, and as CloudFormation then words the group's CREATE_FAILED.
ASG_MESSAGE = ("Could not launch On-Demand Instances. InsufficientInstanceCapacity - We currently do not have "
               "sufficient p4d.24xlarge capacity in the Availability Zone you requested (us-east-1a). Our system will "
               "be working on provisioning additional capacity. You can currently get p4d.24xlarge capacity by not "
               "specifying an Availability Zone in your request or choosing us-east-1c, us-east-1d. Launching EC2 "
               "instance failed.")
CDK_OUTPUT = ("scaletrain | 3/40 | 10:01:02 AM | CREATE_FAILED | AWS::AutoScaling::AutoScalingGroup | WorkerGroup "
              "Resource handler returned message: \"Group did not stabilize. {current/minSize/maxSize} group size = "
              "{0/2/2}. Failed Scaling Activity: " + ASG_MESSAGE + "\"\n"
              " ❌  scaletrain failed: Error: The stack named scaletrain failed creation\n")


def spec(**context: str) -> ClusterSpec:
    return ClusterSpec.from_context({"cluster_name": "scaletrain", "instance_type": "p4d.24xlarge", "nodes": "2",
                                     **context})


@pytest.mark.parametrize("text", [
    ASG_MESSAGE, CDK_OUTPUT,
    "An error occurred (InsufficientInstanceCapacity) when calling the RunInstances operation",
    "Spot request status: capacity-not-available",
    "There is no Spot capacity available that matches your request.",
])
def test_capacity_errors_are_recognised_as_ec2_and_auto_scaling_word_them(text: str) -> None:
    assert capacity.is_capacity_error(text)


@pytest.mark.parametrize("text", [
    "You have requested more vCPU capacity than your current vCPU limit of 192 allows (VcpuLimitExceeded)",
    "The image id '[ami-0123]' does not exist",
    "Resource creation cancelled",
])
def test_other_failures_are_not_capacity(text: str) -> None:
    assert not capacity.is_capacity_error(text)


def test_without_az_every_offering_az_is_tried_in_name_order_with_the_users_pairs() -> None:
    plan = capacity.attempts(spec(), ["nodes=2", "storage=none"], zones=ZONES, offered=OFFERED)
    assert [a.az for a in plan] == ["us-east-1a", "us-east-1c", "us-east-1d"]
    assert plan[1].context == ("nodes=2", "storage=none", "az=us-east-1c")
    assert plan[0].why == "us-east-1a (offers p4d.24xlarge)"


def test_reducers_narrow_the_azs_to_those_offering_both_types() -> None:
    plan = capacity.attempts(spec(reducers="1"), [], zones=ZONES, offered=OFFERED)
    assert [a.az for a in plan] == ["us-east-1a", "us-east-1d"]


def test_az_or_a_reservation_pins_one_attempt() -> None:
    (only,) = capacity.attempts(spec(az="us-east-1c"), ["az=us-east-1c", "nodes=2"], zones=ZONES, offered=OFFERED)
    assert only.context == ("nodes=2", "az=us-east-1c") and "-c az" in only.why
    (reserved,) = capacity.attempts(spec(az="us-east-1d", capacity_reservation_id=CR), [], zones=ZONES, offered=OFFERED)
    assert reserved.az == "us-east-1d" and "reservation" in reserved.why


def test_a_fallback_reservation_is_the_last_attempt_in_its_own_az() -> None:
    plan = capacity.attempts(spec(instance_type="p5.48xlarge"), ["instance_type=p5.48xlarge"], zones=ZONES,
                             offered={"p5.48xlarge": frozenset({"us-east-1a"})}, reservation=(CR, "us-east-1e"),
                             capacity_block=True)
    assert [a.az for a in plan] == ["us-east-1a", "us-east-1e"]
    assert plan[-1].context == ("instance_type=p5.48xlarge", f"capacity_reservation_id={CR}", "az=us-east-1e",
                                "capacity_block=true")
    assert plan[-1].why == f"us-east-1e (into Capacity Block {CR})"


@pytest.mark.parametrize(("context", "kw", "message"), [
    ({"instance_type": "p5.48xlarge"}, {}, "no AZ of us-east-1 offers p5.48xlarge: choose other instance types"),
    ({"spot": "true"}, {"reservation": (CR, "us-east-1a")}, "--fallback-reservation: not with -c spot=true"),
])
def test_no_attempt_is_one_line(context, kw, message) -> None:
    with pytest.raises(ValueError, match=message):
        capacity.attempts(spec(**context), [], zones=ZONES, offered=OFFERED, **kw)


def test_classify_reads_the_capacity_line_from_cdks_output_or_the_events() -> None:
    result, reason = capacity.classify(1, [CDK_OUTPUT], [])
    assert result == "capacity" and "InsufficientInstanceCapacity" in reason and "\n" not in reason
    assert capacity.classify(1, ["boom", "WorkerGroup: " + ASG_MESSAGE], ["WorkerGroup: " + ASG_MESSAGE])[0] == \
        "capacity"
    result, reason = capacity.classify(1, ["...", "WorkerGroup: VcpuLimitExceeded"], ["WorkerGroup: VcpuLimitExceeded"])
    assert (result, reason) == ("failed", "WorkerGroup: VcpuLimitExceeded")
    assert capacity.classify(2, ["npx: command not found\n"], []) == ("failed", "cdk deploy exited 2: npx: command "
                                                                               "not found")


def test_group_verdict_after_a_deploy_cloudformation_called_complete() -> None:
    assert capacity.group_verdict([GroupState("w", 2, 2), GroupState("r", 1, 1)])[0] == "ready"
    assert capacity.group_verdict([GroupState("w", 2, 1)]) == ("waiting", "w: 1 of 2 in service")
    assert capacity.group_verdict([GroupState("w", 2, 1, (ASG_MESSAGE,))])[0] == "capacity"
    assert capacity.group_verdict([GroupState("w", 2, 0, ("VcpuLimitExceeded",))]) == ("failed", "VcpuLimitExceeded")
    assert capacity.group_verdict([])[0] == "waiting"


def test_exhausted_names_every_az_tried_in_one_line() -> None:
    tried = [Outcome(Attempt(az, (), az), "capacity", ASG_MESSAGE) for az in ("us-east-1a", "us-east-1c")]
    line = capacity.exhausted(spec(), tried)
    assert line.startswith("no capacity for 2 x p4d.24xlarge in us-east-1a, us-east-1c (2 attempt(s)")
    assert "--fallback-reservation" in line and "\n" not in line
    assert "leave -c az out" in capacity.exhausted(spec(az="us-east-1a"), tried[:1])


def test_an_existing_stack_is_never_launch_ups_to_delete() -> None:
    assert capacity.stack_in_the_way("s", None) is None
    assert capacity.stack_in_the_way("s", "ROLLBACK_COMPLETE") is None
    line = capacity.stack_in_the_way("s", "CREATE_COMPLETE")
    assert line and line.startswith("stack 's' already exists (CREATE_COMPLETE)")


def test_cdk_deploy_needs_no_one_to_approve_and_carries_every_pair() -> None:
    assert capacity.cdk_deploy_argv("c1", ["nodes=2", "az=us-east-1a"], "prof") == [
        "npx", "cdk", "deploy", "c1", "--require-approval", "never", "-c", "nodes=2", "-c", "az=us-east-1a",
        "--profile", "prof"]
