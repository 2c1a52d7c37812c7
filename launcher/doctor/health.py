"""Slurm's HealthCheckProgram on every node: the doctor's node checks (launcher/doctor/checks.py), run on the node
itself by slurmd every HealthCheckInterval, with no launcher attached. A node that fails one drains itself
(`scontrol update State=DRAIN`): Slurm lets its running job finish, starts none there, and `sinfo -R` says why,
as ParallelCluster's and HyperPod's health checks take a bad instance out of service. A replacement instance returns
itself to service when it registers (launcher/plans/slurm_rejoin.rejoin_commands).

Run as ``python -m launcher.doctor.health --backend local|aws ...`` (launcher/plans/slurm.health_check_argv).

Time. slurmd gives the program 60 s and kills it then: run_script_health_check runs it with
``.max_wait = 60 * 1000`` (ms; SchedMD/slurm src/slurmd/slurmd/slurmd.c, line 2924 at tag slurm-23-11-10-1, line
2870 at slurm-22-05-8-1, the release the rehearsal nodes run; only releases after 25.05 read a HealthCheckTimeout).
A killed check drains nothing and says nothing, so the check keeps a deadline of its own, DEADLINE_S, and gives
each probe a timeout under it: a probe that does not answer fails the checks that read it by name
("nvidia-smi did not answer in 30 s"), and the node drains with that reason. One exception: a probe still runnable
when its time ran out, on a node whose load average exceeds its CPUs, was starved, not hung: the program "will be
executed at the same time on all nodes" (slurm.conf(5)), and 64 rehearsal nodes share 2 cores, where 64 imports of
torch at 2.7 s of CPU each need 86 s. Its checks are reported unchecked this round; the node neither drains nor
resumes for them.

Cost. The probes run at once, each in its own process group. nvidia-smi runs once (one ``--query-gpu``): without
persistence mode the driver deinitializes the GPUs when the last client exits and every nvidia-smi initializes them
again, "a short (order of 1-3 second) startup cost per GPU due to ECC scrubbing" (NVIDIA, "Driver Persistence",
https://docs.nvidia.com/deploy/driver-persistence/index.html): 8-24 s on a p4d's 8 GPUs. The CUDA version the driver
supports, the header of a second, plain nvidia-smi before, is libcuda's cuDriverGetVersion here, which touches no
GPU. torch is imported once, in one child (checks.HOROVOD_BUILD_PY on AWS, horovod-python on the local backend),
where the AWS check imported it seven times (horovodrun --check-build's six children, and horovod-python, which no
AWS check read). In a child and not in this process: it costs one more interpreter start (0.04 s of CPU against the
import's 2.7 s, docs/benchmarks.md) and buys a timeout that can kill a hung import and a crash that cannot take the
check down with it. This process imports no torch, pydantic, rich, boto3 or numpy on the local backend; on AWS it
imports infra.catalog (pydantic), the instance type's GPUs and EFA devices the checks compare with.

Once a boot. What the import answers (Horovod's build, torch's presence) is the image's, and the image's files do not
change under a running instance; what does change under one (a GPU off the bus, an EFA device gone, the mount lost)
nvidia-smi, the fabric's and the storage's probes see at every interval. So an import that passed is kept for the
rest of the boot, in STATE_DIR under /run (a tmpfs, emptied at every boot: systemd's file-hierarchy(7)) with the
boot's id, and not run again until the next boot; one that failed or was cut short runs again at the next interval.
Every interval after the first then costs a few small processes, not 2.7 s of CPU: at slurm.conf's 120 s that is 2%
of a core per node, all the time, which on 64 rehearsal nodes sharing 2 cores was more than one of them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ami import paths
from launcher.doctor import checks
from launcher.plans import draining, slurm

# The launcher's working directory over SSH is not the node's health: a fresh node has none until a launcher
# connects.
NOT_HEALTH = ("workdir",)

DEADLINE_S = 45.0      # the whole check; slurmd kills it at 60 s (above), a loaded node's start-up needs the rest
PROBES_END_S = 36.0    # every probe answered or killed by then; the rest is for the two scontrol calls
SCONTROL_S = 4.0
DEFAULT_PROBE_S = 15.0
PROBE_S = {"nvidia-smi": 30.0}   # without persistence mode, 1-3 s per GPU to initialize, 8 GPUs (above)
# torch's import gets the probes' whole share: a fresh node reads its libraries from a lazily restored EBS volume.
IMPORTS = ("horovod-python", "horovod-build")
STATE_DIR = "/run/scaletrain"   # tmpfs: what is kept here lasts one boot
IMPORTS_KEPT = "health-imports.json"
FAILS_KEPT = "health-fails.json"   # this boot's failed checks in a row (plans/draining.health_replacement)
TIMED_OUT = 124        # coreutils timeout(1)'s status, for a probe this check killed
STARVED = 125          # ... for one it killed that was waiting for a CPU on an overloaded node (starved)
# What a probe runs, where its name does not say, for "X did not answer in N s".
TOOLS = {"horovod-python": checks.HOROVOD_BUILD_TOOL, "horovod-build": checks.HOROVOD_BUILD_TOOL,
         "kernel": "modinfo nvidia", "infiniband": "ls /sys/class/infiniband", "fi_version": "fi_info --version",
         "ldconfig": "ldconfig -p", "ofi-nccl": "ls aws-ofi-nccl", "storage": "findmnt",
         "storage-write": "a write to the shared file system", "shared-mount": "the shared mount",
         "image": "cat image.env"}
# The probes each check reads (checks.evaluate_aws, checks.evaluate_local): a failed check whose probe timed out
# says so, not what the missing output would otherwise mean ("no nvidia kernel module...").
READS = {"gpus": ("nvidia-smi",), "driver/cuda": ("nvidia-smi", "nvcc", "kernel", "image"),
         "efa devices": ("infiniband",), "libfabric efa": ("fi_info", "fi_version"), "nccl": ("ldconfig", "ofi-nccl"),
         "horovod": IMPORTS, "mpi": ("mpirun",), "shared storage": ("storage", "storage-write", "shared-mount")}


def health_probes(a: argparse.Namespace) -> dict[str, str]:
    """The probes this check runs: the doctor's, less those no check here reads; on AWS one nvidia-smi and one
    import of horovod.torch (checks.HOROVOD_BUILD_PY) for what horovodrun --check-build told."""
    probes = checks.probe_commands(a.backend, a.python, a.mpirun, shared_mount=a.shared_mount, workdir=False)
    if a.backend == "aws":
        # torch-arch: a CUDA context and a kernel on every GPU, under a running job, every two minutes; what it
        # answers is the image's, which `launch doctor` and the image test check.
        for unread in ("horovod-python", "nvidia-smi-header", "torch-arch") + (("storage", "storage-write")
                                                                 if (a.storage or "none") == "none" else ()):
            del probes[unread]
        probes["horovod-build"] = checks.horovod_build_command(a.python)
        # A reducer: what its checks skip is not probed (checks.evaluate_aws).
        if not gpu_type(getattr(a, "instance_type", None)):
            for unread in GPU_ONLY:
                probes.pop(unread, None)
    return probes


# The probes only a GPU type's checks read: the driver's, the toolkit's, NCCL's and Horovod's build.
GPU_ONLY = ("nvidia-smi", "nvcc", "kernel", "ldconfig", "ofi-nccl", "horovod-build", "image")


def gpu_type(instance_type: str | None) -> bool:
    """Whether the catalog's entry for this node's instance type has GPUs (no type given: a GPU node, as before)."""
    if not instance_type:
        return True
    from infra import catalog

    return catalog.get(instance_type).gpus > 0


def probe_limits(probes: dict[str, str], deadline: float) -> dict[str, float]:
    """Each probe's timeout in seconds, scaled with the deadline (DEADLINE_S gives the figures above)."""
    scale = deadline / DEADLINE_S
    end = PROBES_END_S * scale
    return {n: min(end, (PROBES_END_S if n in IMPORTS else PROBE_S.get(n, DEFAULT_PROBE_S)) * scale) for n in probes}


def boot_id() -> str:
    """This boot's id (proc(5), /proc/sys/kernel/random/boot_id): a kept result from another boot is not this one's."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def kept_imports(state_dir: str, probes: dict[str, str]) -> dict[str, checks.Probe]:
    """The import probes that passed earlier in this boot with the same command (see "Once a boot" above)."""
    try:
        with open(os.path.join(state_dir, IMPORTS_KEPT)) as f:
            kept = json.load(f)
        if kept["boot"] != boot_id():
            return {}
        return {name: checks.Probe(kept["probes"][name]["output"], 0) for name in IMPORTS
                if name in probes and kept["probes"].get(name, {}).get("command") == probes[name]}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def fails_in_a_row(state_dir: str) -> int:
    """This boot's health checks failed in a row before this one (none kept: none; another boot's: none)."""
    try:
        with open(os.path.join(state_dir, FAILS_KEPT)) as f:
            kept = json.load(f)
        return int(kept["fails"]) if kept["boot"] == boot_id() else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def keep_fails(state_dir: str, fails: int) -> None:
    with contextlib.suppress(OSError):
        os.makedirs(state_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=state_dir, delete=False, suffix=".tmp") as f:
            json.dump({"boot": boot_id(), "fails": fails}, f)
        os.replace(f.name, os.path.join(state_dir, FAILS_KEPT))


def drained_for_health(shown: str) -> tuple[int, int]:
    """(nodes drained by the health check, nodes) in `scontrol --oneliner show nodes`."""
    records = [slurm.fields(line.strip()) for line in shown.splitlines() if line.strip().startswith("NodeName=")]
    return sum(1 for r in records if slurm.health_restored(r)), len(records)


def keep_imports(state_dir: str, probes: dict[str, str], found: dict[str, checks.Probe]) -> None:
    """Keep the import probes that passed, atomically (a check killed half-way leaves the last whole record)."""
    passed = {name: {"command": probes[name], "output": found[name].output} for name in IMPORTS
              if name in found and found[name].rc == 0}
    if not passed:
        return
    with contextlib.suppress(OSError):
        os.makedirs(state_dir, mode=0o700, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=state_dir, prefix=f".{IMPORTS_KEPT}.")
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"boot": boot_id(), "probes": passed}, f)
            os.replace(tmp, os.path.join(state_dir, IMPORTS_KEPT))
        except OSError:
            os.unlink(tmp)


def run_probes(probes: dict[str, str], limits: dict[str, float], *, prefix: str = "") -> dict[str, checks.Probe]:
    """Every probe at once (``bash -c``), each in a process group of its own and writing to a file of its own (no
    pipe to fill); one not done within its limit is killed, group and all, and answers TIMED_OUT, or STARVED."""
    started = time.monotonic()
    running, found = {}, {}
    with contextlib.ExitStack() as files:
        for name, command in probes.items():
            out = files.enter_context(tempfile.TemporaryFile())
            running[name] = out, subprocess.Popen(["bash", "-c", prefix + command], stdin=subprocess.DEVNULL,
                                                  stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        for name, (out, proc) in running.items():
            try:
                rc = proc.wait(timeout=max(0.0, started + limits[name] - time.monotonic()))
            except subprocess.TimeoutExpired:
                why = starved(proc.pid)
                # Not waited for: a process stuck in the kernel (a wedged driver) outlives SIGKILL; init reaps it.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                tool, limit = TOOLS.get(name, name), f"{limits[name]:.3g}"
                found[name] = (checks.Probe(f"{tool} was starved of CPU for {limit} s ({why})\n", STARVED) if why
                               else checks.Probe(f"{tool} did not answer in {limit} s\n", TIMED_OUT))
            else:
                out.seek(0)
                found[name] = checks.Probe(out.read().decode(errors="replace"), rc)
    return found


def starved(pgid: int) -> str | None:
    """Why a probe that ran out of time was starved rather than hung, or None: a process of its group still runnable
    (state R in /proc/PID/stat: waiting for a CPU, not for a device or a disk, as a wedged nvidia-smi waits) on a
    node whose load average exceeds the CPUs this check may use."""
    load, cpus = os.getloadavg()[0], len(os.sched_getaffinity(0))
    if load <= cpus:
        return None
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state, _, group = f.read().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if state == "R" and int(group) == pgid:
            return f"load average {load:.1f} on {cpus} CPUs"
    return None


def cuda_driver_version() -> checks.Probe:
    """The CUDA version the driver supports, as plain nvidia-smi's header prints it ("CUDA Version: 12.8"), from
    libcuda's cuDriverGetVersion ("the latest CUDA version supported by driver", CUDA Driver API): it needs no
    cuInit and touches no GPU."""
    import ctypes

    version = ctypes.c_int()
    try:
        status = ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(version))
    except (OSError, AttributeError) as e:
        return checks.Probe(f"libcuda.so.1: {e}\n", 1)
    if status != 0:
        return checks.Probe(f"cuDriverGetVersion returned {status}\n", 1)
    return checks.Probe(f"CUDA Version: {version.value // 1000}.{version.value % 1000 // 10}\n", 0)


def evaluate(a: argparse.Namespace, probes: dict[str, checks.Probe]) -> list[checks.Check]:
    if a.backend == "aws":
        from infra import catalog

        found = checks.evaluate_aws(probes, catalog.get(a.instance_type), storage=a.storage or "none",
                                    efa_devices=a.efa_devices, horovod_tool=checks.HOROVOD_BUILD_TOOL)
    else:
        found = checks.evaluate_local(probes, a.python, shared_mount=a.shared_mount)
    return [c for c in found if c.name not in NOT_HEALTH]


def failures(found: list[checks.Check], probes: dict[str, checks.Probe]) -> tuple[list[tuple[str, str]],
                                                                                  list[tuple[str, str]]]:
    """(failed, unchecked): (checks, why) of each failure, and of each check left unchecked by a starved probe. A
    check whose probe timed out names the timeout; checks failing for the same reason share one entry (gpus,
    driver/cuda: nvidia-smi did not answer in 30 s)."""
    merged: dict[tuple[bool, str], list[str]] = {}
    for c in found:
        if not c.failed:
            continue
        read = [probes[p] for p in READS.get(c.name, ()) if p in probes]
        timed_out = [p.output.strip() for p in read if p.rc == TIMED_OUT]
        starved_ = [p.output.strip() for p in read if p.rc == STARVED]
        unchecked = bool(starved_) and not timed_out
        merged.setdefault((unchecked, "; ".join(timed_out or starved_) or c.detail), []).append(c.name)
    pairs = [(unchecked, (", ".join(names), detail)) for (unchecked, detail), names in merged.items()]
    return [p for u, p in pairs if not u], [p for u, p in pairs if u]


def scontrol(args: list[str], until: float) -> str:
    try:
        return subprocess.run(["scontrol", *args], capture_output=True, text=True,
                              timeout=max(0.5, until - time.monotonic())).stdout
    except subprocess.TimeoutExpired:
        print(f"scontrol {args[0]} did not answer", file=sys.stderr, flush=True)
        return ""


IMDS = "http://169.254.169.254/latest"


def mark_unhealthy(node: str, until: float, why: str = "is drained for replacement") -> None:
    """This node is drained with one of scaletrain's reasons and no job is left on it (launcher/plans/draining.py):
    its instance is marked Unhealthy, and its Auto Scaling group terminates and replaces it, as the local keeper
    replaces a rehearsal node. Its id and region come from IMDSv2 (a session token first: "PUT
    /latest/api/token", then "X-aws-ec2-metadata-token" on each request; EC2 User Guide, "Use the Instance Metadata
    Service to access instance metadata", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html);
    the call is the node's instance role's (infra/compute.NodeIdentity.allow_marking_unhealthy)."""
    import urllib.request

    from launcher.plans import imds

    def ask(path: str, token: str) -> str:
        request = urllib.request.Request(f"{IMDS}/meta-data/{path}", headers={imds.TOKEN_HEADER: token})
        with urllib.request.urlopen(request, timeout=2) as r:
            return r.read().decode().strip()
    try:
        put = urllib.request.Request(f"{IMDS}/api/token", method="PUT", headers={imds.TTL_HEADER: "60"})
        with urllib.request.urlopen(put, timeout=2) as r:
            token = r.read().decode().strip()
        instance_id, region = ask("instance-id", token), ask("placement/region", token)
    except OSError as e:
        print(f"scaletrain health: {node} {why}, but IMDS did not answer: {e}", flush=True)
        return
    try:
        done = subprocess.run(draining.unhealthy_argv(paths.AWS_CLI, instance_id, region), capture_output=True,
                              text=True, timeout=max(1.0, until - time.monotonic()))
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"scaletrain health: could not mark {instance_id} Unhealthy: {e}", flush=True)
        return
    print(f"scaletrain health: {node} ({instance_id}) {why}; "
          + ("marked Unhealthy for its Auto Scaling group" if done.returncode == 0
             else f"marking it Unhealthy failed: {(done.stderr or done.stdout).strip()[-300:]}"), flush=True)


def main(args: list[str] | None = None) -> int:
    started = time.monotonic()
    p = argparse.ArgumentParser(prog="python -m launcher.doctor.health")
    p.add_argument("--backend", choices=("local", "aws"), required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--mpirun", required=True)
    p.add_argument("--shared-mount")
    p.add_argument("--instance-type")
    p.add_argument("--storage")
    p.add_argument("--efa-devices", type=int)
    p.add_argument("--state-dir", default=STATE_DIR,
                   help=f"where an import that passed is kept for the rest of the boot (default {STATE_DIR})")
    p.add_argument("--deadline", type=float, default=DEADLINE_S,
                   help=f"seconds the whole check may take (default {DEADLINE_S:g}; slurmd kills it at 60)")
    a = p.parse_args(args)
    probes = health_probes(a)
    prefix = paths.path_export() if a.backend == "aws" else ""
    kept = kept_imports(a.state_dir, probes)
    to_run = {n: c for n, c in probes.items() if n not in kept}
    found = {**kept, **run_probes(to_run, probe_limits(to_run, a.deadline), prefix=prefix)}
    if not kept:
        keep_imports(a.state_dir, probes, found)
    if a.backend == "aws" and gpu_type(a.instance_type):
        found["nvidia-smi-header"] = cuda_driver_version()
    failed, unchecked = failures(evaluate(a, found), found)
    node = socket.gethostname().split(".")[0]
    scontrol_s = SCONTROL_S * a.deadline / DEADLINE_S
    if unchecked:
        print("scaletrain health: not checked this round: "
              + "; ".join(f"{names}: {why}" for names, why in unchecked), flush=True)
    if not failed and unchecked:
        return 0  # neither drained nor resumed for what it could not check, nor counted
    keep_fails(a.state_dir, fails := draining.health_fails(fails_in_a_row(a.state_dir), bool(failed)))
    if not failed:
        shown = scontrol(["--oneliner", "show", "node", node], min(time.monotonic() + scontrol_s,
                                                                  started + a.deadline))
        record = slurm.fields(shown.strip())
        if slurm.health_restored(record):  # it drained itself, and is well again
            scontrol(["update", f"NodeName={node}", "State=RESUME"], started + a.deadline)
        elif a.backend == "aws" and draining.to_replace({node: record}):  # a straggler, a short link: replaced
            mark_unhealthy(node, started + a.deadline)
        return 0
    reason = slurm.drain_reason(failed)
    print(reason, flush=True)
    scontrol(["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], started + a.deadline)
    if a.backend == "aws" and fails >= draining.HEALTH_FAILS_TO_REPLACE:
        shown = scontrol(["--oneliner", "show", "nodes"], min(time.monotonic() + scontrol_s, started + a.deadline))
        replace, line = draining.health_replacement(fails, *drained_for_health(shown))
        if replace:
            mark_unhealthy(node, started + a.deadline, why=line or "")
        elif line:
            print(f"scaletrain health: {node} {line}", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
