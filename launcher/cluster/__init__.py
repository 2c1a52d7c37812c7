"""The one Cluster interface both backends (local sshd processes, an AWS stack) present to the launcher.

A cluster is saved as `<state root>/clusters/<name>/cluster.json`; every command after `up` or discovery
reads it from there. Nothing else in the launcher asks which backend a cluster came from.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, field_validator, model_validator

from ami import paths
from launcher.errors import LaunchError

# Where the local backend's MPI is when a saved cluster does not say: Debian's openmpi-bin (`make setup` installs it);
# `launch local up` records the absolute path it finds instead.
LOCAL_MPIRUN = "/usr/bin/mpirun"


class Node(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str                                # also its Host alias in the cluster's ssh_config
    address: str                             # private address
    port: int = 22                           # SSH port (local nodes: one loopback port each)
    role: Literal["worker", "reducer", "head"]
    slots: int                               # training ranks on this node (GPUs; 1 per local node)
    cpus: int                                # cores this node may use (local nodes share the machine's)
    workdir: str                             # the node's own working directory
    gpus: int = 0
    instance_id: str | None = None           # AWS nodes: the EC2 instance (also the SSM target)
    instance_type: str | None = None         # AWS nodes: catalog name of this node's type
    launched_at: str | None = None           # AWS nodes: EC2 LaunchTime, ISO 8601 UTC
    # How this node talks to the others and the EFA devices it must show, from the stack's NodeGroups output: a
    # reducer beside P4d/P5, and every node of an `-c efa=false` stack, is on TCP with none.
    transport: Literal["efa", "tcp"] = "tcp"
    efa_devices: int = 0


# A node's working directory in shell terms, for command lines shared by every node (launch exec, doctor): the local
# sshd sets SCALETRAIN_WORKDIR; on AWS it is ~/scaletrain, what discovery records as each Node.workdir.
WORKDIR_SHELL = '"${SCALETRAIN_WORKDIR:-$HOME/scaletrain}"'


class AwsInfo(BaseModel):
    """What discovery read from a deployed stack; the local backend has none."""

    model_config = ConfigDict(frozen=True)

    stack: str                               # CloudFormation stack name (= the scaletrain:cluster tag)
    region: str
    profile: str | None = None
    storage: dict[str, Any] = {}             # the StorageMount output (type fsx, beegfs or none)
    data_bucket: str | None = None
    ttl_expires_at: str | None = None        # YYYY-MM-DDTHH:MM:SSZ
    ttl_schedule_name: str | None = None
    ttl_schedule_group: str = "default"
    software: dict[str, str] = {}            # the image's scaletrain:* tags (libfabric, aws-ofi-nccl, ...)
    node_ssh_config: str                     # ssh_config on the nodes: mpirun reaches the others with it


class RehearsalInfo(BaseModel):
    """What `launch local up` made for rehearsal nodes (launcher/local/rehearsal_root.py), by name, so that `down`
    removes exactly that, after a crash too."""

    model_config = ConfigDict(frozen=True)

    bridge: str
    subnet: str
    gateway: str                             # the bridge's address on this machine
    netns: dict[str, str]                    # node -> network namespace
    veth: dict[str, str]                     # node -> this machine's end of its veth pair
    shared_host: str                         # the shared directory on this machine ...
    shared_mount: str                        # ... and where every node sees it (where the stack mounts FSx)
    layers: list[str]                        # the root's overlay lower directories, top first
    addresses_used: list[str] = []           # every address a node has had (a replacement gets a new one)
    services: str = ""                       # the services namespace's address: IMDS's and the account's
    storage: str = ""                        # the storage host's address: the nodes mount shared storage from it
    secret: str = ""                         # the munge key's secret ARN in that account (a cluster with Slurm)
    account_key: str = ""                    # the launcher's own access key in that account (IAM is enforced there)
    account_secret: str = ""


class Cluster(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    backend: Literal["local", "aws"]
    nodes: list[Node]
    user: str
    ssh_config: str                          # used by the launcher (fabric) and by mpirun on the nodes
    known_hosts: str                         # host keys pinned when the cluster was created
    python: str                              # interpreter on the nodes, with scaletrain installed
    # Open MPI on the nodes, by absolute path: the launcher reaches nodes with non-interactive, non-login SSH
    # commands, whose PATH lacks the image's /opt/amazon/openmpi/bin (ami/paths.py says why). mpi_prefix goes to
    # mpirun as --prefix so that the other nodes' orted is found the same way: "Open MPI will add
    # /remote/node/directory/bin to the PATH and /remote/node/directory/lib64 to the LD_LIBRARY_PATH on the remote
    # node before attempting to execute anything" (mpirun(1), Open MPI 4.1, "Remote Execution":
    # https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php).
    mpirun: str
    mpi_prefix: str | None = None
    mpi_interface: str | None = None         # network interface for MPI's own traffic (local: lo)
    instance_type: str | None = None         # catalog name for AWS nodes; None on the local cluster
    processes: dict[str, int] = {}           # local backend: node name -> the pid that ends it (sshd or unshare)
    aws: AwsInfo | None = None               # AWS backend: the stack it was discovered from
    rehearsal: RehearsalInfo | None = None   # local backend on rehearsal nodes (the default); None: loopback sshd
    node_ssh_config: str | None = None       # rehearsal nodes: the ssh_config on the nodes mpirun uses
    # The head node running Slurm's controller, when the cluster has one (launcher/plans/slurm.py): jobs are then
    # Slurm jobs, submitted there and owned by the cluster. Not among ``nodes``: it runs no ranks.
    head: Node | None = None

    @model_validator(mode="before")
    @classmethod
    def _mpi_of_backend(cls, data: Any) -> Any:
        """A cluster saved before the launcher recorded its MPI gets its backend's: the image's on AWS, Debian's
        on the local cluster."""
        if isinstance(data, dict) and "mpirun" not in data:
            aws = data.get("backend") == "aws"
            data = {**data, "mpirun": paths.MPIRUN if aws else LOCAL_MPIRUN,
                    "mpi_prefix": data.get("mpi_prefix", paths.MPI_PREFIX if aws else None)}
        return data

    @field_validator("mpirun", "mpi_prefix")
    @classmethod
    def _absolute(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"must be an absolute path (a node's non-login shell has no PATH to find it on), "
                             f"got '{value}'")
        return value

    @property
    def mpi_ssh_config(self) -> str:
        """The ssh_config mpirun uses on the first node: the launcher's own on the local cluster (same machine),
        the nodes' copy on AWS (private addresses; the launcher's goes through SSM)."""
        if self.aws:
            return self.aws.node_ssh_config
        return self.node_ssh_config or self.ssh_config

    @property
    def shares_launcher_fs(self) -> bool:
        """Do the nodes see the launcher's files (the loopback local cluster only)? Everywhere else a path the
        launcher names must be on the nodes' own disks or shared storage."""
        return self.backend == "local" and self.rehearsal is None

    @property
    def shared_root(self) -> str | None:
        """Where runs and staged data live on every node: the shared mount's scaletrain directory, or None."""
        if self.rehearsal is not None:
            return f"{self.rehearsal.shared_mount}/scaletrain"
        mount = (self.aws.storage if self.aws else {}).get("mount_point")
        return f"{mount}/scaletrain" if mount else None

    @property
    def workers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "worker"]

    @property
    def reducers(self) -> list[Node]:
        return [n for n in self.nodes if n.role == "reducer"]

    @property
    def machines(self) -> list[Node]:
        """Every machine the launcher reaches: the nodes, then the head node when there is one."""
        return [*self.nodes, *([self.head] if self.head else [])]

    def node(self, name: str) -> Node:
        for n in self.nodes:
            if n.name == name:
                return n
        raise LaunchError(f"no node '{name}' in cluster '{self.name}'; nodes: {', '.join(self.names())}")

    def machine(self, name: str) -> Node:
        """A node or the head node by name (`launch ssh`, `launch local kill` reach both)."""
        for n in self.machines:
            if n.name == name:
                return n
        raise LaunchError(f"no node '{name}' in cluster '{self.name}'; nodes: "
                          f"{', '.join(n.name for n in self.machines)}")

    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def select_workers(self, count: int | None) -> list[Node]:
        """The first `count` workers (all when None)."""
        workers = self.workers
        if count is None:
            return workers
        if count < 1:
            raise LaunchError(f"--nodes must be >= 1, got {count}")
        if count > len(workers):
            raise LaunchError(f"--nodes {count} is more than the {len(workers)} worker node(s) of cluster "
                              f"'{self.name}'; use --nodes 1..{len(workers)} or bring up a larger cluster")
        return workers[:count]


def state_root() -> Path:
    """Where clusters are remembered: $SCALETRAIN_HOME, else ~/.scaletrain."""
    return Path(os.environ.get("SCALETRAIN_HOME") or Path.home() / ".scaletrain")


def cluster_dir(name: str) -> Path:
    return state_root() / "clusters" / name


def save(cluster: Cluster) -> None:
    path = cluster_dir(cluster.name) / "cluster.json"
    tmp = path.with_name(".cluster.json.tmp")
    tmp.write_text(cluster.model_dump_json(indent=2) + "\n")
    os.replace(tmp, path)


def known_names() -> list[str]:
    root = state_root() / "clusters"
    return sorted(p.parent.name for p in root.glob("*/cluster.json")) if root.is_dir() else []


def load(name: str | None) -> Cluster:
    """The named cluster, or the only one there is when no name is given."""
    names = known_names()
    if name is None:
        if not names:
            raise LaunchError("no cluster is up; start one with `launch local up --nodes 2` "
                              "(or deploy one with `npx cdk deploy`)")
        if len(names) > 1:
            raise LaunchError(f"several clusters exist ({', '.join(names)}); choose one with --cluster NAME")
        name = names[0]
    path = cluster_dir(name) / "cluster.json"
    if not path.is_file():
        known = ", ".join(names) or "none"
        raise LaunchError(f"unknown cluster '{name}'; known clusters: {known}")
    try:
        return Cluster.model_validate(json.loads(path.read_text()))
    except (ValueError, json.JSONDecodeError) as e:
        raise LaunchError(f"{path} is damaged ({str(e).splitlines()[0]}); remove it with "
                          f"`launch local down --cluster {name}`") from None
