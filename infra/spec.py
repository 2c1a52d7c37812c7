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

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from ami import paths
from infra import catalog, layout

# The Slurm head node every stack launches (infra/head.py), on-demand: the controller of a few hundred dynamic nodes
# needs little, two vCPUs and 8 GiB. A general-purpose type, not a burstable one: a T instance out of CPU credits
# would answer late, and slurmctld marks a node DOWN that it has not heard from within SlurmdTimeout
# (launcher/plans/slurm.py). Here, beside the spec, so preflight counts it without the CDK's modules.
HEAD_INSTANCE_TYPE = "m5.large"

__all__ = [
    "CAPACITY_BLOCK_TYPES",
    "CDK_OWN_KEYS",
    "CHECKPOINT_PREFIX_DEFAULT",
    "CONTEXT_KEYS",
    "FSX_DEFAULT_CAPACITY_GIB",
    "IMAGE_BUILD_COMMAND",
    "READ_KEYS",
    "REMOVED_KEYS",
    "TCP_ONLY_EFA_FAMILIES",
    "ClusterSpec",
    "SpecError",
    "is_cdk_key",
    "unknown_context_keys",
    "unknown_key_line",
]

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
# A key prefix for checkpoints, without leading or trailing '/': segments of the characters S3 calls safe in object
# keys (https://docs.aws.amazon.com/AmazonS3/latest/userguide/object-keys.html, "Safe characters") less '!', '*',
# "'", '(' and ')'. It becomes part of an IAM resource ARN and an s3:prefix condition, where '*' and '?' are
# wildcards and '${...}' a policy variable (https://docs.aws.amazon.com/IAM/latest/UserGuide/reference_policies_elements_resource.html,
# "Including wildcard characters in the resource ARN"), so those could only widen or break the grant.
_KEY_PREFIX = re.compile(r"(?!.*(?:^|/)\.{1,2}(?:/|$))[A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*")
CHECKPOINT_PREFIX_DEFAULT = "scaletrain-checkpoints"
# A KMS key ARN (single- or multi-Region key: https://docs.aws.amazon.com/kms/latest/developerguide/concepts.html#key-id).
_KMS_KEY_ARN = re.compile(r"arn:aws[a-z-]*:kms:[a-z]{2}(-[a-z]+)+-\d:\d{12}:key/"
                          r"([0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}|mrk-[0-9a-f]{32})")
_PLACEMENT_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")

# FSx for Lustre SCRATCH_2 sizes: 1.2 TiB or a multiple of 2.4 TiB
# (https://docs.aws.amazon.com/fsx/latest/APIReference/API_CreateFileSystem.html, StorageCapacity).
FSX_DEFAULT_CAPACITY_GIB = 1200
_FSX_INCREMENT_GIB = 2400
# The cost guard: a deploy takes longer than 15 minutes, and a guard set months ahead guards nothing.
_TTL_MIN_HOURS, _TTL_MAX_HOURS = 0.25, 720
# Idle autostop: the guard reads the nodes' CPU from CloudWatch in 5-minute periods (infra.ttl.IDLE_PERIOD_S), so
# less than three periods would decide on one or two datapoints; past a day the TTL is the better tool.
_IDLE_MIN_MINUTES, _IDLE_MAX_MINUTES = 15, 1440
# gp3 volumes are 1 GiB to 16 TiB (https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html, gp3).
_ROOT_VOLUME_MIN_GIB, _ROOT_VOLUME_MAX_GIB = 8, 16384
# Types of the catalog EC2 sells as Capacity Blocks for ML
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-capacity-blocks.html, "Supported instance types and
# Regions"; which Region offers which is the launcher's preflight to check).
CAPACITY_BLOCK_TYPES = frozenset({"p4d.24xlarge", "p5.48xlarge", "p5en.48xlarge"})

# What builds and publishes the default image (ami/stack.py); the stack's image parameter and the errors name it.
IMAGE_BUILD_COMMAND = 'npx cdk deploy --app ".venv/bin/python ami/app.py"'

# Context keys that once existed, with the one line a user who still passes them gets.
REMOVED_KEYS: dict[str, str] = {
    "ssh_cidr": "removed: the cluster's VPC has no internet gateway, so nothing outside it can reach port 22 "
    "whatever the security group allows; nodes are reached through SSM Session Manager (launch ssh, launch exec), "
    "leave ssh_cidr out",
}


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
    nodes: int = Field(description=f"worker nodes, 1 to {catalog.MAX_NODES}")
    reducers: int = Field(default=0, description=f"CPU reducer nodes beside the workers, 0 to {catalog.MAX_NODES}")
    reducer_type: str = Field(default="c5n.18xlarge", description="reducer instance type; a CPU catalog entry")
    storage: Literal["fsx", "beegfs", "none"] = "none"
    fsx_capacity_gib: int | None = Field(default=None, description="FSx for Lustre size; None = 1200 with fsx")
    data_bucket: str | None = Field(default=None, description="S3 bucket nodes may read; FSx imports from it")
    checkpoint_bucket: str | None = Field(
        default=None, description="S3 bucket nodes may write checkpoints to, under checkpoint_prefix only"
    )
    checkpoint_prefix: str = Field(
        default=CHECKPOINT_PREFIX_DEFAULT, description="key prefix in checkpoint_bucket the nodes may write under"
    )
    checkpoint_kms_key: str | None = Field(
        default=None,
        description="ARN of the customer-managed KMS key checkpoint_bucket encrypts with (SSE-KMS); the nodes may use "
        "it through S3 only",
    )
    efa: bool | None = Field(default=None, description="EFA on the workers; None = whenever the type has it")
    spot: bool = False
    capacity_reservation_id: str | None = Field(default=None, description="cr-... the workers launch into; needs az")
    capacity_block: bool = Field(
        default=False, description="capacity_reservation_id is a Capacity Block for ML (market type capacity-block)"
    )
    placement_group: str | None = Field(
        default=None, description="existing cluster placement group (e.g. the one a reservation lives in)"
    )
    ttl_hours: float = Field(default=24, description="hours until the cost guard deletes the stack")
    idle_minutes: int | None = Field(
        default=None, description="delete the stack once every node has been idle this long; None = only the TTL"
    )
    az: str | None = Field(default=None, description="availability zone; None = the region's first, at deploy")
    ami: str | None = Field(
        default=None, description="AMI id; None = the project's image (ami/), resolved from image_parameter at deploy"
    )
    root_volume_gib: int | None = Field(
        default=None, description="root volume size; None = the image's own (its snapshot's) size"
    )
    root_device: Literal["/dev/sda1", "/dev/xvda"] = Field(
        default="/dev/sda1", description="the image's root device name (Ubuntu: /dev/sda1, Amazon Linux: /dev/xvda)"
    )

    @field_validator("cluster_name")
    @classmethod
    def _cluster_name(cls, value: str) -> str:
        if not _CLUSTER_NAME.fullmatch(value):
            raise ValueError("allowed: a letter, then up to 31 letters, digits or hyphens")
        return value

    @field_validator("nodes", "reducers")
    @classmethod
    def _nodes(cls, value: int, info: ValidationInfo) -> int:
        role = "worker" if info.field_name == "nodes" else "reducer"
        if problem := catalog.nodes_allowed(value, role):  # the one limit `launch plan` and `launch cost` keep too
            raise ValueError(problem)
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

    @field_validator("checkpoint_bucket")
    @classmethod
    def _checkpoint_bucket(cls, value: str | None) -> str | None:
        if value is not None and not _BUCKET.fullmatch(value):
            raise ValueError("allowed: an S3 bucket name such as my-checkpoints (no s3:// prefix, no path)")
        return value

    @field_validator("checkpoint_kms_key")
    @classmethod
    def _checkpoint_kms_key(cls, value: str | None) -> str | None:
        # An IAM policy names a KMS key by its key ARN; an alias ARN in a policy's Resource does not authorize use of
        # the key it points to (https://docs.aws.amazon.com/kms/latest/developerguide/cmks-in-iam-policies.html).
        if value is not None and not _KMS_KEY_ARN.fullmatch(value):
            raise ValueError(
                "allowed: a KMS key ARN such as arn:aws:kms:us-east-1:123456789012:key/"
                "1234abcd-12ab-34cd-56ef-1234567890ab (not an alias; `aws kms describe-key --key-id alias/NAME` "
                "shows the key's Arn)"
            )
        return value

    @field_validator("checkpoint_prefix")
    @classmethod
    def _checkpoint_prefix(cls, value: str) -> str:
        if not _KEY_PREFIX.fullmatch(value):
            raise ValueError(
                "allowed: a key prefix such as team/checkpoints: '/'-separated segments of letters, digits, '.', '_' "
                "or '-', no leading or trailing '/', no '.' or '..' segment"
            )
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

    @field_validator("idle_minutes")
    @classmethod
    def _idle_minutes(cls, value: int | None) -> int | None:
        if value is not None and not _IDLE_MIN_MINUTES <= value <= _IDLE_MAX_MINUTES:
            raise ValueError(
                f"allowed: {_IDLE_MIN_MINUTES} to {_IDLE_MAX_MINUTES} minutes (CloudWatch reports the nodes' CPU in "
                "5-minute periods); leave it out to rely on ttl_hours alone"
            )
        return value

    @field_validator("root_volume_gib")
    @classmethod
    def _root_volume_gib(cls, value: int | None) -> int | None:
        if value is not None and not _ROOT_VOLUME_MIN_GIB <= value <= _ROOT_VOLUME_MAX_GIB:
            raise ValueError(
                f"allowed: {_ROOT_VOLUME_MIN_GIB} to {_ROOT_VOLUME_MAX_GIB} GiB (gp3), and at least the image's own "
                "root size; leave it out to use the image's"
            )
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
        if self.capacity_block:
            self._check_capacity_block()
        if self.spot and self.capacity_reservation_id is not None:
            raise _CrossFieldError("spot", self.spot, "allowed: false when capacity_reservation_id is given")
        if self.capacity_reservation_id is not None and self.az is None:
            # A reservation (and a Capacity Block) holds capacity in one AZ, and an instance uses it only when it
            # launches in that AZ (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-reservations-launch.html;
            # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html, "Requirements");
            # without `az` the subnet lands in the region's first AZ, whichever that is.
            raise _CrossFieldError(
                "az",
                None,
                f"required with capacity_reservation_id={self.capacity_reservation_id!r}: the reservation holds "
                "capacity in one availability zone and the subnet must be there; set -c az=<its zone> (aws ec2 "
                "describe-capacity-reservations --capacity-reservation-ids ... shows AvailabilityZone)",
            )
        if self.efa and not self.worker.has_efa:
            efa_types = ", ".join(t.name for t in catalog.gpu_types() if t.has_efa)
            raise _CrossFieldError(
                "efa",
                self.efa,
                f"{self.instance_type} has no EFA; allowed: false, or an instance_type with EFA: {efa_types}",
            )
        if self.idle_minutes is not None and self.idle_minutes >= self.ttl_hours * 60:
            raise _CrossFieldError(
                "idle_minutes",
                self.idle_minutes,
                f"allowed: less than ttl_hours={self.ttl_hours:g} ({self.ttl_hours * 60:g} minutes), which deletes "
                "the stack first anyway",
            )
        if "checkpoint_prefix" in self.model_fields_set and self.checkpoint_bucket is None:
            raise _CrossFieldError("checkpoint_prefix", self.checkpoint_prefix, "allowed only with checkpoint_bucket")
        if self.checkpoint_kms_key is not None and self.checkpoint_bucket is None:
            raise _CrossFieldError("checkpoint_kms_key", self.checkpoint_kms_key, "allowed only with checkpoint_bucket")
        if self.fsx_capacity_gib is not None and self.storage != "fsx":
            raise _CrossFieldError("fsx_capacity_gib", self.fsx_capacity_gib, "allowed only with storage=fsx")
        return self

    def _check_capacity_block(self) -> None:
        # Capacity Blocks: a launch asks for market type capacity-block and targets the block's reservation id; they
        # are On-Demand-priced, paid ahead, never Spot, and already place their instances close together in an
        # UltraCluster, "so there is no need to use a cluster placement group"
        # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-using.html;
        # https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/capacity-blocks-launch.html).
        if self.capacity_reservation_id is None:
            raise _CrossFieldError(
                "capacity_block", True, "needs capacity_reservation_id=cr-... (the Capacity Block's reservation id)"
            )
        if self.spot:
            raise _CrossFieldError("spot", self.spot, "allowed: false with capacity_block (a block is paid ahead)")
        if self.instance_type not in CAPACITY_BLOCK_TYPES:
            raise _CrossFieldError(
                "capacity_block",
                True,
                f"{self.instance_type} is not sold as Capacity Blocks; allowed: "
                f"{', '.join(sorted(CAPACITY_BLOCK_TYPES))}",
            )
        if self.placement_group is not None:
            raise _CrossFieldError(
                "placement_group",
                self.placement_group,
                "allowed: none with capacity_block (a Capacity Block places its instances together itself)",
            )

    # --- Derived facts, all from the catalog -----------------------------------------------------

    @property
    def image_parameter(self) -> str | None:
        """The SSM parameter the stack resolves the node image from at deploy time; None when ``ami`` names one.

        The project's image (ami/), published there by its pipeline; V100 types resolve the build with NVIDIA's
        proprietary kernel modules (:data:`ami.paths.IMAGE_ID_PARAMETER_PROPRIETARY`), every other type the default.
        """
        if self.ami is not None:
            return None
        return paths.image_id_parameter(self.nvidia_kernel_modules)

    @property
    def nvidia_kernel_modules(self) -> Literal["open", "proprietary"]:
        """The NVIDIA kernel modules the workers' GPUs need: open drives Turing and newer, V100 needs proprietary."""
        return "proprietary" if self.worker.needs_proprietary_driver else "open"

    @property
    def image_build_command(self) -> str:
        """The command that builds the image :attr:`image_parameter` names, in this stack's region."""
        modules = " -c nvidia_kernel_modules=proprietary" if self.nvidia_kernel_modules == "proprietary" else ""
        return f"{IMAGE_BUILD_COMMAND} -c region={self.region}{modules}"

    def root_volume_problem(self, image_root_gib: int) -> str | None:
        """None when the launch template's root volume fits an image whose root snapshot is ``image_root_gib``;
        else the one line to show (EC2 refuses a volume smaller than its snapshot:
        https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_EbsBlockDevice.html, VolumeSize)."""
        if self.root_volume_gib is None or self.root_volume_gib >= image_root_gib:
            return None
        return (
            f"root_volume_gib={self.root_volume_gib}: the image's root snapshot is {image_root_gib} GiB and EC2 "
            f"refuses a smaller volume; allowed: {image_root_gib} or more, or leave it out to use the image's size"
        )

    @property
    def checkpoint_location(self) -> str | None:
        """``s3://BUCKET/PREFIX``, where ``launch train --checkpoint-to`` may copy checkpoints (the node role's write
        grant, infra.compute.NodeIdentity); None without ``checkpoint_bucket``."""
        return None if self.checkpoint_bucket is None else f"s3://{self.checkpoint_bucket}/{self.checkpoint_prefix}"

    @property
    def placement(self) -> Literal["new", "given", "none"]:
        """The nodes' cluster placement group: a new one, the user's ``placement_group``, or none (Capacity Blocks)."""
        if self.capacity_block:
            return "none"
        return "new" if self.placement_group is None else "given"

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

        Keys CDK itself keeps in context (feature flags) are ignored; an empty string means "not given". A key of
        :data:`REMOVED_KEYS` that is given is an error saying what replaced it.
        """
        for key, why in REMOVED_KEYS.items():
            if context.get(key) not in ("", None):
                raise SpecError(f"{key}={context[key]!r}: {why}")
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
# What infra/app.py reads from the CDK context: the spec's keys, and the removed ones so that they are refused.
READ_KEYS: tuple[str, ...] = (*CONTEXT_KEYS, *REMOVED_KEYS)

# Keys the CDK puts in an app's context beside the user's ("Context values and the AWS CDK",
# https://docs.aws.amazon.com/cdk/v2/guide/context.html: cdk.json, cdk.context.json, ~/.cdk.json and --context all
# merge into it): feature flags ("@aws-cdk/..."), the CLI's own settings ("aws:cdk:enable-path-metadata",
# "aws:cdk:version-reporting", "aws:cdk:bundling-stacks", as CDK_CONTEXT_JSON carries them), the cache of context
# lookups in cdk.context.json ("availability-zones:account=...:region=...") and the notices `cdk acknowledge`
# hid ("Acknowledgements are saved at a CDK project level",
# https://docs.aws.amazon.com/cdk/v2/guide/ref-cli-cmd-ack.html). None of them is the user's to misspell.
CDK_OWN_KEYS = frozenset({"acknowledged-issue-numbers"})


def is_cdk_key(key: str) -> bool:
    """Whether ``key`` is one the CDK itself keeps in the context (:data:`CDK_OWN_KEYS`, "@..." flags, ":" keys)."""
    return key in CDK_OWN_KEYS or key.startswith("@") or ":" in key


def unknown_context_keys(context: Mapping[str, Any], known: Iterable[str], *,
                         project: Mapping[str, Any] | None = None) -> list[str]:
    """The keys of ``context`` a user gave that the app does not read (``known``), in the context's order.

    `cdk synth -c instance_typ=p5.48xlarge` would otherwise synthesize the default without a word. The CDK's own keys
    (:func:`is_cdk_key`) are never the user's; nor is an entry of ``project`` (cdk.json's ``context``, which both
    apps of the repository receive) that still holds the value cdk.json gives it.
    """
    allowed, project = set(known), project or {}

    def as_given(value: Any) -> str:  # -c values arrive as strings, cdk.json's as JSON values
        return value if isinstance(value, str) else json.dumps(value)

    return [key for key, value in context.items()
            if key not in allowed and not is_cdk_key(key)
            and not (key in project and as_given(value) == as_given(project[key]))]


def unknown_key_line(key: str, value: Any, known: Iterable[str]) -> str:
    """The one line for a context key the app does not read, in the form of the other context errors."""
    return f"{key}={value!r}: unknown context key; allowed: {', '.join(known)}"


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
