"""The local backend: a cluster of real `sshd` processes on 127.0.0.1, one per node.

Each node gets its own port, host key, working directory and log; the cluster gets one user key pair,
an ssh_config and a known_hosts file holding the host keys generated here (pinned at creation, so no
connection ever accepts an unknown key). `down` stops exactly the processes `up` started.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher import render
from launcher.cluster import Cluster, Node, cluster_dir, load, save
from launcher.errors import LaunchError

SSHD = "/usr/sbin/sshd"
LOCAL = "local"


def node_names(nodes: int, reducers: int) -> list[tuple[str, str]]:
    """(name, role) for each node: workers node0.., then reducers reducer0.."""
    return [(f"node{i}", "worker") for i in range(nodes)] + [(f"reducer{i}", "reducer") for i in range(reducers)]


def cpus_per_node(total_cpus: int, nodes: int) -> int:
    """Local nodes share the machine's cores."""
    return max(1, total_cpus // nodes)


def port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def pick_ports(count: int, base_port: int | None) -> list[int]:
    if base_port is None:
        ports: list[int] = []
        socks = []
        try:
            for _ in range(count):  # hold them all open so the kernel hands out distinct ports
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.bind(("127.0.0.1", 0))
                socks.append(s)
                ports.append(s.getsockname()[1])
        finally:
            for s in socks:
                s.close()
        return ports
    if not 1024 <= base_port <= 65535 - count:
        raise LaunchError(f"--base-port must be within 1024..{65535 - count}, got {base_port}")
    ports = list(range(base_port, base_port + count))
    for p in ports:
        if not port_free(p):
            raise LaunchError(f"port {p} on 127.0.0.1 is already in use; choose a free range with --base-port "
                              f"or leave it out to pick free ports")
    return ports


def _alive(pid: int, marker: str) -> bool:
    """Is `pid` still the process we started (its command line names our config file)?"""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False
    return marker in cmdline


def _sshd_marker(directory: Path, node: str) -> str:
    return str(directory / "nodes" / node / "sshd_config")


def running_nodes(cluster: Cluster) -> list[str]:
    d = cluster_dir(cluster.name)
    return [n for n, pid in cluster.processes.items() if _alive(pid, _sshd_marker(d, n))]


def _stop_pids(pids: dict[str, int], directory: Path, timeout: float = 5.0) -> None:
    mine = {n: p for n, p in pids.items() if _alive(p, _sshd_marker(directory, n))}
    for pid in mine.values():
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for node, pid in mine.items():
        while _alive(pid, _sshd_marker(directory, node)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(pid, _sshd_marker(directory, node)):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):  # reap it when this process started it
            os.waitpid(pid, os.WNOHANG)


def _keygen(path: Path, comment: str) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return Path(f"{path}.pub").read_text()


def _wait_for_banner(port: int, proc: subprocess.Popen, log: Path, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            last = (log.read_text().strip().splitlines() or ["(no output)"])[-1]
            raise LaunchError(f"sshd on port {port} exited at start: {last}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                if s.recv(64).startswith(b"SSH-2.0"):
                    return
        except OSError:
            time.sleep(0.05)
    raise LaunchError(f"sshd on port {port} did not answer within {timeout:.0f} s; see {log}")


def up(nodes: int, reducers: int = 0, base_port: int | None = None, name: str = LOCAL) -> Cluster:
    if nodes < 1:
        raise LaunchError(f"--nodes must be >= 1, got {nodes}")
    if reducers < 0:
        raise LaunchError(f"--reducers must be >= 0, got {reducers}")
    if nodes + reducers > 64:
        raise LaunchError(f"--nodes + --reducers must be at most 64 on one machine, got {nodes + reducers}")
    if not os.access(SSHD, os.X_OK):
        raise LaunchError(f"no sshd at {SSHD}; install openssh-server (`make setup` does)")
    if shutil.which("ssh-keygen") is None:
        raise LaunchError("no ssh-keygen on PATH; install openssh-client")

    d = cluster_dir(name)
    if d.exists():
        try:
            old = load(name) if (d / "cluster.json").exists() else None
        except LaunchError:  # damaged state: nothing to keep
            old = None
        if old is not None and running_nodes(old):
            raise LaunchError(f"cluster '{name}' is already up ({len(old.nodes)} nodes); "
                              f"run `launch local down` first")
        # A crash (or a failed `up`) left state behind: stop whatever is left and start clean.
        _stop_pids(_recorded_pids(d, old), d)
        shutil.rmtree(d)

    roles = node_names(nodes, reducers)
    ports = pick_ports(len(roles), base_port)
    d.mkdir(parents=True, mode=0o700)
    user = getpass.getuser()
    identity = d / "id_ed25519"
    user_pub = _keygen(identity, f"scaletrain-{name}")
    (d / "authorized_keys").write_text(user_pub)
    cpus = cpus_per_node(os.cpu_count() or 1, len(roles))

    node_models, host_keys, procs = [], [], {}
    try:
        for (node, role), port in zip(roles, ports, strict=True):
            nd = d / "nodes" / node
            workdir = nd / "work"
            workdir.mkdir(parents=True)
            host_pub = _keygen(nd / "ssh_host_ed25519_key", f"scaletrain-{name}-{node}")
            host_keys.append(("127.0.0.1", port, host_pub))
            cfg = nd / "sshd_config"
            cfg.write_text(render.sshd_config(
                name, node, port=port, host_key=str(nd / "ssh_host_ed25519_key"), pid_file=str(nd / "sshd.pid"),
                authorized_keys=str(d / "authorized_keys"), user=user, workdir=str(workdir)))
            if os.geteuid() == 0:
                Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
            log = nd / "sshd.log"
            with open(log, "wb") as logf:
                proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                        stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
            procs[node] = proc
            (nd / "launcher.pid").write_text(f"{proc.pid}\n")
            _wait_for_banner(port, proc, log)
            node_models.append(Node(name=node, address="127.0.0.1", port=port, role=role, slots=1, cpus=cpus,
                                    workdir=str(workdir)))
        (d / "known_hosts").write_text(render.known_hosts(host_keys))
        (d / "ssh_config").write_text(render.ssh_config(
            name, [(n.name, n.address, n.port) for n in node_models], user=user,
            identity_file=str(identity), known_hosts=str(d / "known_hosts")))
    except BaseException:
        _stop_pids({n: p.pid for n, p in procs.items()}, d)
        shutil.rmtree(d, ignore_errors=True)
        raise
    cluster = Cluster(name=name, backend="local", nodes=node_models, user=user, ssh_config=str(d / "ssh_config"),
                      known_hosts=str(d / "known_hosts"), python=sys.executable, mpi_interface="lo",
                      processes={n: p.pid for n, p in procs.items()})
    save(cluster)
    return cluster


def _recorded_pids(d: Path, cluster: Cluster | None) -> dict[str, int]:
    """Every sshd pid recorded for the cluster: per-node pid files (written as each node starts, so a crash
    mid-`up` leaves them) and the cluster's own record."""
    pids = {}
    for f in (d / "nodes").glob("*/launcher.pid"):
        with contextlib.suppress(ValueError):
            pids[f.parent.name] = int(f.read_text())
    return {**pids, **(cluster.processes if cluster else {})}


def down(cluster: Cluster) -> int:
    """Stop the cluster's sshd processes and remove its state. Returns how many were running."""
    d = cluster_dir(cluster.name)
    pids = _recorded_pids(d, cluster)
    running = len([1 for n, p in pids.items() if _alive(p, _sshd_marker(d, n))])
    _stop_pids(pids, d)
    shutil.rmtree(d, ignore_errors=True)
    return running
