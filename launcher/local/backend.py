"""The local backend: a cluster of real `sshd` processes on 127.0.0.1, one per node.

Each node gets its own port, host key, working directory and log; the cluster gets one user key pair,
an ssh_config and a known_hosts file holding the host keys generated here (pinned at creation, so no
connection ever accepts an unknown key). `replace` starts a dead node afresh (new port, new host key, the old
key unpinned), as an Auto Scaling group replaces an instance. `down` stops exactly the processes these started.
"""

from __future__ import annotations

import base64
import contextlib
import getpass
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher import render
from launcher.cluster import Cluster, Node, cluster_dir, load, save
from launcher.errors import LaunchError
from launcher.files import keygen, write_atomic

SSHD = "/usr/sbin/sshd"
LOCAL = "local"
# A local cluster's name is a directory under $SCALETRAIN_HOME/clusters and what --cluster names: a plain name, never
# a path ('../x') or an empty one ('' is the clusters directory itself).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


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
    if cluster.rehearsal is not None:
        from launcher.local import rehearsal_cluster as local_rehearsal

        return local_rehearsal.running_nodes(cluster)
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


def _check_tools() -> None:
    if not os.access(SSHD, os.X_OK):
        raise LaunchError(f"no sshd at {SSHD}; install openssh-server (`make setup` does)")
    if shutil.which("ssh-keygen") is None:
        raise LaunchError("no ssh-keygen on PATH; install openssh-client")


def local_mpirun() -> str:
    """This machine's mpirun by absolute path (Debian's openmpi-bin: /usr/bin/mpirun), recorded on the cluster so
    that plans never name a bare ``mpirun`` for a node's shell to look up."""
    found = shutil.which("mpirun")
    if found is None:
        raise LaunchError("no mpirun on PATH; install openmpi-bin (`make setup` does)")
    return os.path.abspath(found)


def _start_node(d: Path, cluster: str, node: str, role: str, port: int, user: str, cpus: int
                ) -> tuple[Node, str, subprocess.Popen]:
    """One node from nothing, as a new instance boots: a fresh working directory and host key, its sshd answering
    on `port`. Returns (the node, its public host key, the sshd process)."""
    nd = d / "nodes" / node
    workdir = nd / "work"
    workdir.mkdir(parents=True)
    host_pub = keygen(nd / "ssh_host_ed25519_key", f"scaletrain-{cluster}-{node}")
    cfg = nd / "sshd_config"
    cfg.write_text(render.sshd_config(
        cluster, node, port=port, host_key=str(nd / "ssh_host_ed25519_key"), pid_file=str(nd / "sshd.pid"),
        authorized_keys=str(d / "authorized_keys"), user=user, workdir=str(workdir)))
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    log = nd / "sshd.log"
    with open(log, "wb") as logf:
        proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(cfg)], stdin=subprocess.DEVNULL,
                                stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
    (nd / "launcher.pid").write_text(f"{proc.pid}\n")  # before waiting: a crash mid-start still finds it
    try:
        _wait_for_banner(port, proc, log)
    except BaseException:
        # Stopped through the Popen, not _stop_pids: a child that has not exec'ed sshd yet does not carry the
        # config path _stop_pids recognises ours by, and would be left to start sshd unwatched.
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise
    return (Node(name=node, address="127.0.0.1", port=port, role=role, slots=1, cpus=cpus, workdir=str(workdir)),
            host_pub, proc)


def ssh_files(cluster: Cluster, host_keys: dict[str, str]) -> tuple[str, str]:
    """(ssh_config, known_hosts) for the nodes as they are now: each node's current port, only its current host key."""
    identity = str(Path(cluster.ssh_config).with_name("id_ed25519"))
    config = render.ssh_config(cluster.name, [(n.name, n.address, n.port) for n in cluster.nodes],
                               user=cluster.user, identity_file=identity, known_hosts=cluster.known_hosts)
    return config, render.known_hosts([(n.address, n.port, host_keys[n.name]) for n in cluster.nodes])


def check_name(name: str) -> None:
    """A cluster name `launch local up --name` may make (NAME); else one line saying what is allowed."""
    if not NAME.fullmatch(name):
        raise LaunchError(f"--name must be a plain cluster name: letters, digits, - and _, starting with a letter or "
                          f"digit, at most 64 characters; got {name!r}")


def up(nodes: int, reducers: int = 0, base_port: int | None = None, name: str = LOCAL, *, loopback: bool = False,
       subnet: str | None = None, with_slurm: bool = False) -> Cluster:
    """Rehearsal nodes (launcher/local/rehearsal_cluster.py), or with ``loopback`` sshd processes on 127.0.0.1 that
    share this machine's filesystem (for tests of the launcher's own logic)."""
    check_name(name)
    if nodes < 1:
        raise LaunchError(f"--nodes must be >= 1, got {nodes}")
    if reducers < 0:
        raise LaunchError(f"--reducers must be >= 0, got {reducers}")
    if nodes + reducers > 64:
        raise LaunchError(f"--nodes + --reducers must be at most 64 on one machine, got {nodes + reducers}")
    if not loopback and base_port is not None:
        raise LaunchError("--base-port is for --loopback nodes; rehearsal nodes each answer on port 22 of their "
                          "own address")
    if loopback and subnet is not None:
        raise LaunchError("--subnet is for rehearsal nodes; --loopback nodes are on 127.0.0.1")
    if loopback and with_slurm:
        raise LaunchError("--slurm is for rehearsal nodes (each runs its own slurmd); --loopback nodes share this "
                          "machine and run none")
    d = cluster_dir(name)
    if not loopback:
        from launcher.local import rehearsal_cluster as local_rehearsal

        if d.exists():
            try:
                old = load(name) if (d / "cluster.json").exists() else None
            except LaunchError:
                old = None
            if old is not None and (running_nodes(old)):
                raise LaunchError(f"cluster '{name}' is already up ({len(old.nodes)} nodes); "
                                  f"run `launch local down` first")
            if old is not None and old.rehearsal is None:
                _stop_pids(_recorded_pids(d, old), d)
            local_rehearsal.clean(d)
        return local_rehearsal.up(nodes, reducers, name, subnet, with_slurm=with_slurm)
    _check_tools()
    mpirun = local_mpirun()

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
    user_pub = keygen(identity, f"scaletrain-{name}")
    (d / "authorized_keys").write_text(user_pub)
    cpus = cpus_per_node(os.cpu_count() or 1, len(roles))

    node_models, host_keys, procs = [], {}, {}
    try:
        for (node, role), port in zip(roles, ports, strict=True):
            n, host_keys[node], procs[node] = _start_node(d, name, node, role, port, user, cpus)
            node_models.append(n)
        cluster = Cluster(name=name, backend="local", nodes=node_models, user=user,
                          ssh_config=str(d / "ssh_config"), known_hosts=str(d / "known_hosts"),
                          python=sys.executable, mpirun=mpirun, mpi_interface="lo",
                          processes={n: p.pid for n, p in procs.items()})
        config, known = ssh_files(cluster, host_keys)
        (d / "known_hosts").write_text(known)
        (d / "ssh_config").write_text(config)
    except BaseException:
        _stop_pids({n: p.pid for n, p in procs.items()}, d)
        shutil.rmtree(d, ignore_errors=True)
        raise
    save(cluster)
    return cluster


def to_replace(cluster: Cluster, requested: list[str], running: set[str]) -> list[str]:
    """Which nodes `launch local replace` starts afresh, in cluster order: the named ones, or with none named every
    node whose sshd is gone. Naming an unknown node or one still running is an error."""
    for name in requested:
        cluster.node(name)  # an unknown name is one line naming the nodes there are
    alive = [n for n in cluster.names() if n in requested and n in running]
    if alive:
        raise LaunchError(f"{', '.join(alive)} of cluster '{cluster.name}' {'is' if len(alive) == 1 else 'are'} "
                          f"still running; only a node whose sshd died can be replaced "
                          f"(`launch local replace` with no names replaces every dead node)")
    return [n for n in cluster.names() if (n in requested if requested else n not in running)]


def fresh_ports(count: int, avoid: set[int]) -> list[int]:
    """`count` free ports none of which is in `avoid` (a replaced node's old port may be free again)."""
    return [p for p in pick_ports(count + len(avoid), None) if p not in avoid][:count]


def fingerprint(public_key: str) -> str:
    """OpenSSH's SHA256 fingerprint of a `TYPE BASE64 [comment]` public key line."""
    blob = base64.b64decode(public_key.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class Replaced:
    node: str
    old_port: int
    port: int
    pid: int
    fingerprint: str                         # of the new host key, now the only one pinned for the node


def replace(cluster: Cluster, requested: list[str]) -> tuple[Cluster, list[Replaced]]:
    """Start dead nodes afresh, as an Auto Scaling group replaces an instance: each on a new port with a new host
    key and an empty working directory; ssh_config, known_hosts (new key pinned, old one gone) and cluster.json
    are rewritten atomically. Nothing changes when a node fails to start."""
    d = cluster_dir(cluster.name)
    names = to_replace(cluster, requested, set(running_nodes(cluster)))
    if not names:
        return cluster, []
    if cluster.rehearsal is not None:
        from launcher.local import rehearsal_cluster as local_rehearsal

        new, keys = local_rehearsal.replace(cluster, names)
        return new, [Replaced(n, 22, 22, new.processes[n], fingerprint(keys[n][0]) if keys[n] else "")
                     for n in names]
    _check_tools()
    ports = fresh_ports(len(names), {n.port for n in cluster.nodes})
    files = {Path(cluster.ssh_config): Path(cluster.ssh_config).read_text(),
             Path(cluster.known_hosts): Path(cluster.known_hosts).read_text()}
    parked: dict[str, Path] = {}
    started: dict[str, tuple[Node, str, subprocess.Popen]] = {}
    attempted: list[str] = []
    try:
        for name, port in zip(names, ports, strict=True):
            old = cluster.node(name)
            nd = d / "nodes" / name
            attempted.append(name)
            if nd.exists():  # the dead node's disk, kept until its replacement answers
                parked[name] = nd.rename(nd.with_name(f".{name}.replaced"))
            started[name] = _start_node(d, cluster.name, name, old.role, port, cluster.user, old.cpus)
        new = cluster.model_copy(update={
            "nodes": [started[n.name][0] if n.name in started else n for n in cluster.nodes],
            "processes": {**cluster.processes, **{n: s[2].pid for n, s in started.items()}}})
        keys = {n: started[n][1] if n in started else (d / "nodes" / n / "ssh_host_ed25519_key.pub").read_text()
                for n in new.names()}
        config, known = ssh_files(new, keys)
        write_atomic(Path(new.known_hosts), known)
        write_atomic(Path(new.ssh_config), config)
        save(new)
    except BaseException:
        _stop_pids({n: s[2].pid for n, s in started.items()}, d)
        for name in attempted:
            shutil.rmtree(d / "nodes" / name, ignore_errors=True)
            if name in parked:
                parked[name].rename(d / "nodes" / name)
        for path, text in files.items():
            write_atomic(path, text)
        raise
    for park in parked.values():
        shutil.rmtree(park, ignore_errors=True)
    return new, [Replaced(n, cluster.node(n).port, new.node(n).port, new.processes[n], fingerprint(started[n][1]))
                 for n in names]


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        found.append(p)
        todo += children.get(p, [])
    return found


def kill(cluster: Cluster, node: str) -> None:
    """Stop one node as a reclaimed instance stops: every process at once, SIGKILL, no clean shutdown. A rehearsal
    node's first process takes its PID namespace, and every process in it, with it; a loopback node's sshd and
    everything under it are killed together. Its disk stays, as an instance's does until it is replaced."""
    cluster.machine(node)  # an unknown name is one line naming the nodes there are (the head node is one)
    if node not in running_nodes(cluster):
        raise LaunchError(f"{node} of cluster '{cluster.name}' is not running; `launch local replace {node}` "
                          f"boots it again")
    pid = cluster.processes[node]
    if cluster.rehearsal is not None:
        from launcher.local import rehearsal_nodes

        rehearsal_nodes.stop(pid)
        return
    for victim in [pid, *descendants(pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _recorded_pids(d: Path, cluster: Cluster | None) -> dict[str, int]:
    """Every sshd pid recorded for the cluster: per-node pid files (written as each node starts, so a crash
    mid-`up` leaves them) and the cluster's own record."""
    pids = {}
    for f in (d / "nodes").glob("*/launcher.pid"):
        with contextlib.suppress(ValueError):
            pids[f.parent.name] = int(f.read_text())
    return {**pids, **(cluster.processes if cluster else {})}


def down(cluster: Cluster) -> int:
    """Stop the cluster's nodes and remove its state. Returns how many were running."""
    if cluster.rehearsal is not None:
        from launcher.local import rehearsal_cluster as local_rehearsal

        return local_rehearsal.down(cluster)
    d = cluster_dir(cluster.name)
    pids = _recorded_pids(d, cluster)
    running = len([1 for n, p in pids.items() if _alive(p, _sshd_marker(d, n))])
    _stop_pids(pids, d)
    shutil.rmtree(d, ignore_errors=True)
    return running


def replace_local(c: Cluster, lost: list[str]) -> Cluster:
    """A lost local node, as its Auto Scaling group would: stopped if it still runs (hung), then booted afresh."""
    running = set(running_nodes(c))
    for name in lost:
        if name in running:
            kill(c, name)
    new, replaced = replace(c, lost)
    for r in replaced:
        print(f"[launch] {r.node} replaced: {new.node(r.node).address}:{r.port}, host key {r.fingerprint} pinned",
              flush=True)
    return new
