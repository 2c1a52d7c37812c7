"""The one validated description of a cluster, built once from CDK context in ``infra/app.py``.

Context values arrive as strings from ``cdk synth -c key=value`` and as JSON values from ``cdk.json``;
pydantic coerces both ("8" -> 8, "true" -> True). Bad input raises :class:`SpecError` with one line
naming the key, the value and what is allowed. Constructs receive this spec (or parts of it) as typed
props and never read context themselves.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra import catalog

__all__ = ["CONTEXT_KEYS", "TCP_ONLY_EFA_FAMILIES", "ClusterSpec", "SpecError"]

# AWS: EFA traffic between P4d/P4de/P5/P5en and instances of other families is not supported, so
# reducers beside these workers use TCP even when both types have EFA.
TCP_ONLY_EFA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5en"})

_CLUSTER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
_AZ = re.compile(r"[a-z]{2}(-[a-z]+)+-\d[a-z]")
_AMI = re.compile(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_CAPACITY_RESERVATION = re.compile(r"cr-[0-9a-f]{17}")


class SpecError(ValueError):
    """A context value that cannot describe a cluster; the message is one line."""


def _catalog_entry(name: str) -> catalog.InstanceType:
    try:
        return catalog.get(name)
    except catalog.UnknownInstanceType:
        raise ValueError(f"not in the instance catalog; allowed: {', '.join(catalog.names())}") from None


class ClusterSpec(BaseModel):
    """What ``cdk synth`` builds. Keys later slices use (storage, reducers, ttl_hours) are validated now."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster_name: str = Field(description="stack name and tag value; CloudFormation-safe")
    region: str = Field(default="us-east-1", description="AWS region of the stack")
    instance_type: str = Field(description="worker instance type; a catalog entry with GPUs")
    nodes: int = Field(ge=1, description="worker nodes")
    reducers: int = Field(default=0, ge=0, description="CPU reducer nodes (a later slice builds them)")
    reducer_type: str = Field(default="c5n.18xlarge", description="reducer instance type; a CPU catalog entry")
    storage: Literal["fsx", "beegfs", "none"] = "none"
    spot: bool = False
    ttl_hours: float = Field(default=24, gt=0, description="hours until the cost guard deletes the stack")
    ssh_cidr: str | None = Field(default=None, description="IPv4 CIDR allowed to SSH in; None = no SSH ingress")
    az: str | None = Field(default=None, description="availability zone; None = the region's first, at deploy")
    ami: str | None = Field(default=None, description="AMI id; None = the Deep Learning Base AMI at deploy")
    capacity_reservation_id: str | None = None

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        if not _CLUSTER_NAME.fullmatch(value):
            raise ValueError("allowed: a letter, then up to 31 letters, digits or hyphens")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION.fullmatch(value):
            raise ValueError("allowed: an AWS region name such as us-east-1")
        return value

    @field_validator("instance_type")
    @classmethod
    def _instance_type(cls, value: str) -> str:
        entry = _catalog_entry(value)
        if entry.gpus == 0:
            gpu_names = ", ".join(t.name for t in catalog.gpu_types())
            raise ValueError(f"has no GPUs; allowed: {gpu_names}")
        return entry.name

    @field_validator("reducer_type")
    @classmethod
    def _reducer_type(cls, value: str) -> str:
        entry = _catalog_entry(value)
        if entry.gpus > 0:
            cpu_names = ", ".join(n for n in catalog.names() if catalog.get(n).gpus == 0)
            raise ValueError(f"has GPUs; reducers are CPU nodes, allowed: {cpu_names}")
        return entry.name

    @field_validator("ssh_cidr")
    @classmethod
    def _ssh_cidr(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            network = ipaddress.IPv4Network(value, strict=True)
        except ValueError:
            raise ValueError("allowed: an IPv4 CIDR such as 203.0.113.0/24") from None
        if network.prefixlen == 0:
            raise ValueError("allowed: a narrower IPv4 CIDR than the whole internet")
        return str(network)

    @field_validator("az")
    @classmethod
    def _az(cls, value: str | None) -> str | None:
        if value is not None and not _AZ.fullmatch(value):
            raise ValueError("allowed: an availability zone name such as us-east-1a")
        return value

    @field_validator("ami")
    @classmethod
    def _ami(cls, value: str | None) -> str | None:
        if value is not None and not _AMI.fullmatch(value):
            raise ValueError("allowed: an AMI id such as ami-0123456789abcdef0")
        return value

    @field_validator("capacity_reservation_id")
    @classmethod
    def _capacity_reservation_id(cls, value: str | None) -> str | None:
        if value is not None and not _CAPACITY_RESERVATION.fullmatch(value):
            raise ValueError("allowed: a capacity reservation id such as cr-0123456789abcdef0")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> ClusterSpec:
        if self.az is not None and not self.az.startswith(self.region):
            raise _CrossFieldError("az", self.az, f"allowed: an availability zone of region {self.region}")
        if self.spot and self.capacity_reservation_id is not None:
            raise _CrossFieldError("spot", self.spot, "allowed: false when capacity_reservation_id is given")
        return self

    # --- Derived facts, all from the catalog -----------------------------------------------------

    @property
    def worker(self) -> catalog.InstanceType:
        return catalog.get(self.instance_type)

    @property
    def reducer(self) -> catalog.InstanceType:
        return catalog.get(self.reducer_type)

    @property
    def efa_devices_per_node(self) -> int:
        """EFA interfaces per worker: one per EFA network card; 0 means plain TCP networking."""
        return self.worker.efa_cards

    @property
    def reducer_transport(self) -> Literal["tcp", "efa"]:
        """How reducers talk to workers: EFA only if both have it and the worker family allows it."""
        if self.worker.family in TCP_ONLY_EFA_FAMILIES or not (self.worker.has_efa and self.reducer.has_efa):
            return "tcp"
        return "efa"

    # --- Construction from CDK context -----------------------------------------------------------

    @classmethod
    def from_context(cls, context: Mapping[str, Any]) -> ClusterSpec:
        """The spec for the known keys of ``context``; :class:`SpecError` (one line) if any is invalid.

        Keys CDK itself keeps in context (feature flags) are ignored; an empty string means "not given".
        """
        values = {key: context[key] for key in CONTEXT_KEYS if key in context and context[key] not in ("", None)}
        try:
            return cls(**values)
        except ValidationError as exc:
            raise SpecError(_one_line(exc, values)) from None


class _CrossFieldError(ValueError):
    def __init__(self, key: str, value: object, allowed: str) -> None:
        super().__init__(f"{key}={value!r}: {allowed}")
        self.key, self.value, self.allowed = key, value, allowed


CONTEXT_KEYS: tuple[str, ...] = tuple(ClusterSpec.model_fields)


def _one_line(exc: ValidationError, values: Mapping[str, Any]) -> str:
    error = exc.errors(include_url=False)[0]
    key = str(error["loc"][0]) if error["loc"] else "context"
    if error["type"] == "missing":
        return f"{key}: missing; set it with -c {key}=VALUE"
    if isinstance(error.get("ctx", {}).get("error"), _CrossFieldError):
        cross = error["ctx"]["error"]
        return f"{cross.key}={cross.value!r}: {cross.allowed}"
    message = str(error["msg"]).removeprefix("Value error, ")
    message = message[0].lower() + message[1:] if message else message
    return f"{key}={values.get(key)!r}: {message}"
