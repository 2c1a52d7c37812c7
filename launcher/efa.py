"""EFA for a training run, as pure functions of the instance type: devices per node, rank environment, MPI flags.

Sources:
- Interfaces: ``infra.layout.interfaces``, the same function the launch templates are built from: card 0's
  ``efa`` interface at device index 0 (the primary, with the node's IP), ``efa-only`` at device index 1 on every
  other network card.
- Environment: the aws-ofi-nccl EFA cheatsheet (https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md).
  ``FI_PROVIDER=efa`` and ``NCCL_PROTO=simple`` are needed with aws-ofi-nccl <= 1.5 on every EFA GPU instance;
  ``FI_EFA_USE_DEVICE_RDMA=1`` with aws-ofi-nccl < 1.7 (or libfabric < 1.18) on the instances with GPUDirect RDMA
  over EFA (p4d, p4de, p5, p5en); newer software needs none of them, and setting them is harmless apart from
  ``NCCL_PROTO=simple``, which keeps NCCL off its low-latency protocols. ``FI_EFA_USE_HUGE_PAGE=0`` prevents
  ``os.fork()`` failing with "Cannot allocate memory" when PyTorch data-loader workers fork, which the trainer's do.
  With the software versions unknown, :func:`fabric_env` returns the set that is correct on all of them.
- MPI: AWS's EFA + NCCL guide runs ``mpirun ... --mca pml ^cm --mca btl tcp,self --mca btl_tcp_if_exclude
  lo,docker0``: NCCL carries the gradients over EFA, MPI's own few messages stay on TCP. The launcher already
  names ``pml ob1`` (seed 003's line), which excludes ``cm`` (and with it MPI over libfabric) the same way.

Types without EFA (p3.16xlarge, seed 000's) get nothing EFA: NCCL uses its sockets transport over ENA.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from infra.catalog import InstanceType, get
from infra.layout import interfaces
from launcher.cluster import Cluster

__all__ = ["RDMA_FAMILIES", "SoftwareVersions", "efa_devices", "fabric_env", "for_cluster", "mpi_mca",
           "versions_of"]

# Families whose EFA supports GPUDirect RDMA (the cheatsheet: "only p4 and p5 instances support both EFA and
# NVIDIA GPUDirect RDMA"). p3dn's and g5's EFA do not.
RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en"})


class SoftwareVersions(BaseModel):
    """Versions on the image that change which variables are needed; None where not known."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    aws_ofi_nccl: str | None = None
    libfabric: str | None = None


def _at_least(version: str | None, floor: tuple[int, ...]) -> bool:
    """True when ``version`` ('1.7.3-aws', 'v1.18.1amzn1.0') is known and not older than ``floor``."""
    if not version:
        return False
    parts: list[int] = []
    for piece in version.lstrip("vV").split("."):
        digits = ""
        for ch in piece:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        parts.append(int(digits))
        if digits != piece:
            break
    if not parts:
        raise ValueError(f"cannot read version '{version}'; expected something like 1.7.3")
    return tuple(parts) >= floor


def efa_devices(instance: InstanceType, node_names: list[str]) -> list[dict[str, object]]:
    """Per worker node, its EFA interfaces by network card: ``[{"node", "interfaces": [{card, device index}]}]``."""
    layout = interfaces(instance, efa=True) if instance.has_efa else ()
    interfaces_ = [i.as_dict() for i in layout]
    return [{"node": name, "interfaces": [dict(i) for i in interfaces_]} for name in node_names]


def fabric_env(instance: InstanceType, versions: SoftwareVersions | None = None) -> dict[str, str]:
    """The EFA / NCCL variables every rank needs on ``instance``; empty for types without EFA."""
    if not instance.has_efa:
        return {}
    v = versions or SoftwareVersions()
    env = {"FI_EFA_USE_HUGE_PAGE": "0"}
    if not _at_least(v.aws_ofi_nccl, (1, 6, 0)):
        env |= {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple"}
    rdma_automatic = _at_least(v.aws_ofi_nccl, (1, 7, 0)) and _at_least(v.libfabric, (1, 18, 0))
    if instance.family in RDMA_FAMILIES and not rdma_automatic:
        env["FI_EFA_USE_DEVICE_RDMA"] = "1"
    return dict(sorted(env.items()))


def mpi_mca(instance: InstanceType, *, mpi_interface: str | None) -> list[tuple[str, str]]:
    """OpenMPI MCA settings that keep MPI's own traffic on TCP when the instance has EFA; none otherwise.

    ``btl_tcp_if_exclude`` is left out when the cluster names an interface for MPI (OpenMPI refuses both).
    """
    if not instance.has_efa:
        return []
    mca = [("pml", "ob1"), ("btl", "tcp,self")]
    if not mpi_interface:
        mca.append(("btl_tcp_if_exclude", "lo,docker0"))
    return mca


def versions_of(software: dict[str, str]) -> SoftwareVersions:
    """The versions that matter here, from discovery's ``software`` (the image's ``scaletrain:*`` tags, unprefixed)."""
    return SoftwareVersions(aws_ofi_nccl=software.get("aws-ofi-nccl"), libfabric=software.get("libfabric"))


def for_cluster(cluster: Cluster) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(fabric env, MPI settings) for a run on ``cluster``: from its workers' instance type and its image's
    versions; nothing on the local cluster or a type without EFA."""
    if cluster.backend != "aws" or cluster.instance_type is None:
        return {}, []
    instance = get(cluster.instance_type)
    software = cluster.aws.software if cluster.aws else {}
    return fabric_env(instance, versions_of(software)), mpi_mca(instance, mpi_interface=cluster.mpi_interface)
