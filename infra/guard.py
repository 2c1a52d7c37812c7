"""Guard: the stack deletes itself ``ttl_hours`` after it was deployed, even if no one is watching.

Four pieces, all in the stack:

- the guard function (:mod:`infra.guard_function`, inlined, no asset to upload);
- a ``Custom::TtlClock`` resource backed by that function, which computes the expiry *at deploy time*
  (synthesis stays deterministic), once the node groups and the file system exist, and refuses a deploy the
  guard could not undo (a stack without a CloudFormation service role);
- an SSM String parameter (:func:`infra.ttl.parameter_name`) that holds the expiry: the clock's at deploy, a later
  one once the launcher extended it;
- an EventBridge Scheduler schedule that starts at the deploy-time expiry and from then on invokes the function
  every :data:`RETRY_MINUTES` minutes with ``{"action": "expire"}``. The function reads the parameter and, once
  that time has passed, calls DeleteStack; CloudFormation deletes everything with the stack's own service role
  (the CDK bootstrap's execution role), so the function itself may only read the parameter and describe and
  delete this one stack. A one-time ``at(...)`` schedule would fire once: if that DeleteStack failed (the stack
  mid-update, a deletion that failed and needs another try), the cluster would run on. The repeating schedule
  retries until the stack, the schedule with it, is gone; DeleteStack on a stack already being deleted changes
  nothing.

The launcher extends the TTL by writing a later time to the parameter (``ssm:PutParameter``, see
:data:`infra.ttl.EXTEND_PERMISSIONS`); the schedule itself is never updated, so extending needs no
``iam:PassRole`` on the scheduler's role (:mod:`infra.ttl` says why UpdateSchedule would). Changing ``ttl_hours``
and redeploying restarts the clock from that deploy (the parameter's value changes with the clock's); a redeploy
that leaves ``ttl_hours`` alone leaves the clock, the parameter and any extension as they are.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from aws_cdk import Aws, CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_scheduler as scheduler
from aws_cdk import aws_ssm as ssm
from cdk_nag import NagSuppressions
from constructs import Construct, IConstruct

from infra import ttl

FUNCTION_SOURCE = Path(__file__).with_name("guard_function.py")
IDLE_FUNCTION_SOURCE = Path(__file__).with_name("idle_function.py")
INLINE_CODE_LIMIT = 4096  # bytes CloudFormation accepts in a Lambda ZipFile
SCHEDULE_GROUP = "default"  # exists in every account and region; a per-cluster group would be one more resource
EXPIRE_EVENT = {"action": "expire"}
RETRY_MINUTES = 15  # how often the guard reads the expiry, from the deploy on, and calls DeleteStack once it passed


def guard_source(path: Path = FUNCTION_SOURCE) -> str:
    source = path.read_text()
    if len(source.encode()) > INLINE_CODE_LIMIT:
        raise ValueError(f"{path.name} is over the {INLINE_CODE_LIMIT}-byte inline code limit")
    return source


def ttl_parameter_arn(scope: Construct, cluster_name: str) -> str:
    """The expiry parameter's ARN, made from its name in the stack's region and account (not a reference to the
    parameter resource, so a grant on it never waits for the TTL clock): ``arn:PARTITION:ssm:REGION:ACCOUNT:parameter``
    followed by the name without its leading slash
    (https://docs.aws.amazon.com/service-authorization/latest/reference/list_awssystemsmanager.html, "Resource types
    defined by AWS Systems Manager", parameter)."""
    return Stack.of(scope).format_arn(
        service="ssm", resource="parameter", resource_name=ttl.parameter_name(cluster_name).lstrip("/")
    )


class CostGuard(Construct):
    """Deletes the stack at deploy time + ``ttl_hours``, or at the time written to the parameter since (later: the
    launcher extended it; now: a ``--teardown`` job's epilog ended it), within RETRY_MINUTES of that time;
    exposes the expiry, the parameter and the schedule's name and group."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        ttl_hours: float,
        cluster_name: str,
        schedule_name: str,
        starts_after: Sequence[IConstruct],
    ) -> None:
        """``starts_after``: what the TTL counts from (the node groups, the file system), not the deploy's start."""
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(
            self, "Logs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        function_role = iam.Role(
            self,
            "FunctionRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="scaletrain cost guard: read its expiry, describe and delete this one stack, write its logs",
        )
        function_role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudformation:DescribeStacks", "cloudformation:DeleteStack"], resources=[Aws.STACK_ID]
            )
        )
        self.log_group.grant_write(function_role)
        self.parameter_name = ttl.parameter_name(cluster_name)
        # The ARN from the name, not from the parameter resource: the parameter's value comes from the clock, which
        # this function answers, and the function waits for its role's policy; a reference would close the loop.
        parameter_arn = ttl_parameter_arn(self, cluster_name)
        function_role.add_to_policy(iam.PolicyStatement(actions=["ssm:GetParameter"], resources=[parameter_arn]))
        self.function = lambda_.Function(
            self,
            "Function",
            description="scaletrain cost guard: computes the TTL expiry, deletes the stack when it is reached",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="index.handler",
            code=lambda_.Code.from_inline(guard_source()),
            timeout=Duration.seconds(60),
            memory_size=128,
            role=function_role,
            log_group=self.log_group,
            environment={"STACK_ID": Aws.STACK_ID, "TTL_PARAMETER": self.parameter_name},
        )

        self.clock = CustomResource(
            self,
            "Clock",
            service_token=self.function.function_arn,
            resource_type="Custom::TtlClock",
            properties={"TtlHours": f"{ttl_hours:g}"},
        )
        self.clock.node.add_dependency(*starts_after)
        self.expires_at = self.clock.get_att_string("ExpiresAt")

        # Written by CloudFormation when the clock's ExpiresAt changes (a deploy that changes ttl_hours), and by the
        # launcher to extend; CloudFormation leaves a value the launcher wrote alone while ExpiresAt stays the same.
        self.parameter = ssm.StringParameter(
            self,
            "Expiry",
            parameter_name=self.parameter_name,
            string_value=self.expires_at,
            description="scaletrain cost guard: the stack deletes itself from this time (UTC) on; "
            "launch status --extend-ttl writes a later one",
        )

        scheduler_role = iam.Role(
            self,
            "SchedulerRole",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}
            ),
            description="scaletrain cost guard: lets the TTL schedule invoke the guard function",
        )
        scheduler_role.add_to_policy(
            iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=[self.function.function_arn])
        )
        self.schedule_name = schedule_name
        self.schedule_group = SCHEDULE_GROUP
        self.schedule = scheduler.CfnSchedule(
            self,
            "Schedule",
            name=schedule_name,
            group_name=SCHEDULE_GROUP,
            description="scaletrain cost guard: delete the cluster stack from its TTL expiry on",
            # From the deploy on, not from the expiry: Scheduler invokes nothing before a schedule's StartDate ("The
            # date, in UTC, after which the schedule can begin invoking its target", CreateSchedule, EventBridge
            # Scheduler API Reference: https://docs.aws.amazon.com/scheduler/latest/APIReference/API_CreateSchedule.html),
            # so with StartDate = the deploy-time expiry a `launch train --teardown` epilog that moves the parameter to
            # now was read at the original expiry, up to the whole TTL later. Every RETRY_MINUTES the function reads
            # the parameter and deletes the stack once it has passed: a teardown takes effect within RETRY_MINUTES
            # of the job's end. 96 invocations a day of a 128 MB function, well inside Lambda's and Scheduler's free
            # tiers.
            schedule_expression=f"rate({RETRY_MINUTES} minutes)",
            flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
            state="ENABLED",
            target=scheduler.CfnSchedule.TargetProperty(
                arn=self.function.function_arn,
                role_arn=scheduler_role.role_arn,
                input=json.dumps(EXPIRE_EVENT),
                # An invocation that fails to reach the function is retried until the next one is due.
                retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                    maximum_retry_attempts=10, maximum_event_age_in_seconds=RETRY_MINUTES * 60
                ),
            ),
        )
        # The parameter first: the function counts a missing one as expired, and would delete a stack still being made.
        self.schedule.node.add_dependency(self.parameter)


IDLE_CHECK_MINUTES = 5  # how often the idle check runs: one CloudWatch period (infra.ttl.IDLE_PERIOD_S)


class IdleStop(Construct):
    """With ``-c idle_minutes``: deletes the stack once no node of ``groups`` has been busy for ``idle_minutes``.

    A second small function beside the TTL guard's (each stays within the inline code limit, and this one alone may
    read CloudWatch), run by its own schedule every :data:`IDLE_CHECK_MINUTES` minutes from the deploy on. It reads
    each group's CPUUtilization (infra.ttl says why CPU and not GPU) and deletes the stack the way the TTL guard
    does, with the stack's service role (the TTL clock already refuses a stack without one).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        idle_minutes: int,
        groups: Sequence[tuple[str, float]],
        log_group: logs.ILogGroup,
        starts_after: Sequence[IConstruct],
    ) -> None:
        """``groups``: (Auto Scaling group name, the CPU percent at which a node of it counts as busy)."""
        super().__init__(scope, construct_id)
        role = iam.Role(
            self,
            "FunctionRole",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="scaletrain idle stop: read the nodes' CPU from CloudWatch, delete this one stack",
        )
        role.add_to_policy(iam.PolicyStatement(actions=["cloudformation:DeleteStack"], resources=[Aws.STACK_ID]))
        # GetMetricStatistics has no resource types and no condition keys, so it can only be granted on "*"
        # (https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazoncloudwatch.html, "Actions
        # defined by Amazon CloudWatch"); it reads metrics, never writes them.
        role.add_to_policy(iam.PolicyStatement(actions=["cloudwatch:GetMetricStatistics"], resources=["*"]))
        log_group.grant_write(role)
        stack = Stack.of(self)
        self.function = lambda_.Function(
            self,
            "Function",
            description="scaletrain idle stop: deletes the stack once its nodes have been idle for idle_minutes",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="index.handler",
            code=lambda_.Code.from_inline(guard_source(IDLE_FUNCTION_SOURCE)),
            timeout=Duration.seconds(60),
            memory_size=128,
            role=role,
            log_group=log_group,
            environment={
                "STACK_ID": Aws.STACK_ID,
                "IDLE_MINUTES": str(idle_minutes),
                "GROUPS": stack.to_json_string([[name, percent] for name, percent in groups]),
            },
        )
        NagSuppressions.add_resource_suppressions(
            role,
            [
                {
                    "id": "AwsSolutions-IAM5",
                    "reason": "cloudwatch:GetMetricStatistics supports no resource-level permission (Service "
                    "Authorization Reference); it is read-only",
                    "appliesTo": ["Resource::*"],
                }
            ],
            apply_to_children=True,
        )
        scheduler_role = iam.Role(
            self,
            "SchedulerRole",
            assumed_by=iam.ServicePrincipal(
                "scheduler.amazonaws.com", conditions={"StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}}
            ),
            description="scaletrain idle stop: lets the idle schedule invoke the idle function",
        )
        scheduler_role.add_to_policy(
            iam.PolicyStatement(actions=["lambda:InvokeFunction"], resources=[self.function.function_arn])
        )
        self.schedule = scheduler.CfnSchedule(
            self,
            "Schedule",
            group_name=SCHEDULE_GROUP,
            description="scaletrain idle stop: delete the cluster stack once its nodes have been idle",
            schedule_expression=f"rate({IDLE_CHECK_MINUTES} minutes)",
            flexible_time_window=scheduler.CfnSchedule.FlexibleTimeWindowProperty(mode="OFF"),
            state="ENABLED",
            target=scheduler.CfnSchedule.TargetProperty(
                arn=self.function.function_arn,
                role_arn=scheduler_role.role_arn,
                input=json.dumps({"action": "idle"}),
                retry_policy=scheduler.CfnSchedule.RetryPolicyProperty(
                    maximum_retry_attempts=2, maximum_event_age_in_seconds=IDLE_CHECK_MINUTES * 60
                ),
            ),
        )
        self.schedule.node.add_dependency(*starts_after)
