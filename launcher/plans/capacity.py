"""`launch up`: which availability zones to deploy the stack in, in which order, and what each failure means.

Pure decisions; ``launcher.cluster.aws.deploy`` runs the CDK CLI and reads CloudFormation, Auto Scaling and EC2.

EC2 answers a launch it has no room for with InsufficientInstanceCapacity, "We currently do not have sufficient
<type> capacity in the Availability Zone you requested (<az>)... You can currently get <type> capacity by not
specifying an Availability Zone in your request or choosing <other AZs>", and the fix it gives is another AZ, later,
or fewer instances (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/troubleshooting-launch.html, "Insufficient
instance capacity"). The stack pins one AZ (one subnet, one cluster placement group: a training job's nodes must be
close), so `launch up` moves the whole stack: delete the failed one, deploy again in the next AZ that offers the
types (DescribeInstanceTypeOfferings, location type availability-zone:
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypeOfferings.html). A stack sees the
error in two places: the Auto Scaling group's failed scaling activities, whose StatusMessage and the ErrorCode of
its launch errors carry it (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_LaunchInstancesError.html,
"ErrorCode ... (e.g., InsufficientInstanceCapacity)"; https://docs.aws.amazon.com/autoscaling/ec2/userguide/ts-as-instancelaunchfailure.html),
and, when CloudFormation waits for the group and gives up, the group resource's CREATE_FAILED status reason in the
stack events, which `cdk deploy` prints. Auto Scaling itself keeps retrying a group that cannot launch, so a stack
that deployed is watched until every node is in service. Spot has the same error code for no spot capacity
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/spot-request-status.html, capacity-not-available).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from infra.spec import ClusterSpec

__all__ = ["CAPACITY_MARKERS", "Attempt", "GroupState", "Outcome", "attempts", "capacity_line", "cdk_deploy_argv",
           "classify", "exhausted", "group_verdict", "is_capacity_error", "stack_in_the_way"]

# How EC2 and Auto Scaling word "no room for this type here now" (the documents above).
CAPACITY_MARKERS = (
    "InsufficientInstanceCapacity",
    "do not have sufficient",
    "capacity-not-available",
    "no Spot capacity available",
)
_REASON_CHARS = 300


def is_capacity_error(text: str) -> bool:
    return any(m.lower() in text.lower() for m in CAPACITY_MARKERS)


def capacity_line(texts: Iterable[str]) -> str | None:
    """The first line of ``texts`` that says EC2 had no capacity, trimmed; None if none does."""
    for text in texts:
        for line in text.splitlines():
            if is_capacity_error(line):
                return " ".join(line.split())[:_REASON_CHARS]
    return None


@dataclass(frozen=True)
class Attempt:
    az: str
    context: tuple[str, ...]  # the -c KEY=VALUE pairs of this deploy
    why: str                  # what this attempt is, for the user


@dataclass(frozen=True)
class Outcome:
    attempt: Attempt
    result: Literal["ok", "capacity", "failed"]
    reason: str               # one line


def _with(pairs: Sequence[str], **values: str) -> tuple[str, ...]:
    """``pairs`` with each KEY in ``values`` set to its value (an earlier KEY=... dropped)."""
    kept = [p for p in pairs if p.partition("=")[0] not in values]
    return (*kept, *(f"{k}={v}" for k, v in values.items()))


def attempts(spec: ClusterSpec, pairs: Sequence[str], *, zones: Sequence[str],
             offered: Mapping[str, frozenset[str]], reservation: tuple[str, str] | None = None,
             capacity_block: bool = False) -> list[Attempt]:
    """The deploys to try, in order; a ValueError (one line) when there is none.

    ``-c az`` (or a reservation, which lives in one AZ) pins the zone: one attempt. Otherwise every AZ of the region
    that offers every type the stack launches, by name. ``reservation`` (its id and AZ) is the fallback asked for with
    ``--fallback-reservation``: one more attempt that launches the workers into it (``capacity_block``: it is a
    Capacity Block for ML).
    """
    types = sorted({spec.instance_type, *([spec.reducer_type] if spec.reducers else [])})
    both = " and ".join(types)
    if spec.az is not None:
        pinned = "the capacity reservation's AZ" if spec.capacity_reservation_id else "-c az"
        plan = [Attempt(spec.az, _with(pairs, az=spec.az), f"{spec.az} ({pinned})")]
    else:
        common = set(zones).intersection(*(offered.get(t, frozenset()) for t in types))
        plan = [Attempt(az, _with(pairs, az=az), f"{az} (offers {both})") for az in sorted(common)]
    if reservation is not None:
        crid, az = reservation
        if spec.spot:
            raise ValueError("--fallback-reservation: not with -c spot=true (a reservation is On-Demand capacity)")
        if spec.capacity_reservation_id is not None:
            raise ValueError("--fallback-reservation: -c capacity_reservation_id already names one; pass one of them")
        extra = {"capacity_reservation_id": crid, "az": az, **({"capacity_block": "true"} if capacity_block else {})}
        kind = "Capacity Block" if capacity_block else "capacity reservation"
        plan.append(Attempt(az, _with(pairs, **extra), f"{az} (into {kind} {crid})"))
    if not plan:
        raise ValueError(f"no AZ of {spec.region} offers {both}: choose other instance types (-c instance_type, "
                         f"-c reducer_type) or another -c region")
    return plan


def classify(rc: int, texts: Iterable[str], failed_reasons: Sequence[str]) -> tuple[Literal["capacity", "failed"], str]:
    """A deploy that did not bring every node up: a capacity failure (try elsewhere) or another one (stop).

    ``texts``: what `cdk deploy` printed, the stack's failed events' reasons and the groups' failed activities;
    ``failed_reasons``: the events' and activities' reasons alone, the best one line for another failure.
    """
    texts = list(texts)
    line = capacity_line(texts)
    if line is not None:
        return "capacity", line
    if failed_reasons:
        return "failed", " ".join(failed_reasons[0].split())[:_REASON_CHARS]
    last = next((x.strip() for t in reversed(texts) for x in reversed(t.splitlines()) if x.strip()), "")
    return "failed", (f"cdk deploy exited {rc}: {last}" if last else f"cdk deploy exited {rc}")[:_REASON_CHARS]


@dataclass(frozen=True)
class GroupState:
    name: str
    desired: int
    in_service: int
    failures: tuple[str, ...] = ()  # failed scaling activities' messages since the deploy began


def group_verdict(groups: Sequence[GroupState]) -> tuple[Literal["ready", "waiting", "capacity", "failed"], str]:
    """After a deploy that CloudFormation called complete: are the nodes there, still coming, or never coming?"""
    if groups and all(g.in_service >= g.desired for g in groups):
        return "ready", f"{sum(g.in_service for g in groups)} node(s) in service"
    messages = [m for g in groups for m in g.failures]
    line = capacity_line(messages)
    if line is not None:
        return "capacity", line
    if messages:
        return "failed", " ".join(messages[0].split())[:_REASON_CHARS]
    return "waiting", ", ".join(f"{g.name}: {g.in_service} of {g.desired} in service" for g in groups)


def stack_in_the_way(stack: str, status: str | None) -> str | None:
    """One line when a stack of that name exists: `launch up` only creates, so that what it deletes is its own."""
    if status is None or status in ("DELETE_COMPLETE", "ROLLBACK_COMPLETE"):
        return None  # none, or a failed creation `cdk deploy` replaces itself
    return (f"stack '{stack}' already exists ({status}): `launch up` creates stacks and deletes only what it made; "
            f"update this one with `npx cdk deploy`, or delete it with `launch down --cluster {stack}`")


def exhausted(spec: ClusterSpec, outcomes: Sequence[Outcome]) -> str:
    """The one-line error when every attempt failed for lack of capacity."""
    tried = ", ".join(o.attempt.az for o in outcomes)
    what = f"{spec.nodes} x {spec.instance_type}"
    what += f" + {spec.reducers} x {spec.reducer_type}" if spec.reducers else ""
    hint = ("leave -c az out to let `launch up` try the region's other AZs, " if spec.az is not None
            and not spec.capacity_reservation_id else "")
    return (f"no capacity for {what} in {tried} ({len(outcomes)} attempt(s), each InsufficientInstanceCapacity); "
            f"{hint}try later, fewer -c nodes, another -c region, or a reservation (--fallback-reservation cr-..., "
            f"`launch preflight` lists Capacity Block offerings)")


def cdk_deploy_argv(stack: str, pairs: Sequence[str], profile: str | None = None) -> list[str]:
    """`npx cdk deploy` for one stack, with nothing to confirm: the stack creates IAM roles, which the CLI otherwise
    asks a person to approve (https://docs.aws.amazon.com/cdk/v2/guide/ref-cli-cmd-deploy.html, --require-approval:
    "never: Approval is never required")."""
    argv = ["npx", "cdk", "deploy", stack, "--require-approval", "never"]
    for pair in pairs:
        argv += ["-c", pair]
    return argv + (["--profile", profile] if profile else [])
