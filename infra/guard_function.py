"""scaletrain cost guard, run by AWS Lambda. The stack inlines this file, so it must stay under 4,096 bytes.

CloudFormation calls it as the Custom::TtlClock resource: on Create/Update it answers the expiry, now +
TtlHours rounded up to the minute, as ExpiresAt (UTC). It fails the deploy when the stack has no
CloudFormation service role: the guard could not delete such a stack.
EventBridge Scheduler calls it every 15 minutes from the deploy on with {"action": "expire"}: it reads the
expiry from the TTL_PARAMETER SSM parameter (ExpiresAt, later once extended, now after a --teardown job) and
deletes the stack, with the stack's own service role, once it has passed, until the stack (and the schedule
in it) is gone. A missing or unreadable parameter counts as expired (the schedule is made after it).
"""

import datetime
import json
import os
import urllib.request

import boto3

STACK_ID = os.environ.get("STACK_ID", "")
TTL_PARAMETER = os.environ.get("TTL_PARAMETER", "")
FORMAT = "%Y-%m-%dT%H:%M:%SZ"  # infra.ttl.EXPIRY_FORMAT
NO_ROLE = (
    "the stack has no CloudFormation service role, so the TTL guard could not delete it; deploy it "
    "with `npx cdk deploy` from a bootstrapped account"
)


def handler(event, context):
    if "RequestType" in event:
        return clock(event, context)
    if event.get("action") == "expire":
        return expire(datetime.datetime.now(datetime.timezone.utc))
    raise ValueError(f"unexpected event, keys: {sorted(event)}")


def expire(now):
    ssm = boto3.client("ssm")
    try:
        value = ssm.get_parameter(Name=TTL_PARAMETER)["Parameter"]["Value"]
        end = datetime.datetime.strptime(value, FORMAT).replace(tzinfo=datetime.timezone.utc)
    except (ssm.exceptions.ParameterNotFound, ValueError) as exc:
        value, end = f"unreadable ({type(exc).__name__})", now
    if now < end:
        print(f"TTL extended to {value}: not deleting yet")
        return {"expires_at": value}
    boto3.client("cloudformation").delete_stack(StackName=STACK_ID)
    print(f"TTL {value} reached: deleting {STACK_ID}")
    return {"deleting": STACK_ID}


def expiry(now, hours):
    """now + hours, rounded up to the minute."""
    end = now + datetime.timedelta(hours=hours)
    if end.second or end.microsecond:
        end = end.replace(second=0, microsecond=0) + datetime.timedelta(minutes=1)
    return end


def clock(event, context):
    status, reason, data = "SUCCESS", "", {}
    try:
        if event["RequestType"] != "Delete":
            cfn = boto3.client("cloudformation")
            if not cfn.describe_stacks(StackName=STACK_ID)["Stacks"][0].get("RoleARN"):
                raise RuntimeError(NO_ROLE)
            now = datetime.datetime.now(datetime.timezone.utc)
            end = expiry(now, float(event["ResourceProperties"]["TtlHours"]))
            data = {"ExpiresAt": end.strftime(FORMAT)}
    except Exception as exc:  # any failure must reach CloudFormation, or the deploy hangs for an hour
        status, reason = "FAILED", f"{type(exc).__name__}: {exc}"
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason or f"log stream {context.log_stream_name}",
            "PhysicalResourceId": event.get("PhysicalResourceId") or "ttl-clock",
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
            "Data": data,
        }
    ).encode()
    request = urllib.request.Request(event["ResponseURL"], data=body, method="PUT", headers={"Content-Type": ""})
    urllib.request.urlopen(request, timeout=30).close()
    return data
