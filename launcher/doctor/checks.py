"""`launch doctor`'s checks: pure functions from what real tools printed on a node to a verdict.

Each check reads the recorded stdout of one tool (``nvidia-smi``, ``nvcc``, ``fi_info``, ``ldconfig -p``,
``horovodrun --check-build``, ``findmnt -J``, ``date +%s.%N``, nccl-tests' ``all_reduce_perf``...) and the
catalog entry of the node's instance type, and returns a :class:`Check`: ok, fail (with the reason a user can
act on) or skip (with why it does not apply). What gathers those outputs on a node (:func:`probe_script`,
:func:`parse_probes`, :class:`Probe`) lives in launcher/doctor/probes.py and is re-exported here. The shell that
runs it is launcher/doctor/runner.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

from launcher.doctor.busbw import parse_bus_bandwidth, parse_largest_busbw
from launcher.doctor.probes import (  # noqa: F401 (the gathering side, launcher/doctor/probes.py: re-exported)
    _MARK,
    HOROVOD_BUILD_PY,
    HOROVOD_BUILD_TOOL,
    OFI_NCCL_DIRS,
    Probe,
    _probe,
    horovod_build_command,
    parse_probes,
    probe_commands,
    probe_script,
)

if TYPE_CHECKING:
    from infra.catalog import InstanceType

# Slurm's health check (launcher/doctor/health.py) imports this module on every node every two minutes, 64 rehearsal
# nodes at once on a 2-core machine: infra.catalog, infra.layout and launcher.cluster import pydantic (about 0.2 s of
# CPU there, docs/benchmarks.md), so they are imported where a check needs them, not here.

Status = Literal["ok", "fail", "skip"]
STORAGE_CHOICES = ("auto", "fsx", "beegfs", "none")
CLOCK_SKEW_LIMIT_S = 0.5       # Horovod's timeline and the run report compare node clocks; chrony keeps < 1 ms
GPU_MEMORY_TOLERANCE = 0.05    # nvidia-smi's memory.total vs the catalog's GiB (reserved memory, MiB rounding)
# all_reduce_perf's bus bandwidth between nodes is bounded by each node's network line rate. Over EFA with
# aws-ofi-nccl it reaches most of it at large messages; NCCL falling back to its sockets transport (plugin not
# found, FI_PROVIDER wrong) lands far below. Half the line rate separates the two with room for a busy fabric.
BUSBW_FLOOR_FRACTION = 0.5


def shared_fstypes() -> dict[str, str]:
    from infra.layout import BEEGFS_MOUNT_POINT, FSX_MOUNT_POINT

    return {"lustre": FSX_MOUNT_POINT, "beegfs": BEEGFS_MOUNT_POINT}


def __getattr__(name: str) -> object:  # SHARED_FSTYPES, read without importing infra.layout with this module
    if name == "SHARED_FSTYPES":
        return shared_fstypes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    detail: str
    node: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "fail"


def ok(name: str, detail: str) -> Check:
    return Check(name, "ok", detail)


def fail(name: str, detail: str) -> Check:
    return Check(name, "fail", detail)


def skip(name: str, detail: str) -> Check:
    return Check(name, "skip", detail)


def _first_line(text: str, default: str = "no output") -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[0] if lines else default


# --- GPUs, driver, CUDA -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Gpu:
    name: str
    driver: str
    memory_mib: float


def parse_gpus(csv: str) -> list[Gpu]:
    """``nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader``."""
    gpus = []
    for line in csv.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3 or not parts[2].endswith("MiB"):
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        gpus.append(Gpu(parts[0], parts[1], float(parts[2].removesuffix("MiB").strip())))
    return gpus


def gpu_matches(gpu: Gpu, instance: InstanceType) -> bool:
    """Same chip (A100, H100, V100, A10G... as a word of the name) and memory within the tolerance."""
    chip = (instance.gpu_model or "").split("-")[0]
    if not re.search(rf"(^|[\s-]){re.escape(chip)}([\s-]|$)", gpu.name):
        return False
    expected_mib = instance.gpu_memory_gib * 1024
    return abs(gpu.memory_mib - expected_mib) <= GPU_MEMORY_TOLERANCE * expected_mib


def check_gpus(probe: Probe, instance: InstanceType) -> Check:
    name = "gpus"
    if probe.rc != 0:
        return fail(name, f"nvidia-smi failed: {_first_line(probe.output)}")
    try:
        gpus = parse_gpus(probe.output)
    except ValueError as e:
        return fail(name, str(e))
    want = f"{instance.gpus} x {instance.gpu_model}"
    if len(gpus) != instance.gpus:
        return fail(name, f"{len(gpus)} GPU(s) visible, {instance.name} has {want}")
    wrong = [g.name for g in gpus if not gpu_matches(g, instance)]
    if wrong:
        return fail(name, f"{len(wrong)} GPU(s) are not {instance.gpu_model}: {wrong[0]}")
    return ok(name, f"{len(gpus)} x {gpus[0].name} ({gpus[0].memory_mib:,.0f} MiB)")


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text))


def parse_image_env(text: str) -> dict[str, str]:
    """/etc/scaletrain/image.env, written by the image's base component (KEY=VALUE lines)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line and not line.startswith("#"))


def check_driver(smi: Probe, header: Probe, nvcc: Probe, kernel: Probe, image: Probe) -> Check:
    """The driver loads for the running kernel, one version on every GPU, and CUDA no newer than it supports."""
    name = "driver/cuda"
    kernel_info = dict(line.split(" ", 1) for line in kernel.output.splitlines() if " " in line)
    if smi.rc != 0:
        module = kernel_info.get("module", "")
        why = (f"no nvidia kernel module for kernel {kernel_info.get('kernel', '?')} (the driver was built for "
               "another kernel; rebuild it with DKMS or use the image's held kernel)"
               if "not found" in module or not module else f"nvidia module {module} is installed but not loaded")
        return fail(name, f"nvidia-smi cannot talk to the driver: {why}")
    drivers = {g.driver for g in parse_gpus(smi.output)}
    if len(drivers) != 1:
        return fail(name, f"GPUs report different drivers: {', '.join(sorted(drivers))}")
    driver = drivers.pop()
    supported = re.search(r"CUDA Version:\s*([\d.]+)", header.output)
    toolkit = re.search(r"release ([\d.]+),", nvcc.output)
    if nvcc.rc != 0 or not toolkit:
        return fail(name, f"driver {driver}, but no CUDA toolkit: /usr/local/cuda/bin/nvcc {_first_line(nvcc.output)}")
    if supported and _version_tuple(toolkit.group(1)) > _version_tuple(supported.group(1)):
        return fail(name, f"CUDA {toolkit.group(1)} is newer than driver {driver} supports "
                          f"(CUDA {supported.group(1)}); install a newer driver")
    recorded = parse_image_env(image.output) if image.rc == 0 else {}
    pinned = recorded.get("NVIDIA_DRIVER_VERSION")
    if pinned and recorded.get("SCALETRAIN_BASE_HAS_DRIVER") != "true" and pinned != driver:
        return fail(name, f"driver {driver} is loaded but the image pinned {pinned} (/etc/scaletrain/image.env); "
                          "was the driver replaced after the build?")
    return ok(name, f"driver {driver}, CUDA {toolkit.group(1)}"
                    + (f" (driver supports {supported.group(1)})" if supported else ""))


# --- EFA, libfabric, NCCL, aws-ofi-nccl -----------------------------------------------------------------------------

def expected_efa_devices(instance: InstanceType) -> int:
    from infra.layout import efa_device_count, interfaces

    return efa_device_count(interfaces(instance, efa=True)) if instance.has_efa else 0


NO_EFA_GROUP = "its node group is on TCP (the stack gave it no EFA interface)"


def check_efa_devices(probe: Probe, instance: InstanceType, expected: int | None = None) -> Check:
    """``ls /sys/class/infiniband``: one ``rdmap*`` device per EFA interface the stack gave the node (``expected``,
    from its NodeGroups output; by default one per EFA network card of the type, infra/layout.py)."""
    name = "efa devices"
    if not instance.has_efa:
        return skip(name, f"{instance.name} has no EFA")
    if expected == 0:
        return skip(name, NO_EFA_GROUP)
    want = expected_efa_devices(instance) if expected is None else expected
    devices = [d for d in probe.output.split() if d.startswith("rdmap")] if probe.rc == 0 else []
    if len(devices) != want:
        return fail(name, f"{len(devices)} of {want} EFA devices ({instance.name} has {instance.efa_cards} EFA "
                          "network cards); check the launch template's interfaces and the efa kernel module")
    return ok(name, f"{len(devices)} devices: {', '.join(devices[:2])}{', ...' if len(devices) > 2 else ''}")


def check_libfabric(info: Probe, version: Probe, instance: InstanceType, expected: int | None = None) -> Check:
    """``fi_info -p efa -t FI_EP_RDM``: the efa provider, one RDM domain per device."""
    name = "libfabric efa"
    if not instance.has_efa:
        return skip(name, f"{instance.name} has no EFA; NCCL uses TCP sockets")
    if expected == 0:
        return skip(name, f"{NO_EFA_GROUP}; NCCL uses TCP sockets")
    providers = re.findall(r"^\s*provider:\s*(\S+)", info.output, flags=re.MULTILINE)
    if info.rc != 0 or "efa" not in providers:
        return fail(name, f"fi_info finds no efa provider: {_first_line(info.output)}")
    domains = sorted(set(re.findall(r"^\s*domain:\s*(\S+)", info.output, flags=re.MULTILINE)))
    lib = re.search(r"libfabric:\s*(\S+)", version.output)
    want = expected_efa_devices(instance) if expected is None else expected
    if len(domains) != want:
        return fail(name, f"the efa provider serves {len(domains)} of {want} devices")
    return ok(name, f"efa provider on {len(domains)} devices, libfabric {lib.group(1) if lib else '?'}")


def check_nccl(ldconfig: Probe, ofi: Probe, instance: InstanceType, expected: int | None = None) -> Check:
    """libnccl.so.2 known to the loader, and the aws-ofi-nccl net plugin where the node has EFA devices."""
    name = "nccl"
    if not re.search(r"libnccl\.so\.2\b", ldconfig.output):
        return fail(name, "libnccl.so.2 is not in the loader's cache (ldconfig -p)")
    if not instance.has_efa or expected == 0:
        return ok(name, "libnccl.so.2 found; no EFA, so no aws-ofi-nccl needed")
    plugins = [p for p in ofi.output.split() if p.endswith(".so") and "/" in p]
    if not plugins:
        return fail(name, f"aws-ofi-nccl not found in {' or '.join(OFI_NCCL_DIRS)}: NCCL would use TCP sockets, "
                          "not EFA")
    return ok(name, f"libnccl.so.2 and {plugins[0]}")


# --- Horovod ------------------------------------------------------------------------------------------------------

def parse_check_build(text: str) -> dict[str, dict[str, bool]]:
    """``horovodrun --check-build``: section -> item -> built, e.g. {"Available Tensor Operations": {"NCCL": True}}."""
    sections: dict[str, dict[str, bool]] = {}
    current = None
    for line in text.splitlines():
        item = re.match(r"^\s*\[([ X])\]\s*(\S.*?)\s*$", line)
        if item and current is not None:
            sections[current][item.group(2)] = item.group(1) == "X"
        elif line.strip().endswith(":") and not line.startswith("Horovod"):
            current = line.strip().rstrip(":")
            sections[current] = {}
    return sections


def check_horovod_build(probe: Probe, *, need_nccl: bool, tool: str = "horovodrun --check-build") -> Check:
    """``tool``: what printed it (the health check reads the same format from one import: HOROVOD_BUILD_PY)."""
    name = "horovod"
    if probe.rc != 0:
        return fail(name, f"{tool} failed: {_first_line(probe.output)}")
    build = parse_check_build(probe.output)
    frameworks = build.get("Available Frameworks", {})
    controllers = build.get("Available Controllers", {})
    operations = build.get("Available Tensor Operations", {})
    missing = [what for what, have in (("PyTorch", frameworks.get("PyTorch")), ("MPI", controllers.get("MPI")),
                                       ("NCCL", operations.get("NCCL") if need_nccl else True)) if not have]
    version = re.search(r"Horovod v(\S+?):", probe.output)
    if missing:
        return fail(name, f"Horovod {version.group(1) if version else '?'} built without {', '.join(missing)}; "
                          "rebuild it (ami/components/horovod.sh)")
    ops = [k for k, v in operations.items() if v]
    return ok(name, f"{version.group(1) if version else '?'}: PyTorch, MPI; tensor ops {', '.join(ops)}")


def check_horovod_python(probe: Probe, python: str) -> Check:
    """The local backend's Horovod, through the cluster's Python: importable, built with MPI and Gloo."""
    name = "horovod"
    try:
        info = json.loads(probe.output.strip().splitlines()[-1]) if probe.rc == 0 else None
    except (ValueError, IndexError):
        info = None
    if not isinstance(info, dict):
        return fail(name, f"horovod.torch does not import with {python}: {_last_line(probe.output)}")
    missing = [k.upper() if k == "mpi" else k.capitalize() for k in ("mpi", "gloo") if not info.get(k)]
    if missing:
        return fail(name, f"Horovod {info.get('version')} built without {', '.join(missing)}")
    return ok(name, f"{info.get('version')}: MPI and Gloo built (NCCL: {'yes' if info.get('nccl') else 'no, CPU'})")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else "no output"


def check_mpirun(probe: Probe) -> Check:
    name = "mpi"
    found = re.search(r"\(Open MPI\) (\S+)", probe.output)
    if probe.rc != 0 or not found:
        return fail(name, f"mpirun --version: {_first_line(probe.output)}")
    return ok(name, f"Open MPI {found.group(1)}")


def check_shared_mount(probe: Probe, mount: str) -> Check:
    """A rehearsal node's shared storage: a mount point of its own at ``mount``, writable (the only path it shares
    with the launcher's machine and the other nodes; runs and data live there)."""
    name = "shared storage"
    if probe.rc != 0 and not probe.output.strip():
        return fail(name, f"nothing mounted at {mount}")
    if probe.rc != 0 or f"writable {mount}" not in probe.output:
        return fail(name, f"{mount} is not writable: {_last_line(probe.output)}")
    return ok(name, f"{mount} mounted, writable")


def check_workdir(probe: Probe) -> Check:
    name = "workdir"
    if probe.rc != 0:
        return fail(name, f"working directory not writable: {_last_line(probe.output)}")
    return ok(name, _first_line(probe.output))


# --- Shared storage -----------------------------------------------------------------------------------------------

def check_storage(mounts: Probe, writes: Probe, expect: str) -> Check:
    """``findmnt -J -t lustre,beegfs`` and a write to each: the shared file system mounted and writable."""
    name = "shared storage"
    if expect not in STORAGE_CHOICES:
        raise ValueError(f"--storage must be one of {', '.join(STORAGE_CHOICES)}, got {expect!r}")
    if expect == "none":
        return skip(name, "--storage none")
    try:
        found = json.loads(mounts.output)["filesystems"] if mounts.output.strip() else []
    except (ValueError, KeyError):
        return fail(name, f"findmnt: {_first_line(mounts.output)}")
    wanted = {"fsx": ("lustre",), "beegfs": ("beegfs",), "auto": ("lustre", "beegfs")}[expect]
    shared = [m for m in found if m.get("fstype") in wanted]
    if not shared:
        where = " or ".join(f"{t} at {shared_fstypes()[t]}" for t in wanted)
        return fail(name, f"not mounted: no {where}")
    read_only = re.findall(r"^read-only (\S+)", writes.output, flags=re.MULTILINE)
    target = shared[0]["target"]
    if target in read_only or f"writable {target}" not in writes.output:
        return fail(name, f"{shared[0]['fstype']} at {target} is mounted but not writable")
    return ok(name, f"{shared[0]['fstype']} at {target}, writable")


# --- Clock --------------------------------------------------------------------------------------------------------

def check_clock(node_time: str, sent: float, received: float, limit_s: float = CLOCK_SKEW_LIMIT_S) -> Check:
    """``date +%s.%N`` on the node against the launcher's clock, read before and after: the node's reading
    happened within that window, so the skew is known to within half of it."""
    name = "clock"
    try:
        t = float(node_time.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return fail(name, f"date +%s.%N printed {node_time.strip()[:40]!r}")
    middle, uncertainty = (sent + received) / 2, (received - sent) / 2
    skew = t - middle
    if abs(skew) - uncertainty > limit_s:
        return fail(name, f"{skew:+.2f} s from the launcher's clock (limit {limit_s} s); start chrony or "
                          "systemd-timesyncd")
    return ok(name, f"{skew:+.3f} s (+/- {uncertainty:.3f} s)")


# --- Multi-node NCCL allreduce ------------------------------------------------------------------------------------

def check_bus_bandwidth(rc: int, output: str, instance: InstanceType, nodes: int) -> Check:
    """The largest message's bus bandwidth (the average over all sizes is dominated by latency) against the
    node's network line rate."""
    name = "nccl allreduce"
    line_rate = instance.network_bytes_per_sec / 1e9
    floor = BUSBW_FLOOR_FRACTION * line_rate
    largest = parse_largest_busbw(output)
    if rc != 0 or largest is None or parse_bus_bandwidth(output) is None:
        return fail(name, f"all_reduce_perf on {nodes} nodes failed (exit {rc}): {_last_line(output)}")
    wrong = re.search(r"Out of bounds values\s*:\s*(\d+)", output)
    if wrong and int(wrong.group(1)) != 0:
        return fail(name, f"{wrong.group(1)} wrong values in the allreduce results")
    size, busbw = largest
    verdict = (f"bus bandwidth {busbw:.1f} GB/s at {size / 2**20:,.0f} MiB on {nodes} nodes; {instance.name}'s "
               f"network allows {line_rate:.1f} GB/s")
    if busbw < floor:
        transport = "is NCCL using EFA (aws-ofi-nccl)?" if instance.has_efa else "check the placement group"
        return fail(name, f"{verdict}, below {floor:.1f} GB/s: {transport}")
    return ok(name, verdict)


def check_mpi_hello(rc: int, output: str, nodes: list[str]) -> Check:
    """A real ``mpirun`` across the nodes, each rank printing its node's name."""
    name = "mpirun across nodes"
    seen = sorted({ln.strip() for ln in output.splitlines() if ln.strip() in nodes})
    if rc != 0 or seen != sorted(nodes):
        return fail(name, f"mpirun on {len(nodes)} nodes exited {rc}, ranks answered from "
                          f"{', '.join(seen) or 'no node'}: {_last_line(output)}")
    return ok(name, f"{len(nodes)} ranks, one on each of {', '.join(nodes)}")


# --- A node's verdict ---------------------------------------------------------------------------------------------

_MISSING = Probe("probe did not run", 127)

LOCAL_SKIPPED = (
    ("gpus", "the local cluster has no GPUs"),
    ("driver/cuda", "no GPUs, so no NVIDIA driver or CUDA to check"),
    ("efa devices", "no EFA on the local cluster"),
    ("libfabric efa", "no EFA on the local cluster"),
    ("nccl", "CPU ranks use MPI and Gloo, not NCCL"),
    ("shared storage", "local nodes share the machine's file system"),
    ("nccl allreduce", "no GPUs; the MPI check runs instead"),
)


def evaluate_aws(probes: dict[str, Probe], instance: InstanceType, *, storage: str,
                 efa_devices: int | None = None, horovod_tool: str = "horovodrun --check-build") -> list[Check]:
    """``efa_devices``: the EFA devices the stack gave this node's group (0: on TCP); default: one per EFA card.
    ``horovod_tool``: what printed the horovod-build probe (the health check: HOROVOD_BUILD_TOOL)."""
    p = lambda key: probes.get(key, _MISSING)  # noqa: E731
    if instance.gpus == 0:
        # A reducer (c5n): it sums gradients on its CPUs over torch's gloo (training/reducer.py), so no GPU, driver,
        # NCCL or Horovod of its own is its health; its EFA devices, MPI and the storage are. Checked as a GPU type,
        # every reducer drained itself at its first interval (issue 46's fourth review).
        why = f"{instance.name} has no GPUs: a reducer sums on its CPUs (training/reducer.py)"
        return [skip("gpus", why), skip("driver/cuda", why),
                check_efa_devices(p("infiniband"), instance, efa_devices),
                check_libfabric(p("fi_info"), p("fi_version"), instance, efa_devices),
                skip("nccl", why), skip("horovod", why), check_mpirun(p("mpirun")),
                check_storage(p("storage"), p("storage-write"), storage)]
    checks = [check_gpus(p("nvidia-smi"), instance),
              check_driver(p("nvidia-smi"), p("nvidia-smi-header"), p("nvcc"), p("kernel"), p("image")),
              check_efa_devices(p("infiniband"), instance, efa_devices),
              check_libfabric(p("fi_info"), p("fi_version"), instance, efa_devices),
              check_nccl(p("ldconfig"), p("ofi-nccl"), instance, efa_devices),
              check_horovod_build(p("horovod-build"), need_nccl=instance.gpus > 0, tool=horovod_tool),
              check_mpirun(p("mpirun")),
              check_storage(p("storage"), p("storage-write"), storage)]
    return checks


def evaluate_local(probes: dict[str, Probe], python: str, *, shared_mount: str | None = None) -> list[Check]:
    """``shared_mount``: rehearsal nodes' shared storage, checked (probe_script's ``shared-mount``); loopback nodes
    share this machine's file system instead, and skip it."""
    p = lambda key: probes.get(key, _MISSING)  # noqa: E731
    skipped = [skip(n, why) for n, why in LOCAL_SKIPPED if n != "nccl allreduce"
               and not (shared_mount and n == "shared storage")]
    storage = [check_shared_mount(p("shared-mount"), shared_mount)] if shared_mount else []
    return [check_mpirun(p("mpirun")), check_horovod_python(p("horovod-python"), python),
            check_workdir(p("workdir"))] + skipped + storage


def on_node(checks: list[Check], node: str) -> list[Check]:
    return [replace(c, node=node) for c in checks]


def verdict(checks: list[Check]) -> str | None:
    """None when every check passed or was skipped; else one line naming each failing node and why."""
    failed = [c for c in checks if c.failed]
    if not failed:
        return None
    nodes = sorted({c.node for c in failed})
    first = "; ".join(f"{c.node} {c.name}: {c.detail}" for c in failed[:3])
    more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
    return f"{len(nodes)} node(s) not ready: {first}{more}"
