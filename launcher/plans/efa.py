"""EFA for a training run, as pure functions of the instance type: devices per node, rank environment, MPI flags.

Sources:
- Interfaces: ``infra.layout.interfaces``, the same function the launch templates are built from: card 0's
  ``efa`` interface at device index 0 (the primary, with the node's IP), ``efa-only`` at device index 0 on every
  other network card (EC2 User Guide, efa-acc-inst-types.html).
- Environment: the aws-ofi-nccl EFA cheatsheet (https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md,
  "1. Settings via environment variables" and "2. Sample Presets"). ``FI_PROVIDER=efa`` and ``NCCL_PROTO=simple``
  are needed with aws-ofi-nccl <= 1.5 on every EFA GPU instance; ``FI_EFA_USE_DEVICE_RDMA=1`` with aws-ofi-nccl
  < 1.7 (or libfabric < 1.18) on the instances with GPUDirect RDMA over EFA (p4d, p4de, p5, p5en); newer software
  needs none of them. ``NCCL_PROTO=simple`` keeps NCCL off its low-latency protocols, so it costs bandwidth where
  it is not needed. ``FI_EFA_USE_HUGE_PAGE=0`` prevents ``os.fork()`` failing with "Cannot allocate memory" when
  PyTorch data-loader workers fork, which the trainer's do.
- Versions: the image's ``scaletrain:*`` tags when it has them; else what the node itself says
  (:data:`VERSION_PROBE`, read by :func:`parse_version_probe`); a version nobody could read is taken to be current
  software (aws-ofi-nccl >= 1.7, libfabric >= 1.18: no ``FI_PROVIDER``/``NCCL_PROTO``; ``FI_EFA_USE_DEVICE_RDMA``,
  harmless there, still set on p4/p5), and the shell says so in a warning.
- MPI: AWS's EFA + NCCL guide runs ``mpirun ... --mca pml ^cm --mca btl tcp,self --mca btl_tcp_if_exclude
  lo,docker0``: NCCL carries the gradients over EFA, MPI's own few messages stay on TCP. The launcher already
  names ``pml ob1`` (seed 003's line), which excludes ``cm`` (and with it MPI over libfabric) the same way.

Types without EFA (p3.16xlarge, seed 000's) get nothing EFA: NCCL uses its sockets transport over ENA.
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict

from ami import paths
from infra.catalog import InstanceType, get
from infra.layout import interfaces
from launcher.cluster import Cluster

__all__ = ["RDMA_FAMILIES", "VERSION_PROBE", "SoftwareVersions", "efa_devices", "fabric_env", "for_cluster", "merge",
           "mpi_mca", "parse_version_probe", "unknown_versions", "uses_efa", "versions_of"]

# Families whose EFA supports GPUDirect RDMA (the cheatsheet: "only p4 and p5 instances support both EFA and
# NVIDIA GPUDirect RDMA"; the EC2 User Guide's EFA supported instance types,
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types, list RDMA read/write on p4d, p4de,
# p5, p5e and p5en). p3dn's and g5's EFA do not.
RDMA_FAMILIES = frozenset({"p4d", "p4de", "p5", "p5e", "p5en"})


class SoftwareVersions(BaseModel):
    """Versions on the image that change which variables are needed; None where not known."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    aws_ofi_nccl: str | None = None
    libfabric: str | None = None


def _at_least(version: str, floor: tuple[int, ...]) -> bool:
    """True when ``version`` ('1.7.3-aws', 'v1.18.1amzn1.0') is not older than ``floor``."""
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


def _older(version: str | None, floor: tuple[int, ...]) -> bool:
    """True only when ``version`` is known and older than ``floor``: what nobody could read counts as current."""
    return bool(version) and not _at_least(version, floor)


def efa_devices(instance: InstanceType, node_names: list[str]) -> list[dict[str, object]]:
    """Per worker node, its EFA interfaces by network card: ``[{"node", "interfaces": [{card, device index}]}]``."""
    layout = interfaces(instance, efa=True) if instance.has_efa else ()
    interfaces_ = [i.as_dict() for i in layout]
    return [{"node": name, "interfaces": [dict(i) for i in interfaces_]} for name in node_names]


def fabric_env(instance: InstanceType, versions: SoftwareVersions | None = None) -> dict[str, str]:
    """The EFA / NCCL variables every rank needs on ``instance``; empty for types without EFA.

    A version that is not known counts as current software (see the module's notes): ``FI_PROVIDER=efa`` and the
    costly ``NCCL_PROTO=simple`` only for an aws-ofi-nccl known to need them; ``FI_EFA_USE_DEVICE_RDMA=1``, harmless
    on current software, unless both versions are known to be new enough."""
    if not instance.has_efa:
        return {}
    v = versions or SoftwareVersions()
    env = {"FI_EFA_USE_HUGE_PAGE": "0"}
    # Cheatsheet: FI_PROVIDER=efa and NCCL_PROTO=simple "Use for aws-ofi-nccl<=1.5.0 AND EFA-enabled GPU instances".
    if _older(v.aws_ofi_nccl, (1, 6, 0)):
        env |= {"FI_PROVIDER": "efa", "NCCL_PROTO": "simple"}
    # Cheatsheet: FI_EFA_USE_DEVICE_RDMA=1 "Do not set for libfabric>=1.18.0 and aws-ofi-nccl>=1.7.0. It's not harmful
    # to set it on p4/p5 instances with the newer software": set unless both are known to be new enough.
    new_enough = (not _older(v.aws_ofi_nccl, (1, 7, 0)) and not _older(v.libfabric, (1, 18, 0))
                  and bool(v.aws_ofi_nccl) and bool(v.libfabric))
    if instance.family in RDMA_FAMILIES and not new_enough:
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


def uses_efa(cluster: Cluster) -> bool:
    """Whether the workers talk over EFA: the stack's NodeGroups output says so per node group (discovery records
    it on each node). Workers of an ``-c efa=false`` stack have no EFA device even on a type that could have one."""
    workers = cluster.workers
    return (cluster.backend == "aws" and cluster.instance_type is not None and bool(workers)
            and all(n.transport == "efa" and n.efa_devices > 0 for n in workers)
            and get(cluster.instance_type).has_efa)


def for_cluster(cluster: Cluster, versions: SoftwareVersions | None = None
                ) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """(fabric env, MPI settings) for a run on ``cluster``: from its workers' instance type and the image's versions
    (``versions``, else its tags); nothing on the local cluster or where the workers have no EFA device. The env is
    the GPU workers' only: job.mpmd_mpirun_argv gives the reducers (CPU nodes, gloo over TCP) none of it."""
    if not uses_efa(cluster):
        return {}, []
    instance = get(cluster.instance_type or "")
    if versions is None:
        versions = versions_of(cluster.aws.software if cluster.aws else {})
    return fabric_env(instance, versions), mpi_mca(instance, mpi_interface=cluster.mpi_interface)


def unknown_versions(versions: SoftwareVersions | None) -> list[str]:
    """The versions :func:`fabric_env` depends on that nobody could read, by name."""
    v = versions or SoftwareVersions()
    return [name for name, value in (("aws-ofi-nccl", v.aws_ofi_nccl), ("libfabric", v.libfabric)) if not value]


def merge(first: SoftwareVersions | None, then: SoftwareVersions) -> SoftwareVersions:
    """``first``'s versions, with what it does not know taken from ``then``."""
    v = first or SoftwareVersions()
    return SoftwareVersions(aws_ofi_nccl=v.aws_ofi_nccl or then.aws_ofi_nccl, libfabric=v.libfabric or then.libfabric)


# --- Reading the versions on a node (an image without the scaletrain:* tags, e.g. a copied AMI: tags stay behind) ---

_MARK = "@@@scaletrain-versions"
# Where each version is written on a node; one SSH round trip prints them all, each after a marker line. Programs are
# named by absolute path: the launcher's non-login shell has no PATH to the image's tools (ami/paths.py).
_SOURCES = {
    # the project's image: every pinned version, KEY=VALUE lines (ami/components/base.sh)
    "image.env": f"cat {paths.IMAGE_ENV_FILE}",
    # libfabric as loaded: "fi_info: 1.19.0amzn3.0 / libfabric: 1.19.0amzn3.0 / libfabric api: 1.19"
    "fi_info": f"{paths.FI_INFO} --version",
    # what the EFA installer installed: "# EFA installer version: 1.22.0 ... # Packages installed:" then package
    # file names (deb: libfabric1-aws_2.4.0amzn3.0_amd64 libnccl-ofi_1.19.0-1_amd64; rpm: libfabric-aws-1.17.0-1...)
    "efa_installed_packages": "cat /opt/amazon/efa_installed_packages",
    # the plugin itself: it logs "Initializing " PACKAGE_STRING at start (aws-ofi-nccl, nccl_net_ofi_create_plugin),
    # so the library holds the text "Initializing aws-ofi-nccl 1.14.0"; the image's prefix, then the DLAMI's older one
    "ofi-nccl": (f"for f in {paths.OFI_NCCL_PREFIX}/lib/libnccl-net*.so /opt/aws-ofi-nccl/lib/libnccl-net*.so; do "
                 "[ -f \"$f\" ] && grep -aoE 'Initializing aws-ofi-nccl [0-9][0-9A-Za-z.+-]*' \"$f\" | head -n 1; "
                 "done"),
}
VERSION_PROBE = "; ".join(f'echo "{_MARK} {name}"; {{ {command}; }} 2>/dev/null'
                          for name, command in _SOURCES.items()) + "; true"


def _sections(text: str) -> dict[str, str]:
    out: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(f"{_MARK} "):
            current = line.split(" ", 1)[1].strip()
            out[current] = []
        elif current is not None:
            out[current].append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def _first(pattern: str, text: str) -> str | None:
    found = re.search(pattern, text, flags=re.MULTILINE)
    return found.group(1) if found else None


def parse_version_probe(text: str) -> SoftwareVersions:
    """:data:`VERSION_PROBE`'s output -> the versions it shows; None where no source has one.

    libfabric: what ``fi_info`` loads, else the image's record, else the EFA installer's package; aws-ofi-nccl: the
    plugin library's own text, else the image's record, else the EFA installer's ``libnccl-ofi`` package."""
    s = _sections(text)
    image = dict(line.split("=", 1) for line in s.get("image.env", "").splitlines()
                 if "=" in line and not line.startswith("#"))
    packages = s.get("efa_installed_packages", "")
    libfabric = (_first(r"^libfabric:\s*(\S+)", s.get("fi_info", ""))
                 or image.get("LIBFABRIC_VERSION", "").strip() or None
                 # deb libfabric1-aws_V_arch (old installers: libfabric1_V_arch), rpm libfabric-aws-V-release.arch
                 or _first(r"(?:^|\s)libfabric1?(?:-aws)?[_-](\d[^_\s-]*)", packages))
    ofi_nccl = (_first(r"Initializing aws-ofi-nccl (\S+)", s.get("ofi-nccl", ""))
                or image.get("AWS_OFI_NCCL_VERSION", "").strip() or None
                or _first(r"(?:^|\s)(?:libnccl-ofi|libnccl-net-ofi(?:-aws)?|aws-ofi-nccl)[_-](\d[^_\s-]*)", packages))
    return SoftwareVersions(aws_ofi_nccl=ofi_nccl, libfabric=libfabric)
