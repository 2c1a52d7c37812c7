"""The boto3 shell of `launch preflight`: read-only AWS calls that fill :class:`launcher.plans.preflight.Facts`.

Nothing here decides. A call AWS refuses (AccessDenied, throttling, an API the region lacks) becomes an
:class:`~launcher.plans.preflight.Unread` fact, so one missing permission costs one check, not the whole preflight;
missing credentials or region still end the command in one line (``launcher.cluster.aws.api.aws_errors``). The IAM
actions used:
ec2:DescribeAvailabilityZones, ec2:DescribeInstanceTypeOfferings, ec2:DescribeCapacityReservations,
ec2:DescribeCapacityBlockOfferings, ec2:DescribeImages, ssm:GetParameter, servicequotas:GetServiceQuota,
servicequotas:GetAWSDefaultServiceQuota, cloudwatch:GetMetricStatistics, ec2:DescribeNetworkInterfaces; with no
image yet also ec2:DescribeInstanceTypes, ec2:DescribeVpcs, ec2:DescribeSubnets, ec2:DescribeRouteTables.
"""

from __future__ import annotations

import datetime as dt
import shutil
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import boto3
from botocore.exceptions import ClientError

from infra.spec import ClusterSpec
from launcher.cluster.aws.api import aws_errors
from launcher.plans import preflight, preflight_limits
from launcher.plans.preflight import Facts, ImageFacts, Quota, Unread
from launcher.plans.preflight_limits import BuildFacts, InterfaceFacts

__all__ = ["gather", "read_block_offerings", "read_build", "read_image", "read_interfaces", "read_offerings",
           "read_quota", "read_reservation"]

T = TypeVar("T")


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _unread(e: ClientError) -> Unread:
    err = e.response.get("Error", {})
    return Unread(f"{err.get('Code', 'error')}: {str(err.get('Message', e)).splitlines()[0]}")


def _read(fetch: Callable[[], T]) -> T | Unread:
    try:
        return fetch()
    except ClientError as e:
        return _unread(e)


def read_offerings(ec2: Any, instance_types: list[str]) -> tuple[tuple[str, ...], dict[str, frozenset[str]]]:
    """The region's AZs, and for each type the AZs that offer it (LocationType availability-zone)."""
    zones = ec2.describe_availability_zones(Filters=[{"Name": "zone-type", "Values": ["availability-zone"]}])
    offered: dict[str, set[str]] = {t: set() for t in instance_types}
    pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
        LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": instance_types}])
    for page in pages:
        for o in page["InstanceTypeOfferings"]:
            offered.setdefault(o["InstanceType"], set()).add(o["Location"])
    return (tuple(sorted(z["ZoneName"] for z in zones["AvailabilityZones"])),
            {t: frozenset(azs) for t, azs in offered.items()})


def read_quota(sq: Any, cw: Any, code: str, now: dt.datetime, service: str = "ec2") -> Quota:
    """One quota (by default an EC2 vCPU quota): the applied value (else AWS's default), and its usage from the
    quota's own CloudWatch metric (https://docs.aws.amazon.com/servicequotas/latest/userguide/configure-cloudwatch.html)."""
    try:
        q = sq.get_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]
    except ClientError as e:
        # "If the applied quota value is not available for a quota, the quota is not retrieved"
        # (https://docs.aws.amazon.com/servicequotas/2019-06-24/apireference/API_GetServiceQuota.html).
        if _code(e) != "NoSuchResourceException":
            raise
        q = sq.get_aws_default_service_quota(ServiceCode=service, QuotaCode=code)["Quota"]
    return Quota(code=code, name=q.get("QuotaName", code), value=float(q["Value"]),
                 usage=_usage(cw, q.get("UsageMetric") or {}, now))


def _usage(cw: Any, metric: Mapping[str, Any], now: dt.datetime) -> float | None:
    if not (metric.get("MetricNamespace") and metric.get("MetricName")):
        return None
    stat = metric.get("MetricStatisticRecommendation") or "Maximum"
    try:
        points = cw.get_metric_statistics(
            Namespace=metric["MetricNamespace"], MetricName=metric["MetricName"],
            Dimensions=[{"Name": k, "Value": v} for k, v in (metric.get("MetricDimensions") or {}).items()],
            StartTime=now - dt.timedelta(hours=1), EndTime=now, Period=300, Statistics=[stat])["Datapoints"]
    except ClientError:
        return None
    return float(max(points, key=lambda p: p["Timestamp"])[stat]) if points else None


def read_reservation(ec2: Any, reservation_id: str) -> Mapping[str, Any] | None:
    """The reservation as DescribeCapacityReservations shows it; None when the account cannot see it."""
    try:
        found = ec2.describe_capacity_reservations(CapacityReservationIds=[reservation_id])["CapacityReservations"]
    except ClientError as e:
        if _code(e).startswith("InvalidCapacityReservationId"):  # .NotFound, .Malformed
            return None
        raise
    return found[0] if found else None


def read_image(ec2: Any, ssm: Any, ami: str | None, parameter: str | None) -> ImageFacts:
    """``ami``, else the id the image pipeline published in SSM ``parameter``, and what DescribeImages says of it."""
    if ami is None:
        assert parameter is not None
        try:
            ami = ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
        except ClientError as e:
            if _code(e) == "ParameterNotFound":
                return ImageFacts(ami=None, parameter=parameter)
            raise
    try:
        images = ec2.describe_images(ImageIds=[ami])["Images"]
    except ClientError as e:
        if _code(e).startswith("InvalidAMIID"):  # .NotFound, .Malformed, .Unavailable
            images = []
        else:
            raise
    return ImageFacts(ami=ami, parameter=parameter, image=images[0] if images else None)


def read_block_offerings(ec2: Any, spec: ClusterSpec) -> list[Mapping[str, Any]]:
    return ec2.describe_capacity_block_offerings(
        InstanceType=spec.instance_type, InstanceCount=spec.nodes,
        CapacityDurationHours=preflight.block_duration_hours(spec.ttl_hours))["CapacityBlockOfferings"]


def read_interfaces(ec2: Any, sq: Any, cw: Any, now: dt.datetime) -> Quota:
    """The Region's network-interface quota, with the interfaces that exist now as its usage (counted, every page)."""
    code, _ = preflight_limits.INTERFACE_QUOTA
    q = read_quota(sq, cw, code, now, service="vpc")
    count = sum(len(page["NetworkInterfaces"])
                for page in ec2.get_paginator("describe_network_interfaces").paginate())
    return Quota(code=q.code, name=q.name, value=q.value, usage=float(count))


def read_build(ec2: Any, sq: Any, cw: Any, now: dt.datetime) -> BuildFacts:
    """What the image build needs: its type's vCPUs and quota, the default VPC and whether it routes out."""
    itypes = preflight_limits.IMAGE_BUILD_TYPES
    vcpus = _read(lambda: max(int(t["VCpuInfo"]["DefaultVCpus"])
                              for t in ec2.describe_instance_types(InstanceTypes=list(itypes))["InstanceTypes"]))
    code = preflight_limits.build_quota_class(itypes[0]).on_demand[0]
    quota = _read(lambda: read_quota(sq, cw, code, now))

    def network() -> tuple[str | None, bool]:
        vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            return None, False
        vpc = vpcs[0]["VpcId"]
        subnets = ec2.describe_subnets(Filters=[{"Name": "vpc-id", "Values": [vpc]},
                                                {"Name": "default-for-az", "Values": ["true"]}])["Subnets"]
        tables = ec2.describe_route_tables(Filters=[{"Name": "vpc-id", "Values": [vpc]}])["RouteTables"]
        return vpc, preflight_limits.routes_out(tables, subnets)

    found = _read(network)
    vpc, out = (found, False) if isinstance(found, Unread) else found
    return BuildFacts(instance_types=itypes, vcpus=vcpus, quota=quota, default_vpc=vpc, routes_out=out)


def gather(sess: boto3.Session, spec: ClusterSpec, *, now: dt.datetime | None = None) -> Facts:
    """Every fact the checks need, from the spec's region, read-only."""
    now = now or dt.datetime.now(dt.timezone.utc)
    with aws_errors(f"preflight in {spec.region}"):
        ec2, ssm = sess.client("ec2"), sess.client("ssm")
        sq, cw = sess.client("service-quotas"), sess.client("cloudwatch")
        types = sorted({n.instance.name for n in preflight.needs(spec)})
        offerings = _read(lambda: read_offerings(ec2, types))
        zones, offered = (offerings, offerings) if isinstance(offerings, Unread) else offerings
        quotas = {code: _read(lambda code=code: read_quota(sq, cw, code, now)) for code in preflight.quota_codes(spec)}
        crid = spec.capacity_reservation_id
        reservation = _read(lambda: read_reservation(ec2, crid)) if crid else None
        image = _read(lambda: read_image(ec2, ssm, spec.ami, spec.image_parameter))
        if isinstance(image, Unread):
            image = ImageFacts(ami=spec.ami, parameter=spec.image_parameter, unread=image)
        blocks = _read(lambda: read_block_offerings(ec2, spec)) if preflight.wants_block_offerings(spec) else None
        interfaces = InterfaceFacts(_read(lambda: read_interfaces(ec2, sq, cw, now)))
        # The pipeline's image is missing or gone: it must be built first, so say whether the build can run.
        unbuilt = image.unread is None and image.parameter is not None and (image.ami is None or image.image is None)
        build = read_build(ec2, sq, cw, now) if unbuilt else None
    return Facts(region=spec.region, zones=zones, offered=offered, quotas=quotas, image=image,
                 reservation=reservation, block_offerings=blocks, now=now, interfaces=interfaces, build=build,
                 ssm_plugin=shutil.which(preflight.SSM_PLUGIN))
