"""Rehearsal nodes, running: the cluster's bridge, each node's namespace and veth, its boot and its end.

The decisions (names, addresses, the boot script) are in launcher/plans/rehearsal.py; the root the nodes boot from
is built by launcher/local/rehearsal_root.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LaunchError
from launcher.local.rehearsal_root import Layers, run_tool
from launcher.plans import bootlog
from launcher.plans import rehearsal as plan

# -- the network and the nodes ---------------------------------------------------------------------------------------

def host_routes() -> list[str]:
    out = run_tool(["ip", "-j", "route", "show"], "reading the host's routes")
    return [r.get("dst", "") for r in json.loads(out or "[]")]


def link_exists(name: str) -> bool:
    return subprocess.run(["ip", "link", "show", name], capture_output=True).returncode == 0


def netns_exists(name: str) -> bool:
    return name in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def make_network(netw: plan.Network) -> None:
    if link_exists(netw.bridge):
        raise LaunchError(f"a network interface named {netw.bridge} already exists; `launch local down` removes "
                          f"a rehearsal cluster's, or give this cluster another --name")
    used = plan.overlapping(netw.subnet, host_routes())
    if used:
        raise LaunchError(f"--subnet {netw.subnet} overlaps {', '.join(used)}, already routed on this machine; "
                          f"choose a free private subnet with --subnet")
    for cmd in plan.network_commands(netw):
        run_tool(cmd, f"making bridge {netw.bridge}")


# One lock for the machine between choosing a cluster's subnet and its bridge holding it (the bridge's address is the
# route the next cluster's free_subnet sees): two `launch local up`s at once, by one user or two (each its own HOME),
# otherwise both take the first free subnet and the second fails with the overlap line, naming a --subnet it was
# never given. /run/lock is the machine's lock directory (FHS 3.0, 5.9; a tmpfs, gone at reboot as the bridges are).
NETWORK_LOCK = "scaletrain-rehearsal-network.lock"


def network_lock_path() -> Path:
    d = Path("/run/lock")
    return (d if d.is_dir() else Path(tempfile.gettempdir())) / NETWORK_LOCK


def claim_network(key: str, names: list[str], subnet: str | None) -> plan.Network:
    """The cluster's network made: ``subnet``, or the first one no route of this machine overlaps, chosen and its
    bridge made under the machine's lock (NETWORK_LOCK)."""
    import fcntl

    with open(network_lock_path(), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        netw = plan.network(key, names, subnet or plan.free_subnet(host_routes()))
        make_network(netw)
        return netw


def remove_network(bridge: str) -> None:
    if link_exists(bridge):
        subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def make_node_net(netw: plan.Network, node: plan.NodeNet) -> None:
    if netns_exists(node.netns):
        raise LaunchError(f"network namespace {node.netns} already exists; `launch local down` removes it")
    for cmd in plan.node_net_commands(netw, node):
        run_tool(cmd, f"making {node.name}'s network")


def remove_node_net(node_netns: str, veth: str) -> None:
    if link_exists(veth):
        subprocess.run(["ip", "link", "del", veth], capture_output=True)
    if netns_exists(node_netns):
        subprocess.run(["ip", "netns", "del", node_netns], capture_output=True)


def inotify_in_use() -> int:
    """inotify instances root's processes hold now (each an fd linking to anon_inode:inotify), the count
    fs.inotify.max_user_instances limits for them."""
    count = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != 0:
                continue
            for fd in os.scandir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    count += os.readlink(fd.path) == "anon_inode:inotify"
        except OSError:  # the process ended while read
            continue
    return count


def check_inotify(nodes: int) -> None:
    """Refuse, in one line, to boot nodes whose systemd would find no inotify instance left."""
    try:
        limit = int(Path(plan.INOTIFY_LIMIT).read_text())
    except (OSError, ValueError):
        return
    said = plan.inotify_shortfall(nodes, limit, inotify_in_use())
    if said:
        raise LaunchError(said)


@dataclass(frozen=True)
class Booted:
    pid: int                                 # unshare's pid on this machine: the node ends with it
    host_keys: list[str]


def cgroup_root() -> Path:
    """Where this machine's cgroup2 hierarchy is mounted (/sys/fs/cgroup on a unified host; /sys/fs/cgroup/unified
    beside cgroup v1 controllers)."""
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 2 and parts[2] == "cgroup2":
            return Path(parts[1])
    raise LaunchError("rehearsal nodes need a cgroup2 hierarchy on this machine (mount -t cgroup2 none "
                      "/sys/fs/cgroup/unified) for their systemd; none is mounted")


def node_cgroup(netns: str) -> Path:
    return cgroup_root() / plan.CGROUP_PARENT / netns


def cgroup_tree(top: Path) -> list[Path]:
    """The cgroups under `top`, deepest first. A cgroup goes away when the kernel has reaped its last process, so one
    listed a moment ago may be gone when it is read: it is skipped, not an error (it was the 64-node down's
    traceback)."""
    found, todo = [], [top]
    while todo:
        d = todo.pop()
        try:
            subs = [e.path for e in os.scandir(d) if e.is_dir(follow_symlinks=False)]
        except OSError:
            continue
        found += [Path(s) for s in subs]
        todo += subs
    return sorted(found, key=lambda p: -len(p.parts))


def remove_cgroup(netns: str, timeout_s: float = 5.0) -> None:
    """Remove a stopped node's cgroup and the ones its systemd made under it, deepest first."""
    with contextlib.suppress(LaunchError):
        top = node_cgroup(netns)
        deadline = time.monotonic() + timeout_s
        while top.exists() and time.monotonic() < deadline:
            for d in cgroup_tree(top):
                with contextlib.suppress(OSError):
                    d.rmdir()
            with contextlib.suppress(OSError):
                top.rmdir()
            if top.exists():
                time.sleep(0.1)


def remove_cgroup_parent() -> None:
    with contextlib.suppress(LaunchError, OSError):
        (cgroup_root() / plan.CGROUP_PARENT).rmdir()


def init_pid(pid: int) -> int | None:
    """The node's PID 1 (systemd) as this machine numbers it: unshare's one child."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
    return None


def node_file(pid: int, path: str) -> Path | None:
    """A file as the running node sees it (its mount namespace's root, through /proc)."""
    init = init_pid(pid)
    return Path(f"/proc/{init}/root{path}") if init else None


def boot(node: str, netns: str, address: str, layers: Layers, node_dir: Path, timeout_s: float = 60.0, *,
         files: dict[str, tuple[bytes, int]] | None = None, first: bool = True) -> Booted:
    """Boot one node in its namespace and wait until cloud-init has finished and its sshd answers; its host keys
    from what cloud-init printed on its console. ``files``: path on the node -> (content, mode), put on its disk
    before the first boot (the seed cloud-init reads: launcher/plans/rehearsal.py, seed_files). ``first``: False
    boots the same disk again (a reboot): cloud-init does not run the user data again, and prints no keys."""
    upper, work, merged = node_dir / "upper", node_dir / "work", node_dir / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    for path, (content, mode) in (files or {}).items():
        target = upper / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
    script = node_dir / "boot.sh"
    script.write_text(plan.boot_script(node=node, lowerdirs=layers.lowerdirs(), upper=str(upper), work=str(work),
                                       merged=str(merged)))
    cgroup = node_cgroup(netns)
    cgroup.mkdir(parents=True, exist_ok=True)
    console = node_dir / "console.log"
    with open(console, "ab") as out:
        start = out.tell()
        offsets = plan.clock_offsets(time.clock_gettime(time.CLOCK_BOOTTIME), time.clock_gettime(time.CLOCK_MONOTONIC))
        proc = subprocess.Popen(plan.boot_command(netns, str(cgroup), str(script), offsets), stdin=subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    (node_dir / "unshare.pid").write_text(f"{proc.pid}\n")  # before waiting: a crash mid-boot still finds it

    def this_boot() -> str:
        """What the node printed on its console since this boot began."""
        return console.read_bytes()[start:].decode(errors="replace")

    deadline = time.monotonic() + timeout_s
    result = None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise LaunchError(f"{node} did not boot (exit {proc.returncode}): {bootlog.last_lines(this_boot())}")
        if result is None:
            f = node_file(proc.pid, plan.CLOUD_RESULT)
            with contextlib.suppress(OSError, ValueError):
                result = json.loads(f.read_text()) if f else None
        if result is not None:
            failure = bootlog.cloud_failure(result)
            if failure:
                out = upper / plan.CLOUD_OUTPUT_LOG.lstrip("/")
                tail = bootlog.user_data_output(out.read_text(errors="replace")) if out.exists() else "(no output)"
                stop(proc.pid)
                raise LaunchError(f"{node}'s user data failed: {tail}; cloud-init status: error ({failure}); "
                                  f"output: {out}")
            if _banner(address):
                from launcher.cluster.aws.access import host_keys_from_console
                return Booted(proc.pid, host_keys_from_console(this_boot()) if first else [])
        time.sleep(0.1)
    answering = _banner(address)
    stop(proc.pid)
    # The console's last lines in the message: a failed `launch local up` removes the cluster (its logs kept aside).
    raise LaunchError(f"{node} did not finish booting within {timeout_s:.0f} s (cloud-init "
                      f"{'done' if result is not None else 'not done'}, ssh on {address}:22 "
                      f"{'answering' if answering else 'not answering'}); its console's last lines: "
                      f"{bootlog.last_lines(this_boot())}")


def _banner(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-2.0")
    except OSError:
        return False


def is_ours(pid: int, netns: str) -> bool:
    """Is `pid` still an unshare we started for a node (its command line: unshare --kill-child ... boot.sh)? Guards
    against a recycled pid. ``netns`` is no longer in that command line (`ip netns exec` has exec'd unshare)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "unshare" in cmdline and "boot.sh" in cmdline and "--kill-child" in cmdline


def _ended(pid: int, timeout_s: float, every_s: float) -> bool:
    """Wait up to ``timeout_s`` for unshare ``pid`` to end (reaped if it is our child)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return True
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(every_s)
    return False


def shutdown(pid: int, timeout_s: float = 30.0) -> None:
    """Shut a node down as `systemctl poweroff` does (SIGRTMIN+4 to its systemd: "Enters poweroff.target",
    systemd(1), Signals), every unit stopped in order; what has not ended in ``timeout_s`` is killed."""
    init = init_pid(pid)
    if init:
        with contextlib.suppress(ProcessLookupError):
            os.kill(init, signal.SIGRTMIN + 4)
    if not _ended(pid, timeout_s, 0.1):
        stop(pid)


def stop(pid: int, timeout_s: float = 5.0) -> None:
    """End a node at once, as an instance stops: SIGKILL to unshare, whose --kill-child takes the node's pid 1,
    and with it every process in the node's PID namespace."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _ended(pid, timeout_s, 0.05)
