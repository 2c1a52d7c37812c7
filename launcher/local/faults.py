"""Fault drills on rehearsal nodes, executed: the cgroup files written and tc run as launcher/plans/faultdrill.py
decides. A node's processes are the ones in its cgroup v2 subtree (rehearsal_nodes.node_cgroup); its CPU quota lives
in a cgroup of this machine's v1 cpu controller named after its namespace, its freeze in its own v2 cgroup, its
shaping on both ends of its veth. What a drill made is undone by --clear, and by `launch local down` or a
replacement (release), so nothing stays on this machine."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

from launcher.cluster import Cluster, cluster_dir
from launcher.errors import LaunchError
from launcher.local import rehearsal_nodes as nodes_
from launcher.plans import faultdrill
from launcher.plans import rehearsal as plan

FREEZE_WAIT_S = 10.0


def cpu_controller_root() -> Path | None:
    """Where this machine mounts cgroup v1's cpu controller (alone, or as cpu,cpuacct), if it does."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields = right.split()
            if len(fields) >= 3 and fields[0] == "cgroup" and "cpu" in fields[2].split(","):
                return Path(left.split()[4])
    return None


def _cpu_cgroup(netns: str) -> Path | None:
    root = cpu_controller_root()
    return root / plan.CGROUP_PARENT / netns if root else None


def node_pids(netns: str) -> list[int]:
    """Every process of the node: its cgroup v2 subtree's members."""
    top = nodes_.node_cgroup(netns)
    pids: list[int] = []
    for d in [top, *nodes_.cgroup_tree(top)]:
        with contextlib.suppress(OSError):
            pids += [int(p) for p in (d / "cgroup.procs").read_text().split()]
    return pids


def _move(pids: list[int], procs: Path) -> int:
    moved = 0
    for pid in pids:
        try:
            procs.write_text(str(pid))
            moved += 1
        except OSError:  # it ended meanwhile
            pass
    return moved


def _record_path(c: Cluster, node: str) -> Path:
    return cluster_dir(c.name) / "faults" / f"{node}.json"


def active(c: Cluster, node: str) -> dict:
    """The drills in force on a node, as recorded when they were applied."""
    try:
        return json.loads(_record_path(c, node).read_text())
    except (OSError, ValueError):
        return {}


def _save(c: Cluster, node: str, rec: dict) -> None:
    p = _record_path(c, node)
    if not rec:
        with contextlib.suppress(OSError):
            p.unlink()
        return
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(rec))
    os.replace(tmp, p)


def apply(c: Cluster, d: faultdrill.Drill) -> str:
    """Apply one drill to a running rehearsal node; returns the line that says what was done."""
    assert c.rehearsal is not None
    netns = c.rehearsal.netns[d.node]
    pid = c.processes.get(d.node)
    if pid is None or not nodes_.is_ours(pid, netns):
        raise LaunchError(f"{d.node} is not running; `launch local status` shows the nodes")
    rec = active(c, d.node)
    if d.kind == "clear":
        release(netns, c.rehearsal.veth[d.node])
        _save(c, d.node, {})
        return d.describe() + (f" ({', '.join(sorted(rec))})" if rec else " (none was in force)")
    if d.kind == "cpu":
        _throttle(netns, *faultdrill.cpu_bandwidth(d.cpu_fraction or 1.0, c.node(d.node).cpus))
        rec["cpu"] = d.cpu_fraction
    elif d.kind == "net":
        _shape(netns, c.rehearsal.veth[d.node], d.rate_bps or 0)
        rec["net"] = d.rate_bps
    else:
        _freeze(netns, True)
        rec["freeze"] = True
    _save(c, d.node, rec)
    return d.describe()


def _throttle(netns: str, quota_us: int, period_us: int) -> None:
    cg = _cpu_cgroup(netns)
    if cg is None:
        raise LaunchError("--cpu needs cgroup v1's cpu controller on this machine (mounted under /sys/fs/cgroup); "
                          "none is mounted")
    cg.mkdir(parents=True, exist_ok=True)
    # Unlimited first: an earlier drill's quota never runs against the new period.
    (cg / "cpu.cfs_quota_us").write_text("-1")
    (cg / "cpu.cfs_period_us").write_text(str(period_us))
    (cg / "cpu.cfs_quota_us").write_text(str(quota_us))
    # A process forked while the others move stays where its parent was: move until a pass finds none left.
    for _ in range(10):
        inside = {int(p) for p in (cg / "cgroup.procs").read_text().split()}
        if not _move([p for p in node_pids(netns) if p not in inside], cg / "cgroup.procs"):
            break


def _shape(netns: str, veth: str, rate_bps: int) -> None:
    for argv in (faultdrill.tbf_args(veth, rate_bps),
                 ["ip", "netns", "exec", netns, *faultdrill.tbf_args("eth0", rate_bps)]):
        r = subprocess.run(argv, capture_output=True, text=True)
        if r.returncode != 0:
            raise LaunchError(f"could not shape {netns}'s link: {' '.join(argv)}: "
                              f"{(r.stderr or r.stdout).strip().splitlines()[-1:]}")


def _freeze(netns: str, frozen: bool) -> None:
    """cgroup-v2.rst: "cgroup.freeze ... Writing "1" to the file causes freezing of the cgroup and all descendant
    cgroups"; cgroup.events' "frozen" says when it took."""
    top = nodes_.node_cgroup(netns)
    try:
        (top / "cgroup.freeze").write_text("1" if frozen else "0")
    except OSError as e:
        if frozen:
            raise LaunchError(f"could not freeze {netns}: {e.strerror or e}") from None
        return
    deadline = time.monotonic() + FREEZE_WAIT_S
    want = f"frozen {int(frozen)}"
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            if want in (top / "cgroup.events").read_text().splitlines():
                return
        time.sleep(0.05)
    if frozen:
        raise LaunchError(f"{netns} did not freeze within {FREEZE_WAIT_S:g} s")


def release(netns: str, veth: str) -> None:
    """Undo every drill on a node (running or not): thawed, its CPU quota's cgroup emptied and removed, its link
    unshaped. Quiet where there was nothing to undo."""
    _freeze(netns, False)
    cg = _cpu_cgroup(netns)
    if cg is not None and cg.exists():
        with contextlib.suppress(OSError):
            pids = [int(p) for p in (cg / "cgroup.procs").read_text().split()]
            _move(pids, cg.parent.parent / "cgroup.procs")
        for _ in range(50):
            try:
                cg.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
        with contextlib.suppress(OSError):
            cg.parent.rmdir()  # when no other node's quota is in it
    for argv in (faultdrill.tbf_clear_args(veth), ["ip", "netns", "exec", netns, *faultdrill.tbf_clear_args("eth0")]):
        subprocess.run(argv, capture_output=True)
