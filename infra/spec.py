"""The one validated description of a cluster, built once from CDK context in ``infra/app.py``.

Context values arrive as strings from ``cdk synth -c key=value`` and as JSON values from ``cdk.json``;
pydantic coerces both ("8" -> 8, "true" -> True). Bad input raises :class:`SpecError` with one line
naming the key, the value and what is allowed. Constructs receive this spec (or parts of it) as typed
props and never read context themselves.

Every decision derived from the context (which interfaces a node gets, how reducers talk to workers, the
FSx size, the BeeGFS roles) is a property here or a function in :mod:`infra.layout`, so the stack and the
launcher read the same answer.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra import catalog, layout

__all__ = ["CONTEXT_KEYS", "FSX_DEFAULT_CAPACITY_GIB", "TCP_ONLY_EFA_FAMILIES", "ClusterSpec", "SpecError"]

# AWS: EFA traffic between P4d/P4de/P5/P5en and instances of other families is not supported, so
# reducers beside these workers use TCP even when both types have EFA.
TCP_ONLY_EFA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5en"})

_CLUSTER_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{0,31}")
_REGION = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
_AZ = re.compile(r"[a-z]{2}(-[a-z]+)+-\d[a-z]")
_AMI = re.compile(r"ami-(?:[0-9a-f]{8}|[0-9a-f]{17})")
_CAPACITY_RESERVATION = re.compile(r"cr-[0-9a-f]{17}")
# S3 bucket naming rules (general purpose buckets): 3-63 characters, lowercase letters, digits, dots and
# hyphens, beginning and ending with a letter or digit, no two adjacent dots, not shaped like an IP address.
_BUCKET = re.compile(r"(?!\d+\.\d+\.\d+\.\d+$)(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_PLACEMENT_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")

# FSx for Lustre SCRATCH_2 sizes: 1.2 TiB or a multiple of 2.4 TiB
# (https://docs.aws.amazon.com/fsx/latest/APIReference/API_CreateFileSystem.html, StorageCapacity).
FSX_DEFAULT_CAPACITY_GIB = 1200
_FSX_INCREMENT_GIB = 2400
# The cost guard: a deploy takes longer than 15 minutes, and a guard set months ahead guards nothing.
_TTL_MIN_HOURS, _TTL_MAX_HOURS = 0.25, 720


class SpecError(ValueError):
    """A context value that cannot describe a cluster; the message is one line."""


def _catalog_entry(name: str) -> catalog.InstanceType:
    try:
        return catalog.get(name)
    except catalog.UnknownInstanceType:
        raise ValueError(f"not in the instance catalog; allowed: {', '.join(catalog.names())}") from None


class ClusterSpec(BaseModel):
    """What ``cdk synth`` builds; every field is a context key of the same name."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cluster_name: str = Field(description="stack name and tag value; CloudFormation-safe")
    region: str = Field(default="us-east-1", description="AWS region of the stack")
    instance_type: str = Field(description="worker instance type; a catalog entry with GPUs")
    nodes: int = Field(ge=1, description="worker nodes")
    reducers: int = Field(default=0, ge=0, description="CPU reducer nodes beside the workers")
    reducer_type: str = Field(default="c5n.18xlarge", description="reducer instance type; a CPU catalog entry")
    storage: Literal["fsx", "beegfs", "none"] = "none"
    fsx_capacity_gib: int | None = Field(default=None, description="FSx for Lustre size; None = 1200 with fsx")
    data_bucket: str | None = Field(default=None, description="S3 bucket nodes may read; FSx imports from it")
    efa: bool | None = Field(default=None, description="EFA on the workers; None = whenever the type has it")
    spot: bool = False
    capacity_reservation_id: str | None = None
    placement_group: str | None = Field(
        default=None, description="existing cluster placement group (e.g. the one a reservation lives in)"
    )
    ttl_hours: float = Field(default=24, description="hours until the cost guard deletes the stack")
    ssh_cidr: str | None = Field(default=None, description="IPv4 CIDR allowed to SSH in; None = no SSH ingress")
    az: str | None = Field(default=None, description="availability zone; None = the region's first, at deploy")
    ami: str | None = Field(default=None, description="AMI id; None = the Deep Learning Base AMI at deploy")
    root_device: Literal["/dev/sda1", "/dev/xvda"] = Field(
        default="/dev/sda1", description="the image's root device name (Ubuntu: /dev/sda1, Amazon Linux: /dev/xvda)"
    )

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

    @field_validator("fsx_capacity_gib")
    @classmethod
    def _fsx_capacity_gib(cls, value: int | None) -> int | None:
        if value is not None and value != FSX_DEFAULT_CAPACITY_GIB and (value <= 0 or value % _FSX_INCREMENT_GIB):
            raise ValueError(
                f"allowed: {FSX_DEFAULT_CAPACITY_GIB} or a multiple of {_FSX_INCREMENT_GIB} GiB "
                "(1200, 2400, 4800, 7200, ...)"
            )
        return value

    @field_validator("data_bucket")
    @classmethod
    def _data_bucket(cls, value: str | None) -> str | None:
        if value is not None and not _BUCKET.fullmatch(value):
            raise ValueError("allowed: an S3 bucket name such as my-imagenet-shards (no s3:// prefix, no path)")
        return value

    @field_validator("placement_group")
    @classmethod
    def _placement_group(cls, value: str | None) -> str | None:
        if value is not None and not _PLACEMENT_GROUP.fullmatch(value):
            raise ValueError("allowed: a placement group name (letters, digits, '.', '_', '-')")
        return value

    @field_validator("ttl_hours")
    @classmethod
    def _ttl_hours(cls, value: float) -> float:
        if not _TTL_MIN_HOURS <= value <= _TTL_MAX_HOURS:
            raise ValueError(f"allowed: {_TTL_MIN_HOURS} to {_TTL_MAX_HOURS} hours; the launcher can extend it")
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
        if self.efa and not self.worker.has_efa:
            efa_types = ", ".join(t.name for t in catalog.gpu_types() if t.has_efa)
            raise _CrossFieldError(
                "efa",
                self.efa,
                f"{self.instance_type} has no EFA; allowed: false, or an instance_type with EFA: {efa_types}",
            )
        if self.fsx_capacity_gib is not None and self.storage != "fsx":
            raise _CrossFieldError("fsx_capacity_gib", self.fsx_capacity_gib, "allowed only with storage=fsx")
        if self.ami is None and self.worker.needs_proprietary_driver:
            raise _CrossFieldError(
                "ami",
                None,
                f"required for instance_type={self.instance_type!r}: its {self.worker.gpu_model} GPUs need NVIDIA's "
                "proprietary driver, which the default Deep Learning Base OSS AMI lacks; allowed: an AMI id with it, "
                "e.g. the Deep Learning Base Proprietary Nvidia Driver AMI",
            )
        return self

    # --- Derived facts, all from the catalog -----------------------------------------------------

    @property
    def worker(self) -> catalog.InstanceType:
        return catalog.get(self.instance_type)

    @property
    def reducer(self) -> catalog.InstanceType:
        return catalog.get(self.reducer_type)

    @property
    def worker_efa(self) -> bool:
        """Whether workers get EFA interfaces: ``efa`` if given, else whenever the type has EFA."""
        return self.worker.has_efa if self.efa is None else self.efa

    @property
    def worker_interfaces(self) -> tuple[layout.Interface, ...]:
        return layout.interfaces(self.worker, efa=self.worker_efa)

    @property
    def efa_devices_per_node(self) -> int:
        """EFA devices per worker: one per EFA network card; 0 means plain TCP networking."""
        return layout.efa_device_count(self.worker_interfaces)

    @property
    def reducer_transport(self) -> Literal["tcp", "efa"]:
        """How reducers talk to workers: EFA only if both use it and the worker family allows it.

        AWS does not support EFA traffic between P4d/P4de/P5/P5en and other families, so reducers beside
        those workers use TCP even though both have EFA.
        """
        if self.worker.family in TCP_ONLY_EFA_FAMILIES or not (self.worker_efa and self.reducer.has_efa):
            return "tcp"
        return "efa"

    @property
    def reducer_interfaces(self) -> tuple[layout.Interface, ...]:
        return layout.interfaces(self.reducer, efa=self.reducer_transport == "efa")

    @property
    def fsx_capacity(self) -> int | None:
        """FSx for Lustre size in GiB with storage=fsx, else None."""
        if self.storage != "fsx":
            return None
        return self.fsx_capacity_gib or FSX_DEFAULT_CAPACITY_GIB

    @property
    def beegfs(self) -> dict[str, object] | None:
        """The BeeGFS roles and RAM-disk size the launcher sets up with storage=beegfs, else None."""
        return layout.beegfs_layout(self.worker, reducers=self.reducers) if self.storage == "beegfs" else None

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
    """A value that is wrong only together with another key; ``value=None`` means the key was not given."""

    def __init__(self, key: str, value: object, allowed: str) -> None:
        self.key, self.value, self.allowed = key, value, allowed
        super().__init__(self.line())

    def line(self) -> str:
        return f"{self.key}: {self.allowed}" if self.value is None else f"{self.key}={self.value!r}: {self.allowed}"


CONTEXT_KEYS: tuple[str, ...] = tuple(ClusterSpec.model_fields)


def _one_line(exc: ValidationError, values: Mapping[str, Any]) -> str:
    error = exc.errors(include_url=False)[0]
    key = str(error["loc"][0]) if error["loc"] else "context"
    if error["type"] == "missing":
        return f"{key}: missing; set it with -c {key}=VALUE"
    if isinstance(error.get("ctx", {}).get("error"), _CrossFieldError):
        return error["ctx"]["error"].line()
    message = str(error["msg"]).removeprefix("Value error, ")
    message = message[0].lower() + message[1:] if message else message
    return f"{key}={values.get(key)!r}: {message}"
