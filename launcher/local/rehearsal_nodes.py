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
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import LaunchError
from launcher.local.rehearsal_root import Layers, run_tool
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


@dataclass(frozen=True)
class Booted:
    pid: int                                 # unshare's pid on this machine: the node ends with it
    host_keys: list[str]


def boot(node: str, netns: str, address: str, layers: Layers, node_dir: Path, shared: Path, authorized_key: str,
         timeout_s: float = 30.0, *, files: dict[str, tuple[bytes, int]] | None = None,
         services: tuple[str, ...] = ()) -> Booted:
    """Boot one node in its namespace and wait until its sshd answers; its host keys from what it printed.
    ``files``: path on the node -> (content, mode), put in place before it boots, as a node's user data fetches them
    from the cluster's side (the munge key, the controller's slurm.conf); ``services``: daemons it starts."""
    upper, work, merged = node_dir / "upper", node_dir / "work", node_dir / "merged"
    for d in (upper, work, merged):
        d.mkdir(parents=True, exist_ok=True)
    ssh = upper / "root/.ssh"
    ssh.mkdir(parents=True, mode=0o700, exist_ok=True)
    (ssh / "authorized_keys").write_text(authorized_key)  # as EC2 puts the launch's key pair (cloud-init)
    (ssh / "authorized_keys").chmod(0o600)
    for path, (content, mode) in (files or {}).items():
        target = upper / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(mode)
    script = node_dir / "boot.sh"
    script.write_text(plan.boot_script(node=node, lowerdirs=layers.lowerdirs(), upper=str(upper), work=str(work),
                                       merged=str(merged), shared=str(shared), services=services))
    console = node_dir / "console.log"
    with open(console, "wb") as out:
        proc = subprocess.Popen(["ip", "netns", "exec", netns, "unshare", "--mount", "--uts", "--ipc", "--pid",
                                 "--fork", "--kill-child", "--", "bash", str(script)],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    (node_dir / "unshare.pid").write_text(f"{proc.pid}\n")  # before waiting: a crash mid-boot still finds it
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = console.read_text(errors="replace")
        if proc.poll() is not None:
            raise LaunchError(f"{node} did not boot: {plan.last_lines(text)} (console: {console})")
        if plan.sshd_listening(text) and _banner(address):
            from launcher.cluster.aws.access import host_keys_from_console
            return Booted(proc.pid, host_keys_from_console(text))
        time.sleep(0.1)
    stop(proc.pid)
    raise LaunchError(f"{node} did not answer on {address}:22 within {timeout_s:.0f} s; console: {console}")


def _banner(address: str) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=1) as s:
            return s.recv(64).startswith(b"SSH-2.0")
    except OSError:
        return False


def is_ours(pid: int, netns: str) -> bool:
    """Is `pid` still the unshare we started for this node (its command line names the node's namespace or boot
    script)? Guards against a recycled pid."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return "unshare" in cmdline and "boot.sh" in cmdline and (netns in cmdline or "--kill-child" in cmdline)


def stop(pid: int, timeout_s: float = 5.0) -> None:
    """End a node at once, as an instance stops: SIGKILL to unshare, whose --kill-child takes the node's pid 1,
    and with it every process in the node's PID namespace."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                return
        if not Path(f"/proc/{pid}").exists():
            return
        time.sleep(0.05)
