"""Preflight's regional limits (pure): the network interfaces a large cluster takes, and what the image build needs.

``launcher.execute.preflight`` reads the facts (``InterfaceFacts``, ``BuildFacts``); :mod:`launcher.plans.preflight`'s
``decide`` adds these verdicts to its own.

- interfaces: every node launches with one network interface per network card its EFA layout uses (infra.layout,
  from the catalog's ``efa_cards``: a p5.48xlarge takes 32), plus the head node's one and one per interface VPC
  endpoint of the stack's subnet; against the Region's "Network interfaces per Region" quota (service code ``vpc``,
  quota code L-DF5E4CA3, default 5,000: https://docs.aws.amazon.com/vpc/latest/userguide/amazon-vpc-limits.html,
  "Network interfaces") minus the interfaces that exist. Past it, RunInstances fails with
  NetworkInterfaceLimitExceeded and the Auto Scaling group never fills.
- image-build: with no image yet, the image stack's build and test instances (one of ``IMAGE_BUILD_TYPES``, G types
  all, whichever Image Builder finds capacity for) draw on "Running On-Demand G and VT instances" (L-DB2E81BA), which
  is 0 vCPUs in many new accounts
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-on-demand-instances.html#ec2-on-demand-instances-limits);
  and the image stack names no subnet, so EC2 puts them in the default VPC's default subnet ("If you don't specify a
  subnet when you launch an instance, the instance is launched into a default subnet",
  https://docs.aws.amazon.com/vpc/latest/userguide/default-vpc.html), whose route to an internet gateway is how the
  build downloads the driver, CUDA, EFA and the Python packages. No default VPC, or one whose route out was removed,
  and the build fails after the stack deployed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from infra.spec import ClusterSpec
from launcher.plans.preflight import QUOTA_CLASSES, Quota, QuotaClass, Unread, Verdict, needs

__all__ = ["ENDPOINT_INTERFACES", "IMAGE_BUILD_TYPES", "INTERFACE_QUOTA", "BuildFacts", "InterfaceFacts",
           "build_quota_class", "check_image_build", "check_interfaces", "interfaces_needed", "routes_out"]

INTERFACE_QUOTA = ("L-DF5E4CA3", "Network interfaces per Region")   # service code vpc
# The stack's interface VPC endpoints (infra/network.INTERFACE_ENDPOINT_SERVICES: ssm, ssmmessages, ec2messages,
# secretsmanager, autoscaling), one interface each in the one subnet ("Each interface endpoint is represented by one
# or more elastic network interfaces in your subnets",
# https://docs.aws.amazon.com/vpc/latest/privatelink/create-interface-endpoint.html); the head node's one interface;
# FSx for Lustre's file servers add their own, not counted here.
ENDPOINT_INTERFACES = 5
HEAD_INTERFACES = 1
# ami/stack.py's ImageSpec.build_instance_types default (a test holds the two equal): Image Builder runs the build and
# then the test instance, each of one of these types, whichever has capacity; one quota class for all.
IMAGE_BUILD_TYPES = ("g5.xlarge", "g6.xlarge", "g4dn.xlarge")


@dataclass(frozen=True)
class InterfaceFacts:
    quota: Quota | Unread   # value: the quota; usage: network interfaces in the Region now (DescribeNetworkInterfaces)


@dataclass(frozen=True)
class BuildFacts:
    """What the image build needs, read only when there is no image yet (None in Facts otherwise)."""

    instance_types: tuple[str, ...]           # the types Image Builder may take (IMAGE_BUILD_TYPES), one quota class
    vcpus: int | Unread                       # the most DefaultVCpus of them (DescribeInstanceTypes)
    quota: Quota | Unread                     # their on-demand vCPU quota
    default_vpc: str | None | Unread          # its id; None: the Region has no default VPC
    routes_out: bool = False                  # an instance in a default subnet reaches the internet (routes_out)


def interfaces_needed(spec: ClusterSpec) -> tuple[int, str]:
    """(interfaces the stack makes, how): per node group, nodes x the interfaces of its layout, then the head node and
    the endpoints."""
    parts, total = [], 0
    for need in needs(spec):
        if need.role == "head":  # counted below, with its own interface count
            continue
        per = len(spec.worker_interfaces if need.role == "workers" else spec.reducer_interfaces)
        total += need.count * per
        parts.append(f"{need.role}: {need.count} x {per}")
    total += HEAD_INTERFACES + ENDPOINT_INTERFACES
    return total, " + ".join([*parts, f"head node {HEAD_INTERFACES}", f"VPC endpoints {ENDPOINT_INTERFACES}"])


def check_interfaces(spec: ClusterSpec, facts: InterfaceFacts | None) -> list[Verdict]:
    if facts is None:
        return []
    code, name = INTERFACE_QUOTA
    want, how = interfaces_needed(spec)
    q = facts.quota
    if isinstance(q, Unread):
        return [Verdict("interfaces", "skip", f"could not read {name} ({code}) in {spec.region}: {q}; the stack "
                                              f"makes {want} network interfaces ({how})")]
    in_use = q.usage or 0.0
    used = f"{q.usage:g} in use" if q.usage is not None else "interfaces in use not read, so not subtracted"
    if want + in_use > q.value:
        ask = math.ceil(want + in_use)
        return [Verdict("interfaces", "FAIL", f"{name} ({code}) is {q.value:g} in {spec.region} ({used}); the stack "
                                              f"makes {want} ({how}): request {ask} or more with `aws service-quotas "
                                              f"request-service-quota-increase --region {spec.region} --service-code "
                                              f"vpc --quota-code {code} --desired-value {ask}`")]
    return [Verdict("interfaces", "ok", f"{name} ({code}): {want} needed ({how}) of {q.value:g} ({used})")]


def build_quota_class(instance_type: str) -> QuotaClass:
    """The on-demand vCPU quota class of the build type by its family letter (the catalog holds only cluster types)."""
    letter = instance_type[0]
    return QUOTA_CLASSES["P" if letter == "p" else "G" if letter in "gv" else "standard"]


def check_image_build(spec: ClusterSpec, build: BuildFacts | None) -> list[Verdict]:
    """With no image yet: can the image stack's build run in this Region?"""
    if build is None:
        return []
    out: list[Verdict] = []
    code, name = build_quota_class(build.instance_types[0]).on_demand
    q, vcpus = build.quota, build.vcpus
    types = " or ".join(build.instance_types)
    what = f"the image build's {types}" + (" (whichever has capacity)" if len(build.instance_types) > 1 else "")
    if isinstance(q, Unread) or isinstance(vcpus, Unread):
        out.append(Verdict("image-build", "skip", f"could not read {name} ({code}) or the vCPUs of {types} "
                                                  f"in {spec.region}: {q if isinstance(q, Unread) else vcpus}"))
    else:
        in_use = q.usage or 0.0
        if vcpus + in_use > q.value:
            ask = math.ceil(vcpus + in_use)
            out.append(Verdict("image-build", "FAIL",
                               f"{name} ({code}) is {q.value:g} vCPUs in {spec.region}"
                               + (f" ({q.usage:g} in use)" if q.usage is not None else "")
                               + f"; {what} needs {vcpus}: request {ask} or more with `aws service-quotas "
                                 f"request-service-quota-increase --region {spec.region} --service-code ec2 "
                                 f"--quota-code {code} --desired-value {ask}`"))
        else:
            out.append(Verdict("image-build", "ok", f"{name} ({code}): {what} needs {vcpus} of {q.value:g} vCPUs"))
    vpc = build.default_vpc
    if isinstance(vpc, Unread):
        out.append(Verdict("image-build", "skip", f"could not read the default VPC of {spec.region}: {vpc}"))
    elif vpc is None:
        out.append(Verdict("image-build", "FAIL", f"{spec.region} has no default VPC, where {what} launches (the "
                                                  f"image stack names no subnet): create one with `aws ec2 "
                                                  f"create-default-vpc --region {spec.region}`"))
    elif not build.routes_out:
        out.append(Verdict("image-build", "FAIL", f"the default VPC {vpc} of {spec.region} has no route to an "
                                                  f"internet gateway (or NAT) for its default subnets, and {what} "
                                                  f"downloads the driver, CUDA and packages: route 0.0.0.0/0 of their "
                                                  f"route table to an internet gateway, with public addresses on "
                                                  f"launch"))
    else:
        out.append(Verdict("image-build", "ok", f"default VPC {vpc}: its default subnets route to the internet"))
    return out


def routes_out(route_tables: list[Mapping], subnets: list[Mapping]) -> bool:
    """Whether an instance in one of the default ``subnets`` (DescribeSubnets items) reaches the internet: its route
    table (the subnet's own, else the VPC's main one; DescribeRouteTables items) sends 0.0.0.0/0 to a NAT gateway, or
    to an internet gateway while the subnet gives the instance a public address ("MapPublicIpOnLaunch", which default
    subnets have: https://docs.aws.amazon.com/vpc/latest/userguide/default-vpc.html, "Default subnets")."""
    main = next((t for t in route_tables if any(a.get("Main") for a in t.get("Associations", []))), None)
    for subnet in subnets:
        sid = subnet.get("SubnetId")
        table = next((t for t in route_tables if any(a.get("SubnetId") == sid for a in t.get("Associations", []))),
                     main)
        for r in (table or {}).get("Routes", []):
            if r.get("DestinationCidrBlock") != "0.0.0.0/0" or r.get("State", "active") != "active":
                continue
            if str(r.get("NatGatewayId", "")).startswith("nat-"):
                return True
            if str(r.get("GatewayId", "")).startswith("igw-") and subnet.get("MapPublicIpOnLaunch"):
                return True
    return False
