"""Every Lambda function of a stack logs to a log group of the stack's own: with a retention, deleted with the stack.

A function with no log group configured writes to ``/aws/lambda/<function name>``, which Lambda creates on its first
invocation with no retention ("Never expire") and which is not a resource of the stack, so it outlives `launch down`
and is billed as long as it holds data (CloudWatch Logs pricing, https://aws.amazon.com/cloudwatch/pricing/). The
stacks' own functions (the TTL guard, the idle check) are given theirs where they are made (infra/guard.py); this
gives one to every other function a stack holds, above all the handlers CDK adds itself: the
``Custom::VpcRestrictDefaultSG`` provider that cdk.json's "@aws-cdk/aws-ec2:restrictDefaultSecurityGroup" brings,
and any custom-resource provider a later construct adds.

How: an explicit ``AWS::Logs::LogGroup`` per function, and the function's ``LoggingConfig.LogGroup`` naming it ("The
name of the Amazon CloudWatch log group the function sends logs to. By default, Lambda functions send logs to a
default log group named /aws/lambda/<function name>": AWS::Lambda::Function LoggingConfig,
https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/aws-properties-lambda-function-loggingconfig.html).
The reference makes CloudFormation create the log group before the function and delete it after, so a handler that
runs while the stack is deleted (a custom resource's Delete event) still has it. CDK's providers run with the
AWSLambdaBasicExecutionRole managed policy, whose logs:CreateLogStream and logs:PutLogEvents are on every log group.
"""

from __future__ import annotations

from aws_cdk import CfnResource, RemovalPolicy, Stack
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs

__all__ = ["FUNCTION_LOG_RETENTION", "give_functions_log_groups"]

# As the stack's other log groups (the flow logs, the guard's): a cluster lives hours to days, and a month covers
# reading what happened after it is gone.
FUNCTION_LOG_RETENTION = logs.RetentionDays.ONE_MONTH


def _has_log_group(function: CfnResource) -> bool:
    config = function.logging_config if isinstance(function, lambda_.CfnFunction) else None
    if config is None:
        return False
    return getattr(config, "log_group", None) is not None or (isinstance(config, dict) and "LogGroup" in config)


def give_functions_log_groups(stack: Stack) -> list[logs.LogGroup]:
    """A log group (retention :data:`FUNCTION_LOG_RETENTION`, deleted with the stack) for every
    ``AWS::Lambda::Function`` of ``stack`` that names none; call it once every construct of the stack exists."""
    made = []
    functions = [c for c in stack.node.find_all()
                 if isinstance(c, CfnResource) and c.cfn_resource_type == "AWS::Lambda::Function"]
    for function in functions:
        if _has_log_group(function):
            continue
        group = logs.LogGroup(function.node.scope, f"{function.node.id}Logs", retention=FUNCTION_LOG_RETENTION,
                              removal_policy=RemovalPolicy.DESTROY)
        function.add_property_override("LoggingConfig.LogGroup", group.log_group_name)
        made.append(group)
    return made
