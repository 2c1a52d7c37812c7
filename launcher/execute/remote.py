"""The thin shell that runs commands on nodes: fabric over the cluster's ssh_config, host keys pinned.

fabric's Connection accepts unknown host keys by default (AutoAddPolicy); every connection made here
loads the cluster's known_hosts and rejects any key not in it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from fabric import Config, Connection, ThreadingGroup
from fabric.exceptions import GroupException
from paramiko import RejectPolicy

from launcher.cluster import WORKDIR_SHELL, Cluster, Node
from launcher.errors import LaunchError
from launcher.plans import preflight

# paramiko's transport thread logs a failed connection with its traceback (through logging's last-resort
# stderr handler); the caller gets the same failure as an exception and says it in one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


# SSH keepalive on every connection the launcher holds. fabric applies a few ssh_config keywords (HostName, Port,
# User, ProxyCommand/ProxyJump, ConnectTimeout, IdentityFile, ForwardAgent: fabric 3's connection.py and auth.py;
# https://docs.fabfile.org/en/latest/concepts/configuration.html, "Loading and using ssh_config files") and not
# ServerAliveInterval, which the cluster's ssh_config sets for OpenSSH (mpirun's ssh, `launch ssh`); paramiko only
# parses it. Keepalive is the transport's own setting: "after interval seconds without sending any data over the
# connection, a 'keepalive' packet will be sent ... useful to keep connections alive over a NAT"
# (https://docs.paramiko.org/en/stable/api/transport.html, Transport.set_keepalive). A launcher streaming a
# long-running mpirun whose rank 0 is quiet (a validation pass, a restore) would otherwise see a middlebox or the
# SSM tunnel drop an idle connection. 15 s, as ServerAliveInterval in the ssh_config.
KEEPALIVE_S = 15


class _KeptAlive(Connection):
    """A fabric Connection whose transport sends a keepalive every KEEPALIVE_S seconds of silence, from the moment it
    opens (fabric opens lazily, on the first run, put or sftp; a ThreadingGroup opens each of its connections)."""

    def open(self):
        connected = self.is_connected
        result = super().open()
        if not connected and self.transport is not None:
            self.transport.set_keepalive(KEEPALIVE_S)
        return result


def _pin(conn: Connection, cluster: Cluster) -> Connection:
    conn.client.get_host_keys().clear()
    conn.client.load_host_keys(cluster.known_hosts)
    conn.client.set_missing_host_key_policy(RejectPolicy())
    return conn


def _config(cluster: Cluster, timeout_s: float | None = None) -> Config:
    bounded = {} if timeout_s is None else {"banner_timeout": timeout_s, "auth_timeout": timeout_s,
                                            "channel_timeout": timeout_s}
    return Config(runtime_ssh_path=cluster.ssh_config,
                  overrides={"connect_kwargs": {"look_for_keys": False, "allow_agent": False, **bounded},
                             "timeouts": {"connect": 15}, "load_ssh_configs": True})


def through_ssm(cluster: Cluster) -> bool:
    """Whether SSH to this cluster's nodes runs ``aws ssm start-session`` (access.ssm_proxy_command: every AWS
    cluster's own ssh_config), which needs the AWS CLI's Session Manager plugin."""
    if cluster.backend != "aws":
        return False
    try:
        return "ssm start-session" in Path(cluster.ssh_config).read_text()
    except OSError:
        return False


def require_ssm_plugin(cluster: Cluster) -> None:
    """One line naming what to install when SSH to ``cluster`` needs the Session Manager plugin and it is missing."""
    if through_ssm(cluster) and (problem := preflight.ssm_plugin_problem(shutil.which(preflight.SSM_PLUGIN))):
        raise LaunchError(problem)


def connect(cluster: Cluster, node: Node, *, timeout_s: float | None = None) -> Connection:
    """`timeout_s` bounds each step of reaching the node (TCP, SSH banner, auth, opening a channel): a frozen
    sshd accepts TCP but never sends its banner, and paramiko would wait on it for minutes. An AWS cluster's nodes
    are reached through SSM Session Manager: without its plugin, one line saying what to install
    (plans/preflight.ssm_plugin_problem), not the AWS CLI's message from inside a ProxyCommand."""
    require_ssm_plugin(cluster)
    return _pin(_KeptAlive(node.name, config=_config(cluster, timeout_s), connect_timeout=timeout_s), cluster)


def ends_with_session(command: str) -> str:
    """`command` as a shell line that ends, all of its process group, when its SSH session does: for a command run
    without a pty, whose end nothing else ties to the session. Without a pty sshd gives the command pipes and no
    terminal, so a launcher that is interrupted or dies sends it no SIGHUP; a command that never writes (`sleep`, a
    training run between log lines) ran on. sshd starts a session's command in a session of its own (setsid(2) in
    OpenSSH's session.c, do_exec_no_pty), so the shell's PID is its process group: a watcher reads the session's
    stdin, which nothing writes (in_stream=False) and which reaches end-of-file only when the connection is gone, and
    then hangs the group up, as a pty's hangup would. The command reads /dev/null, not that stdin; its status is the
    line's. POSIX sh: bash and dash alike (the nodes' login shells)."""
    return (f"exec 3<&0; ( {command}\n) </dev/null 3<&- & c=$!; "
            "{ cat <&3 >/dev/null 2>&1; kill -s HUP -- -$$; } >/dev/null 2>&1 & w=$!; exec 3<&-; "
            "wait $c; s=$?; kill $w 2>/dev/null; exit $s")


def in_workdir(node: Node, command: str) -> str:
    """The shell line that runs `command` in the node's working directory (made first: nothing on a fresh AWS
    node creates it)."""
    workdir = shlex.quote(node.workdir)
    return f"mkdir -p {workdir} && cd {workdir} && {command}"


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
    (cluster.WORKDIR_SHELL), not from per-node text.
    """
    conns = {n.name: connect(cluster, n) for n in nodes}
    node_of = {id(c): name for name, c in conns.items()}
    group = ThreadingGroup.from_connections(list(conns.values()))
    try:
        results = group.run(f"mkdir -p {WORKDIR_SHELL} && cd {WORKDIR_SHELL} && {ends_with_session(command)}",
                            hide=True, warn=True, in_stream=False)
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

    def __init__(self, prefix: str, target=None, on_line: Callable[[str], None] | None = None):
        self.prefix, self.target, self.buf, self.lock = prefix, target or sys.stdout, "", threading.Lock()
        self.lines: list[str] = []
        self.on_line = on_line  # told of each line as it comes (the watchdog's sign of life)

    def _emit(self, line: str) -> None:
        self.lines.append(line)
        self.target.write(f"[{self.prefix}] {line}\n")
        if self.on_line:
            self.on_line(line)

    def write(self, text: str) -> int:
        with self.lock:
            self.buf += text.replace("\r", "")  # a pty ends lines with \r\n, possibly split across writes
            while "\n" in self.buf:
                line, self.buf = self.buf.split("\n", 1)
                self._emit(line)
            self.target.flush()
        return len(text)

    def flush(self) -> None:
        with self.lock:
            if self.buf:
                self._emit(self.buf)
                self.buf = ""
            self.target.flush()


@contextlib.contextmanager
def _session(cluster: Cluster, node: Node, timeout_s: float | None = None) -> Iterator[Connection]:
    """A pinned connection to one node; failing to reach or run there is a one-line LaunchError."""
    conn = connect(cluster, node, timeout_s=timeout_s)
    try:
        yield conn
    except Exception as e:  # connection refused, auth failure, host key rejected
        raise LaunchError(f"cannot run on {node.name}: {_describe(e)}") from None
    finally:
        conn.close()


class Hangup:
    """Lets another thread end a `stream` early: its connection is closed, so the run returns at once (with
    exit -1) even when the node no longer answers; a node that does answer sends the pty's SIGHUP."""

    def __init__(self) -> None:
        self.lock, self.conn, self.done = threading.Lock(), None, False

    def __call__(self) -> None:
        with self.lock:
            self.done = True
            if self.conn is not None:
                self.conn.close()

    def _attach(self, conn: Connection | None) -> bool:
        """Whether the stream may run on `conn` (None: it ended); False once hung up."""
        with self.lock:
            self.conn = conn
            return not self.done


def stream(cluster: Cluster, node: Node, command: str, *, pty: bool = True,
           on_line: Callable[[str], None] | None = None, hangup: Hangup | None = None) -> tuple[int, list[str]]:
    """Run `command` on one node, printing its output prefixed by the node as it comes.

    A pty (the default) ties the remote process to the session: if the launcher dies or is interrupted,
    the remote side gets SIGHUP and mpirun takes its ranks down with it. Without one, remote progress
    bars stay off and only their result lines come back. `on_line` is told of each line; `hangup`, when
    called from another thread, abandons the run.
    """
    writer = PrefixWriter(node.name, on_line=on_line)
    hangup = hangup or Hangup()
    try:
        with _session(cluster, node) as conn, interrupts() as interrupted:
            if not hangup._attach(conn):
                return -1, []
            res = conn.run(in_workdir(node, command), pty=pty, warn=True, hide=False, out_stream=writer,
                           in_stream=False)
    except LaunchError:
        if not hangup.done:
            raise
        return -1, writer.lines  # the connection closed under a run being abandoned
    finally:
        hangup._attach(None)
        writer.flush()
    if interrupted:  # invoke forwarded Ctrl-C to the remote and waited for it to stop; now the launcher stops
        raise KeyboardInterrupt
    return res.exited, writer.lines


@contextlib.contextmanager
def on_sigint(action: Callable[[], None]) -> Iterator[list[int]]:
    """Calls `action` on each SIGINT while the block runs, and records it; the previous handler is back after. Only
    the main thread receives signals (Python's signal module), so elsewhere nothing is installed and nothing
    recorded."""
    seen: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return

    def handler(signum, frame):
        seen.append(signum)
        action()

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def _raise_interrupt() -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts() -> Iterator[list[int]]:
    """Records each SIGINT while a remote command runs, then lets it through as usual (KeyboardInterrupt).

    invoke catches that KeyboardInterrupt, sends the interrupt to the remote command (^C down the pty: mpirun
    then stops its ranks) and waits for the command to end, returning as if nothing happened; the record is how
    the caller learns the user asked to stop. Only the main thread receives signals, so elsewhere: no record.
    """
    with on_sigint(_raise_interrupt) as seen:
        yield seen


def check(cluster: Cluster, node: Node, command: str, *, timeout_s: float | None = None) -> tuple[int, str]:
    """Run a short command on one node and return (exit code, stdout) without printing.

    `timeout_s` bounds each step (reaching the node, then the command): past it, a one-line LaunchError.
    """
    code, out, _ = check_output(cluster, node, command, timeout_s=timeout_s)
    return code, out


@contextlib.contextmanager
def hangs_up_on_interrupt(conn: Connection) -> Iterator[None]:
    """A Ctrl-C while a command without a pty runs closes its connection, so the wait for it ends at once, and then
    raises KeyboardInterrupt. Left to invoke, the KeyboardInterrupt is taken, ^C is sent down a channel the command
    does not read (no pty), and the wait goes on to the command's end, returning as if nothing happened: Ctrl-C
    during `launch doctor`'s checks did nothing. The close runs on a thread of its own, never inside the handler,
    which may have interrupted paramiko holding a lock. Only the main thread receives signals: elsewhere, nothing."""
    with on_sigint(lambda: threading.Thread(target=conn.close, daemon=True).start()) as seen:
        try:
            yield
        except Exception:  # the closed connection's own error, once the user asked to stop
            if seen:
                raise KeyboardInterrupt from None
            raise
    if seen:
        raise KeyboardInterrupt


def check_output(cluster: Cluster, node: Node, command: str, *,
                 timeout_s: float | None = None) -> tuple[int, str, str]:
    """:func:`check`, with the command's stderr too: (exit code, stdout, stderr). Ctrl-C ends it at once
    (:func:`hangs_up_on_interrupt`)."""
    with _session(cluster, node, timeout_s) as conn, hangs_up_on_interrupt(conn):
        res = conn.run(in_workdir(node, ends_with_session(command)), hide=True, warn=True, in_stream=False,
                       timeout=timeout_s)
    return res.exited, res.stdout, res.stderr


def put_text(cluster: Cluster, node: Node, text: str, path: str, mode: int = 0o600) -> None:
    """Write ``text`` to ``path`` on one node over SFTP (never on a command line, where `ps` would show it)."""
    import io

    with _session(cluster, node) as conn:
        conn.put(io.BytesIO(text.encode()), remote=path)
        conn.sftp().chmod(path, mode)


def put_bytes(cluster: Cluster, node: Node, data: bytes, path: str, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` on one node over SFTP, under a temporary name first, renamed into place."""
    import io

    tmp = f"{path}.part"
    with _session(cluster, node) as conn:
        conn.put(io.BytesIO(data), remote=tmp)
        sftp = conn.sftp()
        sftp.chmod(tmp, mode)
        sftp.posix_rename(tmp, path)


def get_files(cluster: Cluster, node: Node, pairs: list[tuple[str, Path]]) -> None:
    """Copy remote files to local paths over one SFTP session; each lands under a temporary name first and is
    renamed into place, so an interrupted copy never leaves a truncated file under the real name."""
    with _session(cluster, node) as conn:
        sftp = conn.sftp()
        for remote_path, local_path in pairs:
            local_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = local_path.with_name(f".{local_path.name}.part")
            sftp.get(remote_path, str(tmp))
            os.replace(tmp, local_path)
