"""The thin shell that runs commands on nodes: fabric over the cluster's ssh_config, host keys pinned.

fabric's Connection accepts unknown host keys by default (AutoAddPolicy); every connection made here
loads the cluster's known_hosts and rejects any key not in it.
"""

from __future__ import annotations

import contextlib
import shlex
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from fabric import Config, Connection, ThreadingGroup
from fabric.exceptions import GroupException
from paramiko import RejectPolicy

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError


def _pin(conn: Connection, cluster: Cluster) -> Connection:
    conn.client.get_host_keys().clear()
    conn.client.load_host_keys(cluster.known_hosts)
    conn.client.set_missing_host_key_policy(RejectPolicy())
    return conn


def _config(cluster: Cluster) -> Config:
    return Config(runtime_ssh_path=cluster.ssh_config,
                  overrides={"connect_kwargs": {"look_for_keys": False, "allow_agent": False},
                             "timeouts": {"connect": 15}, "load_ssh_configs": True})


def connect(cluster: Cluster, node: Node) -> Connection:
    return _pin(Connection(node.name, config=_config(cluster)), cluster)


def in_workdir(node: Node, command: str) -> str:
    """The shell line that runs `command` in the node's working directory."""
    return f"cd {shlex.quote(node.workdir)} && {command}"


@dataclass(frozen=True)
class NodeResult:
    node: str
    exit_code: int          # -1: could not connect or run
    stdout: str
    stderr: str
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


def run_all(cluster: Cluster, nodes: list[Node], command: str) -> list[NodeResult]:
    """`command` on every node at once (fabric ThreadingGroup), each in its working directory.

    One command line serves the whole group, so the working directory comes from the node's environment
    (SCALETRAIN_WORKDIR, set by the local sshd and by the AWS image), not from per-node text.
    """
    conns = {n.name: connect(cluster, n) for n in nodes}
    node_of = {id(c): name for name, c in conns.items()}
    group = ThreadingGroup.from_connections(list(conns.values()))
    try:
        results = group.run('cd "${SCALETRAIN_WORKDIR:-$HOME}" && ' + command, hide=True, warn=True,
                            in_stream=False)
    except GroupException as e:
        results = e.result
    by_node = {}
    for conn, res in results.items():
        name = node_of[id(conn)]
        if isinstance(res, Exception):
            by_node[name] = NodeResult(name, -1, "", "", error=_describe(res))
        else:
            by_node[name] = NodeResult(name, res.exited, res.stdout, res.stderr)
    for c in conns.values():
        c.close()
    return [by_node[n.name] for n in nodes]


def _describe(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


class PrefixWriter:
    """A text stream that prefixes each complete line with `[node] ` (for fabric's out_stream)."""

    def __init__(self, prefix: str, target=None):
        self.prefix, self.target, self.buf, self.lock = prefix, target or sys.stdout, "", threading.Lock()
        self.lines: list[str] = []

    def write(self, text: str) -> int:
        with self.lock:
            self.buf += text.replace("\r", "")  # a pty ends lines with \r\n, possibly split across writes
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                self.lines.append(line)
                self.target.write(f"[{self.prefix}] {line}\n")
            self.target.flush()
        return len(text)

    def flush(self) -> None:
        with self.lock:
            if self.buf:
                self.lines.append(self.buf)
                self.target.write(f"[{self.prefix}] {self.buf}\n")
                self.buf = ""
            self.target.flush()


@contextlib.contextmanager
def _session(cluster: Cluster, node: Node) -> Iterator[Connection]:
    """A pinned connection to one node; failing to reach or run there is a one-line LaunchError."""
    conn = connect(cluster, node)
    try:
        yield conn
    except Exception as e:  # connection refused, auth failure, host key rejected
        raise LaunchError(f"cannot run on {node.name}: {_describe(e)}") from None
    finally:
        conn.close()


def stream(cluster: Cluster, node: Node, command: str, *, pty: bool = True) -> tuple[int, list[str]]:
    """Run `command` on one node, printing its output prefixed by the node as it comes.

    A pty (the default) ties the remote process to the session: if the launcher dies or is interrupted,
    the remote side gets SIGHUP and mpirun takes its ranks down with it. Without one, remote progress
    bars stay off and only their result lines come back.
    """
    writer = PrefixWriter(node.name)
    try:
        with _session(cluster, node) as conn:
            res = conn.run(in_workdir(node, command), pty=pty, warn=True, hide=False, out_stream=writer,
                           in_stream=False)
    finally:
        writer.flush()
    return res.exited, writer.lines


def check(cluster: Cluster, node: Node, command: str) -> tuple[int, str]:
    """Run a short command on one node and return (exit code, stdout) without printing."""
    with _session(cluster, node) as conn:
        res = conn.run(in_workdir(node, command), hide=True, warn=True, in_stream=False)
    return res.exited, res.stdout


def put_text(cluster: Cluster, node: Node, text: str, path: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` on one node over SFTP (never on a command line, where `ps` would show it)."""
    import io

    with _session(cluster, node) as conn:
        conn.put(io.BytesIO(text.encode()), remote=path)
        conn.sftp().chmod(path, mode)
