"""Every SSH connection the launcher holds sends keepalives (issue 25, item 5). paramiko ignores the ssh_config's
ServerAliveInterval, so a launcher following a quiet mpirun held a connection that sent nothing for as long as rank 0
printed nothing, which a NAT or the SSM tunnel may drop.

The node here is an SSH server in this process (paramiko's server side) on loopback: it accepts the cluster's key,
holds each command open for a while before its exit status, and records, per connection, the global requests the
client sent during it; a keepalive is paramiko's ``keepalive@lag.net``. Every way the launcher reaches a node is
driven against it; a structural test then proves there is no other way (no fabric Connection, paramiko client or
transport is made anywhere in launcher/ but remote.connect)."""

from __future__ import annotations

import ast
import getpass
import socket
import sys
import threading
import time
from pathlib import Path

import paramiko
import pytest

from launcher import render
from launcher.cluster import Cluster, Node
from launcher.execute import remote

HOLD_S = 2.5      # each command runs this long, silent, before it exits
KEEPALIVE_S = 1   # the launcher's interval, shortened for the test
EXEC_STARTED = threading.Event()  # the server got a command to run


class _Node(paramiko.ServerInterface):
    def __init__(self, seen: list[str]):
        self.seen = seen

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_pty_request(self, *args):
        return True

    def check_channel_exec_request(self, channel, command):
        EXEC_STARTED.set()

        def finish():
            time.sleep(HOLD_S)
            channel.send_exit_status(0)
            channel.close()
        threading.Thread(target=finish, daemon=True).start()
        return True

    def check_global_request(self, kind, msg):
        self.seen.append(kind)
        return False


@pytest.fixture
def node(tmp_path, monkeypatch):
    """(cluster, connections): a one-node cluster on the in-process server; per accepted connection, the global
    requests it sent."""
    monkeypatch.setattr(remote, "KEEPALIVE_S", KEEPALIVE_S)
    host_key = paramiko.ECDSAKey.generate()
    client_key = paramiko.ECDSAKey.generate()
    client_key.write_private_key_file(str(tmp_path / "id"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    connections: list[list[str]] = []
    transports: list[paramiko.Transport] = []

    def serve():
        while True:
            try:
                sock, _ = listener.accept()
            except OSError:
                return
            t = paramiko.Transport(sock)
            t.add_server_key(host_key)
            seen: list[str] = []
            connections.append(seen)
            transports.append(t)
            t.start_server(server=_Node(seen))

    threading.Thread(target=serve, daemon=True).start()
    (tmp_path / "known_hosts").write_text(render.known_hosts(
        [("127.0.0.1", port, f"{host_key.get_name()} {host_key.get_base64()}")]))
    (tmp_path / "ssh_config").write_text(render.ssh_config(
        "k", [("node0", "127.0.0.1", port)], user=getpass.getuser(), identity_file=str(tmp_path / "id"),
        known_hosts=str(tmp_path / "known_hosts")))
    assert "ServerAliveInterval 15" in (tmp_path / "ssh_config").read_text()  # what paramiko does not read
    c = Cluster(name="k", backend="local", user=getpass.getuser(), ssh_config=str(tmp_path / "ssh_config"),
                known_hosts=str(tmp_path / "known_hosts"), python="/usr/bin/python3", mpirun="/usr/bin/mpirun",
                nodes=[Node(name="node0", address="127.0.0.1", port=port, role="worker", slots=1, cpus=1,
                            workdir=str(tmp_path / "work"))])
    try:
        yield c, connections
    finally:
        listener.close()
        for t in transports:
            t.close()


def _keepalives(seen: list[str]) -> int:
    return sum(kind == "keepalive@lag.net" for kind in seen)


def test_every_way_the_launcher_runs_on_a_node_sends_keepalives_while_the_command_is_silent(node):
    c, connections = node
    n = c.nodes[0]
    assert remote.check(c, n, "sleep 2.5")[0] == 0                       # short commands, probes, staging
    assert remote.stream(c, n, "mpirun ...", pty=True)[0] == 0           # the training run, followed
    assert [r.exit_code for r in remote.run_all(c, [n], "true")] == [0]  # launch exec, readiness, doctor
    conn = remote.connect(c, n, timeout_s=30)                            # the watchdog's and Slurm follower's
    try:
        assert conn.run("true", hide=True, warn=True, in_stream=False).exited == 0
    finally:
        conn.close()
    assert len(connections) == 4
    assert all(_keepalives(seen) >= 1 for seen in connections), connections


def test_ctrl_c_during_a_short_command_ends_it_at_once(node, monkeypatch):
    """Ctrl-C while remote.check waits (launch doctor's checks, staging, a probe) raises KeyboardInterrupt at once,
    which the CLI says as 'error: interrupted', exit 130. invoke, left alone, sent ^C down a channel without a pty
    and waited for the command's end (here 30 s), then returned as if nothing had happened (issue 26)."""
    import os
    import signal

    c, _ = node
    monkeypatch.setattr(sys.modules[__name__], "HOLD_S", 30.0)
    EXEC_STARTED.clear()

    def ctrl_c():
        if EXEC_STARTED.wait(20):
            time.sleep(0.3)
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=ctrl_c, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        remote.check(c, c.nodes[0], "sleep 30")
    assert EXEC_STARTED.is_set() and time.monotonic() - started < 5
    monkeypatch.setattr(sys.modules[__name__], "HOLD_S", 0.1)
    before = signal.getsignal(signal.SIGINT)
    assert remote.check(c, c.nodes[0], "true") == (0, "")  # the next command runs as before...
    assert signal.getsignal(signal.SIGINT) is before       # ...and leaves Ctrl-C's handler as it found it


# The names by which a program opens an SSH connection with fabric or paramiko.
_OPENERS = {"Connection", "SSHClient", "Transport", "ThreadingGroup", "SerialGroup"}
_LAUNCHER = Path(__file__).resolve().parent.parent / "launcher"


def test_no_module_of_the_launcher_opens_an_ssh_connection_but_through_remote_connect():
    made = []
    for path in sorted(_LAUNCHER.rglob("*.py")):
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.Call):
                continue
            name = fn.func.attr if isinstance(fn.func, ast.Attribute) else getattr(fn.func, "id", None)
            if name in _OPENERS or name == "_KeptAlive":
                made.append(f"{path.relative_to(_LAUNCHER.parent)}:{fn.lineno} {name}")
    # remote.connect makes the one kind of connection (kept alive); run_all groups only connections it made.
    assert made == [f"launcher/execute/remote.py:{_line_of('_KeptAlive(')} _KeptAlive"], made
    grouped = ast.unparse(next(f for f in ast.walk(ast.parse((_LAUNCHER / "execute" / "remote.py").read_text()))
                               if isinstance(f, ast.FunctionDef) and f.name == "run_all"))
    assert "ThreadingGroup.from_connections" in grouped and "connect(cluster, n)" in grouped


def _line_of(text: str) -> int:
    lines = (_LAUNCHER / "execute" / "remote.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "class " not in line)
