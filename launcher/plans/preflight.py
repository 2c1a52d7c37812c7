"""Before `cdk deploy`: what in this account and region would stop the stack's nodes from launching.

Pure decisions. ``launcher.execute.preflight`` reads the facts from AWS (read-only calls) into :class:`Facts`; the
functions here turn a :class:`~infra.spec.ClusterSpec` and those facts into :class:`Verdict` lines: each failure
one line naming the fix. The spec comes from the same context keys ``npx cdk deploy -c key=value`` reads
(cdk.json's ``context``, then ``-c``), validated by the same ``ClusterSpec.from_context``.

What is checked, and the AWS documents behind each rule:

- offering: every instance type the stack launches is offered in its AZ (DescribeInstanceTypeOfferings,
  https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTypeOfferings.html). Without
  ``-c az`` the stack takes the region's first AZ as Fn::GetAZs lists it, and "the order of the results ... isn't
  guaranteed" (https://docs.aws.amazon.com/AWSCloudFormation/latest/TemplateReference/intrinsic-function-reference-getavailabilityzones.html),
  so a type missing from any AZ of the region needs ``-c az``.
- quota: the account's vCPU quotas per instance class and market (Service Quotas, service code ``ec2``), against
  nodes x vCPUs; usage is subtracted when the quota's own CloudWatch usage metric reports it.
- reservation: ``-c capacity_reservation_id`` exists, is for the workers' type, AZ, default tenancy and Linux/UNIX,
  is active (or scheduled), has room for every worker, sits in the placement group the stack uses, and is or is
  not a Capacity Block as ``-c capacity_block`` says.
- capacity-block: with no reservation, the Capacity Block offerings for the workers (a hint, never a failure).
- interfaces, image-build: the Region's network-interface quota, and with no image yet what its build needs
  (launcher.plans.preflight_limits).
- image: ``-c ami``, else the image the ``ami/`` pipeline published in SSM (``ClusterSpec.image_parameter``), exists
  in the region, is available, is x86_64, has the root device the launch template maps, and fits
  ``-c root_volume_gib``.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from infra import catalog
from infra import spec as cdk_context
from infra.spec import CAPACITY_BLOCK_TYPES, CONTEXT_KEYS, HEAD_INSTANCE_TYPE, READ_KEYS, ClusterSpec, SpecError

__all__ = ["QUOTA_CLASSES", "Facts", "ImageFacts", "Need", "Quota", "Unread", "Verdict",
           "block_duration_hours", "check_image", "check_offerings", "check_quotas",
           "check_reservation", "context_from_args", "decide", "deploy_command", "failed", "hint_blocks", "needs",
           "quota_class", "quota_codes", "render", "spec_from_context", "summary", "wants_block_offerings"]

Status = Literal["ok", "FAIL", "warn", "skip", "info"]


@dataclass(frozen=True)
class Verdict:
    check: str      # offering, quota, reservation, capacity-block, image
    status: Status  # FAIL: the nodes would not launch; warn: a risk; skip: AWS did not say (no check); info: a hint
    line: str       # one line; a FAIL names the fix


class Unread(str):
    """A fact AWS did not give (access denied, throttled, ...): the reason, as one line. Its check is not made."""


# --- Which quotas an instance type draws on ------------------------------------------------------------------


class QuotaClass(NamedTuple):
    label: str
    on_demand: tuple[str, str]  # (quota code, quota name)
    spot: tuple[str, str]


# vCPU quotas by instance class, on-demand and spot. On-Demand: "Running On-Demand P instances" etc.
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-on-demand-instances.html#ec2-on-demand-instances-limits);
# Spot: "All P Spot Instance Requests" etc. (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/using-spot-limits.html).
# The codes are Service Quotas' for service code ec2, as `aws service-quotas list-service-quotas --service-code ec2`
# lists them (and the AWS CLI reference's get-aws-default-service-quota example shows L-1216C47A).
QUOTA_CLASSES: dict[str, QuotaClass] = {
    "P": QuotaClass("P", ("L-417A185B", "Running On-Demand P instances"),
                    ("L-7212CCBC", "All P Spot Instance Requests")),
    "G": QuotaClass("G and VT", ("L-DB2E81BA", "Running On-Demand G and VT instances"),
                    ("L-3819A6DF", "All G and VT Spot Instance Requests")),
    "standard": QuotaClass("Standard",
                           ("L-1216C47A", "Running On-Demand Standard (A, C, D, H, I, M, R, T, Z) instances"),
                           ("L-34B43A08", "All Standard (A, C, D, H, I, M, R, T, Z) Spot Instance Requests")),
}
_STANDARD_LETTERS = frozenset("acdhimrtz")


def quota_class(instance: catalog.InstanceType) -> QuotaClass:
    """The vCPU quota class of a catalog type: P, G and VT, or Standard (A, C, D, H, I, M, R, T, Z)."""
    letter = instance.family[0]
    if letter == "p":
        return QUOTA_CLASSES["P"]
    if letter in "gv":
        return QUOTA_CLASSES["G"]
    if letter in _STANDARD_LETTERS:
        return QUOTA_CLASSES["standard"]
    raise ValueError(f"{instance.name}: no vCPU quota class known for family {instance.family!r}")


# --- What the stack launches ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Need:
    role: str            # workers, reducers, head
    instance: catalog.InstanceType
    count: int
    spot: bool
    reserved: bool       # launches into the capacity reservation

    @property
    def vcpus(self) -> int:
        return self.count * self.instance.vcpus

    def describe(self) -> str:
        return f"{self.role}: {self.count} x {self.instance.name} x {self.instance.vcpus}"


def needs(spec: ClusterSpec) -> list[Need]:
    """The instances the stack launches: workers (in the reservation, if any), reducers (never reserved), and the
    Slurm head node, on-demand always (infra/head.py). The image build's instance is the image stack's, checked
    apart (check_image_build)."""
    out = [Need("workers", spec.worker, spec.nodes, spec.spot, spec.capacity_reservation_id is not None)]
    if spec.reducers:
        out.append(Need("reducers", spec.reducer, spec.reducers, spec.spot, False))
    return [*out, Need("head", catalog.get(HEAD_INSTANCE_TYPE), 1, False, False)]


def quota_codes(spec: ClusterSpec) -> list[str]:
    """The quota codes the stack draws on (what the shell reads)."""
    codes = []
    for need in needs(spec):
        code = _quota_of(need)[0]
        if not need.reserved and code not in codes:
            codes.append(code)
    return codes


def _quota_of(need: Need) -> tuple[str, str]:
    qc = quota_class(need.instance)
    return qc.spot if need.spot else qc.on_demand


# --- Facts, as the shell reads them --------------------------------------------------------------------------


@dataclass(frozen=True)
class Quota:
    code: str
    name: str
    value: float                  # vCPUs
    usage: float | None = None    # vCPUs in use now, from the quota's CloudWatch usage metric; None: not reported


@dataclass(frozen=True)
class ImageFacts:
    ami: str | None                          # -c ami, or the SSM parameter's value; None: the parameter is missing
    parameter: str | None                    # the SSM parameter read; None: -c ami names the image
    image: Mapping[str, Any] | None = None   # the DescribeImages item; None: no such image in the region
    unread: Unread | None = None


@dataclass(frozen=True)
class Facts:
    region: str
    zones: tuple[str, ...] | Unread                        # the region's AZs (zone type availability-zone)
    offered: Mapping[str, frozenset[str]] | Unread         # instance type -> AZs that offer it
    quotas: Mapping[str, Quota | Unread]                   # quota code -> quota
    image: ImageFacts
    now: dt.datetime                                       # when the facts were read (the shell's clock, not ours)
    reservation: Mapping[str, Any] | Unread | None = None  # the DescribeCapacityReservations item; None: not found
    block_offerings: list[Mapping[str, Any]] | Unread | None = None  # None: not asked
    interfaces: Any = None  # launcher.plans.preflight_limits.InterfaceFacts; None: not read
    build: Any = None       # launcher.plans.preflight_limits.BuildFacts, read when there is no image; None: not asked
    ssm_plugin: str | None = "session-manager-plugin"  # where the Session Manager plugin is on PATH; None: not there


# --- Context -------------------------------------------------------------------------------------------------


def context_from_args(pairs: Iterable[str], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """cdk.json's context (``defaults``) overlaid with ``-c KEY=VALUE`` pairs, as the CDK CLI merges them. A malformed
    pair or a key the stack does not read (infra/app.py refuses it too) is a one-line ValueError."""
    context = dict(defaults or {})
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"-c {pair}: expected KEY=VALUE, e.g. -c nodes=8")
        if cdk_context.unknown_context_keys({key: value}, READ_KEYS):
            raise ValueError(f"-c {pair}: unknown context key {key!r}; allowed: {', '.join(CONTEXT_KEYS)}")
        context[key] = value
    return context


def spec_from_context(context: Mapping[str, Any]) -> ClusterSpec:
    """The stack's spec, exactly as infra/app.py builds it; bad values are one-line ValueErrors."""
    try:
        return ClusterSpec.from_context(context)
    except SpecError as e:
        raise ValueError(str(e)) from None


def deploy_command(pairs: Iterable[str]) -> str:
    return " ".join(["npx cdk deploy", *(f"-c {p}" for p in pairs)])


# --- Checks --------------------------------------------------------------------------------------------------


def _names(zones: Iterable[str]) -> str:
    return ", ".join(sorted(zones)) or "none"


def check_offerings(spec: ClusterSpec, facts: Facts) -> list[Verdict]:
    """Each node group's type offered in the stack's AZ; without ``-c az``, in every AZ of the region."""
    wanted = needs(spec)
    if isinstance(facts.offered, Unread) or isinstance(facts.zones, Unread):
        reason = facts.offered if isinstance(facts.offered, Unread) else facts.zones
        return [Verdict("offering", "skip", f"could not read instance type offerings in {spec.region}: {reason}")]
    offered = {n.instance.name: facts.offered.get(n.instance.name, frozenset()) for n in wanted}
    # The AZs that offer every type (all node groups share one subnet and placement group); a reservation's AZ first.
    common = frozenset(facts.zones).intersection(*offered.values())
    reserved_az = facts.reservation.get("AvailabilityZone") if isinstance(facts.reservation, Mapping) else None
    pick = reserved_az if reserved_az in common else (min(common) if common else None)
    both = " and ".join(offered)
    if pick is None:
        fix = (f"no AZ of {spec.region} offers {both}: choose other instance types (-c instance_type, "
               f"-c reducer_type) or another -c region")
    else:
        fix = f"pass -c az={pick}" + (f" (AZs that offer {both}: {_names(common)})" if len(offered) > 1 else "")
    out = []
    for need in wanted:
        name, zones = need.instance.name, offered[need.instance.name]
        what = f"{name} ({need.role})"
        if not zones:
            out.append(Verdict("offering", "FAIL", f"{what} is offered in no AZ of {spec.region}; {fix}"))
        elif spec.az is not None:
            if spec.az in zones:
                out.append(Verdict("offering", "ok", f"{what} is offered in {spec.az}"))
            else:
                out.append(Verdict("offering", "FAIL", f"{what} is not offered in {spec.az} (it is in "
                                                       f"{_names(zones)}); {fix}"))
        elif zones >= set(facts.zones):
            out.append(Verdict("offering", "ok", f"{what} is offered in every AZ of {spec.region}"))
        else:
            out.append(Verdict("offering", "FAIL", f"{what} is offered only in {_names(zones)} of {spec.region}, and "
                                                   f"without -c az the stack takes the region's first AZ in whatever "
                                                   f"order Fn::GetAZs lists them; {fix}"))
    return out


def check_quotas(spec: ClusterSpec, facts: Facts) -> list[Verdict]:
    """vCPUs the stack launches per quota, against the quota minus what is in use (when AWS reports it)."""
    out, by_code = [], {}
    for need in needs(spec):
        if need.reserved:
            # They run in capacity the reservation already holds (checked below), so they are not counted again here.
            out.append(Verdict("quota", "ok", f"{need.role} launch into {spec.capacity_reservation_id}: their "
                                              f"{need.vcpus} vCPUs are the reservation's, not counted against "
                                              f"{_quota_of(need)[0]}"))
            continue
        by_code.setdefault(_quota_of(need), []).append(need)
    for (code, name), group in by_code.items():
        vcpus = sum(n.vcpus for n in group)
        how = " + ".join(n.describe() for n in group)
        quota = facts.quotas.get(code, Unread("not read"))
        if isinstance(quota, Unread):
            out.append(Verdict("quota", "skip", f"could not read {name} ({code}) in {spec.region}: {quota}; the stack "
                                                f"needs {vcpus} vCPUs ({how}): see the Service Quotas console"))
            continue
        in_use = quota.usage or 0.0
        usage = (f"{quota.usage:g} in use" if quota.usage is not None
                 else "current usage not reported by CloudWatch, so not subtracted")
        if vcpus + in_use > quota.value:
            want = math.ceil(vcpus + in_use)
            out.append(Verdict("quota", "FAIL", f"{name} ({code}) is {quota.value:g} vCPUs in {spec.region} ({usage}); "
                                                f"the stack needs {vcpus} ({how}): request {want} or more with `aws "
                                                f"service-quotas request-service-quota-increase --region {spec.region} "
                                                f"--service-code ec2 --quota-code {code} --desired-value {want}`"))
        else:
            out.append(Verdict("quota", "ok", f"{name} ({code}): {vcpus} vCPUs needed ({how}) of {quota.value:g} "
                                              f"({usage})"))
    return out


# Instances launch only into an active reservation
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-launch.html); a scheduled one (a Capacity
# Block before its start, https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-view.html, or a
# future-dated reservation) takes them once it starts.
_NOT_YET = frozenset({"scheduled", "pending", "assessing", "delayed", "payment-pending"})


def check_reservation(spec: ClusterSpec, facts: Facts) -> list[Verdict]:
    """``-c capacity_reservation_id`` against the stack: type, AZ, tenancy, platform, state, size, group, kind."""
    crid = spec.capacity_reservation_id
    if crid is None:
        return []
    r = facts.reservation
    if isinstance(r, Unread):
        return [Verdict("reservation", "skip", f"could not read capacity reservation {crid}: {r}")]
    if r is None:
        return [Verdict("reservation", "FAIL", f"capacity reservation {crid} does not exist in {spec.region} (or is "
                                               f"not shared with this account): check -c capacity_reservation_id "
                                               f"and -c region")]
    out: list[Verdict] = []

    def fail(line: str) -> None:
        out.append(Verdict("reservation", "FAIL", f"{crid}: {line}"))

    itype, az, state = r.get("InstanceType"), r.get("AvailabilityZone"), r.get("State", "")
    # Instances launch into a reservation only when type, platform, AZ and tenancy match it
    # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-launch.html).
    if itype != spec.instance_type:
        fail(f"reserves {itype}, the workers are {spec.instance_type}: pass -c instance_type={itype}")
    if spec.az != az:  # the spec requires -c az with a reservation
        fail(f"is in {az}, the stack in {spec.az}: pass -c az={az}")
    if r.get("Tenancy", "default") != "default":
        fail(f"has {r.get('Tenancy')} tenancy; the stack launches default-tenancy instances: reserve default tenancy")
    platform = r.get("InstancePlatform", "Linux/UNIX")
    image_platform = (facts.image.image or {}).get("PlatformDetails")
    if platform != "Linux/UNIX" or (image_platform and image_platform != platform):
        # "Your instance can't launch using an AMI with a different platform than the platform for your Capacity
        # Block" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html).
        fail(f"is for {platform} and the image is {image_platform or 'Linux/UNIX'}: reserve Linux/UNIX capacity")
    block = r.get("ReservationType") == "capacity-block"
    if state in _NOT_YET:
        start = _when(r.get("StartDate"))
        out.append(Verdict("reservation", "warn", f"{crid} is {state}" + (f" until {start}" if start else "") +
                           ": the nodes launch into it only once it is active, and the stack's TTL counts from "
                           "deploy; deploy close to its start"))
        room = r.get("TotalInstanceCount", 0)  # before it starts, AvailableInstanceCount reads 0
    elif state != "active":
        fail(f"is {state}: nothing can launch into it; reserve new capacity or drop -c capacity_reservation_id")
        room = None
    else:
        room = r.get("AvailableInstanceCount", 0)
    if room is not None and room < spec.nodes:
        fail(f"has room for {room} of the {spec.nodes} workers ({r.get('TotalInstanceCount', '?')} reserved): "
             f"pass -c nodes={room} or enlarge the reservation")
    group_arn = r.get("PlacementGroupArn")
    group = group_arn.rsplit("/", 1)[-1] if group_arn else None
    if group and not block and spec.placement_group != group:
        # A reservation made in a cluster placement group is used only by instances launched into that group
        # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/cr-cpg.html).
        fail(f"is in cluster placement group {group}: pass -c placement_group={group}")
    if block and not spec.capacity_block:
        # A Capacity Block is used only by launches that ask for the capacity-block market type
        # (https://docs.aws.amazon.com/autoscaling/ec2/userguide/launch-template-capacity-blocks.html).
        fail("is a Capacity Block: the launch template must ask for the capacity-block market type; pass "
             "-c capacity_block=true")
    elif spec.capacity_block and not block:
        fail("is an On-Demand Capacity Reservation, not a Capacity Block: drop -c capacity_block")
    end = r.get("EndDate")
    if block and isinstance(end, dt.datetime):
        ttl_end = facts.now + dt.timedelta(hours=spec.ttl_hours)
        # "Thirty minutes before the reservation expires, we begin to terminate any instances that are still running
        # in the Capacity Block" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html).
        if end - dt.timedelta(minutes=30) < ttl_end:
            out.append(Verdict("reservation", "warn", f"{crid} ends {_when(end)} and EC2 starts terminating its "
                                                      f"instances 30 minutes earlier, before the stack's TTL "
                                                      f"({spec.ttl_hours:g} h from now) runs out: checkpoint in time "
                                                      f"or lower -c ttl_hours"))
    if not any(v.status == "FAIL" for v in out):
        kind = "Capacity Block" if block else "capacity reservation"
        out.insert(0, Verdict("reservation", "ok", f"{kind} {crid}: {itype} in {az}, {state}, room for "
                                                   f"{room} of {spec.nodes} workers"))
    return out


def _when(value: Any) -> str:
    return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC") if isinstance(value, dt.datetime) else ""


def check_image(spec: ClusterSpec, facts: Facts) -> list[Verdict]:
    """The image the launch templates name: in the region, available, x86_64, root device and size as launched."""
    img = facts.image
    where = f"SSM parameter {img.parameter}" if img.parameter else "-c ami"
    if img.unread is not None:
        return [Verdict("image", "skip", f"could not read the image ({where}) in {spec.region}: {img.unread}")]
    if img.ami is None:
        return [Verdict("image", "FAIL", f"no training image in {spec.region} ({where} is missing): build it once "
                                         f"with `{spec.image_build_command}` (or pass -c ami=)")]
    what = f"{img.ami} ({where})"
    rebuild = (f"build it again with `{spec.image_build_command}`" if img.parameter else
               f"AMIs are regional: copy it with `aws ec2 copy-image --region {spec.region} ...` or pass an id from "
               f"{spec.region}")
    if img.image is None:
        return [Verdict("image", "FAIL", f"{what} does not exist in {spec.region}: {rebuild}")]
    state, arch = img.image.get("State"), img.image.get("Architecture")
    if state != "available":
        return [Verdict("image", "FAIL", f"{what} is {state}, not available"
                                         + ("" if state == "pending" else f": {rebuild}"))]
    out = []
    if arch != "x86_64":
        out.append(Verdict("image", "FAIL", f"{what} is {arch}; {spec.instance_type} runs x86_64 images"))
    root = img.image.get("RootDeviceName")
    if root and root != spec.root_device:
        # The launch template maps -c root_device with no snapshot and (by default) no size; on any other device
        # than the image's root that is a new volume, which needs one or the other
        # (https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_Ebs.html, SnapshotId, VolumeSize).
        out.append(Verdict("image", "FAIL", f"{what} has root device {root}, the launch template maps "
                                            f"{spec.root_device}: pass -c root_device={root}"))
    size = next((m.get("Ebs", {}).get("VolumeSize") for m in img.image.get("BlockDeviceMappings", [])
                 if m.get("DeviceName") == root), None)
    problem = spec.root_volume_problem(size) if size else None
    if problem:
        out.append(Verdict("image", "FAIL", f"{what}: {problem}"))
    return out or [Verdict("image", "ok", f"{what} is available in {spec.region}: {img.image.get('Name', '')}"
                                          + (f", {size} GiB root" if size else ""))]


# Capacity Blocks for ML: "1-day increments up to 14 days, and in 7-day increments up to 182 days", up to 64
# instances per block (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-purchase.html); the types
# sold so are infra.spec.CAPACITY_BLOCK_TYPES.
_BLOCK_MAX_INSTANCES = 64


def block_duration_hours(ttl_hours: float) -> int:
    """The shortest Capacity Block that covers the stack's TTL."""
    days = max(1, math.ceil(ttl_hours / 24))
    return 24 * (days if days <= 14 else min(182, 7 * math.ceil(days / 7)))


def wants_block_offerings(spec: ClusterSpec) -> bool:
    return (spec.capacity_reservation_id is None and not spec.spot and spec.instance_type in CAPACITY_BLOCK_TYPES
            and spec.nodes <= _BLOCK_MAX_INSTANCES)


def hint_blocks(spec: ClusterSpec, facts: Facts) -> list[Verdict]:
    """With no reservation, what Capacity Blocks AWS would sell for the workers (never a failure)."""
    offers = facts.block_offerings
    if not wants_block_offerings(spec) or offers is None:
        return []
    what = f"{spec.nodes} x {spec.instance_type} for {block_duration_hours(spec.ttl_hours)} h"
    if isinstance(offers, Unread):
        return [Verdict("capacity-block", "info", f"could not list Capacity Block offerings for {what}: {offers}")]
    if not offers:
        return [Verdict("capacity-block", "info", f"no Capacity Block offered for {what} in {spec.region} now")]
    first = min(offers, key=lambda o: (o.get("StartDate") or facts.now, str(o.get("AvailabilityZone"))))
    fee = first.get("UpfrontFee")
    return [Verdict("capacity-block", "info",
                    f"{len(offers)} Capacity Block offering(s) for {what}; earliest in {first.get('AvailabilityZone')} "
                    f"from {_when(first.get('StartDate'))}"
                    + (f" for {first.get('CurrencyCode', 'USD')} {fee} upfront" if fee else "")
                    + f": buy one (`aws ec2 purchase-capacity-block --region {spec.region} "
                      f"--capacity-block-offering-id {first.get('CapacityBlockOfferingId')} --instance-platform "
                      f"Linux/UNIX`), then pass -c capacity_reservation_id=<its cr-id> -c capacity_block=true "
                      f"-c az={first.get('AvailabilityZone')}")]


SSM_PLUGIN = "session-manager-plugin"
SSM_PLUGIN_DOC = ("https://docs.aws.amazon.com/systems-manager/latest/userguide/"
                  "session-manager-working-with-install-plugin.html")


def ssm_plugin_problem(found: str | None) -> str | None:
    """The one line for a missing Session Manager plugin, or None. Every SSH to a node goes through ``aws ssm
    start-session`` (launcher/cluster/aws/access.py), and the AWS CLI runs the plugin for it; without it the first
    SSH fails with the CLI's "SessionManagerPlugin is not found", after the stack is paid for ("Install the Session
    Manager plugin for the AWS CLI", AWS Systems Manager User Guide)."""
    if found:
        return None
    return (f"the AWS CLI's Session Manager plugin ({SSM_PLUGIN}) is not on PATH, and every SSH to a node goes "
            f"through SSM Session Manager: install it as {SSM_PLUGIN_DOC} says")


def check_ssm_plugin(facts: Facts) -> list[Verdict]:
    problem = ssm_plugin_problem(facts.ssm_plugin)
    return [Verdict("ssm-plugin", "FAIL", problem) if problem else
            Verdict("ssm-plugin", "ok", f"Session Manager plugin: {facts.ssm_plugin}")]


def decide(spec: ClusterSpec, facts: Facts) -> list[Verdict]:
    from launcher.plans import preflight_limits as limits  # it builds on this module's types

    return [*check_offerings(spec, facts), *check_quotas(spec, facts), *limits.check_interfaces(spec, facts.interfaces),
            *check_reservation(spec, facts), *hint_blocks(spec, facts), *check_image(spec, facts),
            *limits.check_image_build(spec, facts.build), *check_ssm_plugin(facts)]


# --- Output --------------------------------------------------------------------------------------------------


def failed(verdicts: Iterable[Verdict]) -> bool:
    return any(v.status == "FAIL" for v in verdicts)


def render(verdicts: Iterable[Verdict]) -> list[str]:
    """One line per verdict: status, check, what; plain text that reads the same in a terminal and in a log."""
    return [f"{v.status:<5} {v.check:<15} {v.line}" for v in verdicts]


def summary(spec: ClusterSpec, verdicts: list[Verdict], pairs: Iterable[str]) -> str:
    fails = sum(v.status == "FAIL" for v in verdicts)
    skipped = sum(v.status == "skip" for v in verdicts)
    checked = sum(v.status in ("ok", "FAIL", "warn") for v in verdicts)
    where = f"stack '{spec.cluster_name}' in {spec.region}"
    if fails:
        return f"preflight: {fails} of {checked} checks fail for {where}: fix them before `npx cdk deploy`"
    tail = f" ({skipped} could not be made: see 'skip' above)" if skipped else ""
    return f"preflight: {checked} checks pass for {where}{tail}; deploy with `{deploy_command(pairs)}`"
