"""From a deployed stack to a Cluster: pure functions over what CloudFormation and EC2 report.

launcher.cluster.aws.api fetches (DescribeStacks, DescribeInstances, DescribeImages, GetConsoleOutput); everything that
decides (which outputs matter, which instance is node0, slots, paths) is here and runs without AWS.
Nodes are named in ascending private IPv4 order per role, the order the ``StorageMount`` output's
``ROLE:INDEX`` entries refer to: workers node0..N-1, reducers reducer0..K-1. The Slurm head node (the ``HeadNode``
output, tag scaletrain:role=head) is the Cluster's ``head``, never one of its nodes: it runs no rank.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from ami import paths
from infra import catalog
from launcher.cluster import AwsInfo, Cluster, Node
from launcher.errors import LaunchError

__all__ = ["HEAD_NAME", "LIVE_STATES", "NODE_HOME", "NODE_PYTHON", "NODE_USER", "HeadNode", "Instance", "NodeGroup",
           "StackOutputs", "build_cluster", "head_node", "instances_from_response", "name_nodes", "parse_outputs",
           "software_from_tags"]

NODE_USER = "ubuntu"                              # the Ubuntu images' (and DLAMI's) login user
NODE_HOME = f"/home/{NODE_USER}"
NODE_PYTHON = paths.PYTHON                        # the image's venv (ami/paths.py)
NODE_STATE = f"{NODE_HOME}/.scaletrain/cluster"   # on the nodes: the cluster's ssh_config, key, known_hosts
LIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")
TAG_CLUSTER, TAG_ROLE, TAG_GROUP = "scaletrain:cluster", "scaletrain:role", "aws:autoscaling:groupName"
ROLES = ("worker", "reducer", "head")            # scaletrain:role values (infra/boot.py's HEAD_ROLE is "head")
HEAD_NAME = "head"                               # the head node's Host alias, as on the local cluster
_REQUIRED = ("ClusterName", "InstanceType", "NodeGroups", "Storage", "StorageMount")


class NodeGroup(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    role: Literal["worker", "reducer"]
    group_name: str
    instance_type: str
    nodes: int
    transport: Literal["efa", "tcp"]
    efa_devices: list[dict[str, Any]] = []

    @property
    def efa_device_count(self) -> int:
        """EFA devices a node of this group shows: its interfaces of type efa or efa-only (infra.layout)."""
        return sum(1 for i in self.efa_devices if i.get("interface_type") in ("efa", "efa-only"))


class HeadNode(BaseModel):
    """The ``HeadNode`` output (infra/head.py's description): where the Slurm head node is."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    instance_id: str
    private_ip: str
    host_name: str | None = None
    instance_type: str | None = None
    slurmctld_port: int | None = None


class StackOutputs(BaseModel):
    """The outputs infra/README.md lists, typed."""

    model_config = ConfigDict(frozen=True)

    cluster_name: str
    instance_type: str
    node_groups: list[NodeGroup]
    storage: Literal["fsx", "beegfs", "none"]
    storage_mount: dict[str, Any]
    data_bucket: str | None = None
    ttl_hours: float | None = None
    ttl_expires_at: str | None = None
    ttl_schedule_name: str | None = None
    ttl_schedule_group: str = "default"
    idle_minutes: int | None = None  # -c idle_minutes: the stack deletes itself after this long idle
    head: HeadNode | None = None     # the Slurm head node; None on a stack deployed before it had one

    def group(self, role: str) -> NodeGroup | None:
        return next((g for g in self.node_groups if g.role == role), None)


def parse_outputs(stack: str, outputs: list[dict[str, str]]) -> StackOutputs:
    """DescribeStacks' ``Outputs`` -> :class:`StackOutputs`; a stack that is not scaletrain's is one line."""
    values = {o["OutputKey"]: o["OutputValue"] for o in outputs}
    missing = [k for k in _REQUIRED if k not in values]
    if missing:
        raise LaunchError(f"stack '{stack}' has no output {', '.join(missing)}: not a scaletrain cluster stack "
                          f"(deploy one with `npx cdk deploy -c cluster_name={stack}`)")
    try:
        return StackOutputs(
            cluster_name=values["ClusterName"], instance_type=values["InstanceType"],
            node_groups=json.loads(values["NodeGroups"]), storage=values["Storage"],
            storage_mount=json.loads(values["StorageMount"]),
            data_bucket=None if values.get("DataBucket", "none") == "none" else values["DataBucket"],
            ttl_hours=float(values["TtlHours"]) if "TtlHours" in values else None,
            ttl_expires_at=values.get("TtlExpiresAt"), ttl_schedule_name=values.get("TtlScheduleName"),
            ttl_schedule_group=values.get("TtlScheduleGroup", "default"),
            idle_minutes=None if values.get("IdleMinutes", "none") == "none" else int(values["IdleMinutes"]),
            head=json.loads(values["HeadNode"]) if "HeadNode" in values else None)
    except (ValueError, ValidationError) as e:
        raise LaunchError(f"stack '{stack}' has unreadable outputs ({str(e).splitlines()[0]})") from None


class Instance(BaseModel):
    """One EC2 instance of the cluster, as DescribeInstances reports it."""

    model_config = ConfigDict(frozen=True)

    instance_id: str
    state: str
    private_ip: str | None
    instance_type: str
    role: Literal["worker", "reducer", "head"]
    group_name: str | None
    launch_time: str
    image_id: str


def _iso(value: Any) -> str:
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(value)


def instances_from_response(reservations: list[dict[str, Any]]) -> list[Instance]:
    """Every instance of DescribeInstances' ``Reservations`` with a scaletrain:role tag, in no particular order."""
    found = []
    for res in reservations:
        for i in res.get("Instances", []):
            tags = {t["Key"]: t["Value"] for t in i.get("Tags", [])}
            if tags.get(TAG_ROLE) not in ROLES:
                continue
            found.append(Instance(instance_id=i["InstanceId"], state=i["State"]["Name"],
                                  private_ip=i.get("PrivateIpAddress"), instance_type=i["InstanceType"],
                                  role=tags[TAG_ROLE], group_name=tags.get(TAG_GROUP),
                                  launch_time=_iso(i["LaunchTime"]), image_id=i.get("ImageId", "")))
    return found


def name_nodes(instances: list[Instance]) -> list[tuple[str, Instance]]:
    """(name, instance) for every running or pending instance: per role in ascending private IPv4 order."""
    live = [i for i in instances if i.state in ("pending", "running") and i.private_ip]
    named = []
    for role, prefix in (("worker", "node"), ("reducer", "reducer")):
        ordered = sorted((i for i in live if i.role == role), key=lambda i: ipaddress.IPv4Address(i.private_ip))
        named += [(f"{prefix}{k}", i) for k, i in enumerate(ordered)]
    return named


def software_from_tags(tags: dict[str, str]) -> dict[str, str]:
    """The image's ``scaletrain:*`` tags without the prefix (ami/render.py's ami_tags)."""
    return {k.split(":", 1)[1]: v for k, v in sorted(tags.items()) if k.startswith("scaletrain:")}


def head_node(outputs: StackOutputs, instances: list[Instance], *, stack: str, region: str) -> Node | None:
    """The Slurm head node the ``HeadNode`` output names, as the Cluster's ``head``: role head, no slot, no GPU, the
    catalog's vCPUs; None on a stack without the output (deployed before it had one). Named by the output's instance
    id, not by the tag alone: the tag says what an instance is, the output which instance the stack made."""
    if outputs.head is None:
        return None
    iid = outputs.head.instance_id
    inst = next((i for i in instances if i.role == "head" and i.instance_id == iid
                 and i.state in ("pending", "running") and i.private_ip), None)
    if inst is None:
        # Waiting would never end: a stack's instance stopped or terminated outside CloudFormation stays so, and
        # CloudFormation only reports it as drift when asked (a resource has drifted when its values differ from the
        # template's, "This includes if the property or resource has been deleted":
        # https://docs.aws.amazon.com/AWSCloudFormation/latest/UserGuide/using-cfn-stack-drift.html, "What is drift?").
        raise LaunchError(f"stack '{stack}' in {region}: its Slurm head node {iid} (HeadNode output) is not running; "
                          f"start it if it is stopped (`aws ec2 start-instances --region {region} --instance-ids "
                          f"{iid}`), else delete the stack (`launch down --cluster {stack}`) and deploy it again")
    return Node(name=HEAD_NAME, address=inst.private_ip or "", role="head", slots=0,
                cpus=catalog.get(inst.instance_type).vcpus, workdir=f"{NODE_HOME}/scaletrain",
                instance_id=inst.instance_id, instance_type=inst.instance_type, launched_at=inst.launch_time)


def build_cluster(outputs: StackOutputs, instances: list[Instance], *, stack: str, region: str,
                  profile: str | None, ssh_config: str, known_hosts: str, software: dict[str, str]) -> Cluster:
    """The Cluster the rest of the launcher uses: slots = the catalog's GPUs, reducers hold no training rank; the
    head node apart from the nodes (:func:`head_node`)."""
    nodes = []
    for name, inst in name_nodes(instances):
        entry = catalog.get(inst.instance_type)
        # Transport and EFA devices as the stack gave the node's group (reducers beside P4d/P5 and -c efa=false
        # stacks are on TCP, with no EFA device), never guessed from what the instance type could have.
        group = outputs.group(inst.role)
        efa = group is not None and group.transport == "efa"
        nodes.append(Node(name=name, address=inst.private_ip or "", role=inst.role,
                          slots=entry.gpus if inst.role == "worker" else 0, cpus=entry.vcpus, gpus=entry.gpus,
                          workdir=f"{NODE_HOME}/scaletrain", instance_id=inst.instance_id,
                          instance_type=inst.instance_type, launched_at=inst.launch_time,
                          transport="efa" if efa else "tcp", efa_devices=group.efa_device_count if efa else 0))
    if not any(n.role == "worker" for n in nodes):
        raise LaunchError(f"stack '{stack}' in {region} has no running worker instance (tag "
                          f"{TAG_CLUSTER}={outputs.cluster_name}); its nodes may still be launching or were stopped")
    head = head_node(outputs, instances, stack=stack, region=region)
    info = AwsInfo(stack=stack, region=region, profile=profile,
                   storage=outputs.storage_mount | {"type": outputs.storage}, data_bucket=outputs.data_bucket,
                   ttl_expires_at=outputs.ttl_expires_at, ttl_schedule_name=outputs.ttl_schedule_name,
                   ttl_schedule_group=outputs.ttl_schedule_group, software=software,
                   node_ssh_config=f"{NODE_STATE}/ssh_config")
    return Cluster(name=stack, backend="aws", nodes=nodes, user=NODE_USER, ssh_config=ssh_config,
                   known_hosts=known_hosts, python=NODE_PYTHON, mpirun=paths.MPIRUN, mpi_prefix=paths.MPI_PREFIX,
                   instance_type=outputs.instance_type, aws=info, head=head)
