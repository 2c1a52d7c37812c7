"""A real 2-node local cluster: sshd on loopback, fabric exec, pinned host keys, clean shutdown."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess

import pytest
from clusterutil import alive, assert_one_line_error, cluster_state, launch

from launcher.errors import LaunchError
from launcher.local import backend as local

pytestmark = pytest.mark.cluster


@pytest.fixture
def cluster(tmp_path):
    home = tmp_path / "home"
    # --loopback: this file tests the loopback mode itself (rehearsal nodes: tests/test_rehearsal_cluster.py).
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True)
    yield home
    launch(home, "local", "down")


def test_exec_runs_on_every_node_in_its_own_workdir(cluster):
    proc = launch(cluster, "exec", "--", "echo", "on", "$SCALETRAIN_NODE", "in", "$(pwd)")
    assert proc.returncode == 0, proc.stderr
    state = cluster_state(cluster)
    for node in state["nodes"]:
        assert f"[{node['name']}] on {node['name']} in {node['workdir']}" in proc.stdout
    assert state["nodes"][0]["workdir"] != state["nodes"][1]["workdir"]


def test_exec_failure_names_the_node(cluster):
    proc = launch(cluster, "exec", "--", 'test "$SCALETRAIN_NODE" = node0 || { echo broken >&2; exit 3; }')
    assert_one_line_error(proc, "failed on 1 of 2 node(s): node1 (exit 3)")


def test_openssh_uses_the_same_config(cluster):
    state = cluster_state(cluster)
    out = subprocess.run(["ssh", "-F", state["ssh_config"], "node1", "echo $SCALETRAIN_NODE"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and out.stdout.strip() == "node1", out.stderr


def test_a_changed_host_key_is_rejected(cluster, tmp_path):
    """known_hosts was pinned at creation: a server presenting another key must be refused, not learnt."""
    state = cluster_state(cluster)
    known = cluster / "clusters" / "local" / "known_hosts"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    lines = known.read_text().splitlines()
    port = state["nodes"][1]["port"]
    lines = [f"[127.0.0.1]:{port} " + (tmp_path / "other.pub").read_text().strip() if f":{port}]" in ln
             or f"]:{port} " in ln else ln for ln in lines]
    known.write_text("\n".join(lines) + "\n")
    before = known.read_text()
    proc = launch(cluster, "exec", "--", "true")
    assert_one_line_error(proc, "node1")
    assert "node0" not in proc.stderr.split("failed on")[1]
    assert known.read_text() == before  # nothing was learnt


def test_status_lists_nodes(cluster):
    proc = launch(cluster, "status")
    assert proc.returncode == 0, proc.stderr
    assert "node0" in proc.stdout and "node1" in proc.stdout and proc.stdout.count("ready") == 2


def test_up_twice_is_refused(cluster):
    # --loopback: the fixture's loopback cluster is the one already up.
    assert_one_line_error(launch(cluster, "local", "up", "--loopback", "--nodes", "2"), "already up")


def test_down_leaves_no_process(tmp_path):
    home = tmp_path / "home"
    # --loopback: which sshd processes the loopback mode stops (rehearsal: test_rehearsal_cluster.py's down test).
    launch(home, "local", "up", "--loopback", "--nodes", "2", "--reducers", "1", check=True)
    pids = list(cluster_state(home)["processes"].values())
    assert len(pids) == 3 and all(alive(p) for p in pids)
    proc = launch(home, "local", "down", check=True)
    assert "3 node(s) were running" in proc.stdout
    assert not any(alive(p) for p in pids)
    assert not (home / "clusters" / "local").exists()
    assert_one_line_error(launch(home, "exec", "--", "true"), "no cluster is up")


def test_up_after_a_crash_cleans_stale_state(tmp_path):
    home = tmp_path / "home"
    # --loopback: the loopback mode's recorded sshd pids after a crash.
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True)
    old = list(cluster_state(home)["processes"].values())
    for pid in old:  # the machine "crashed": sshd gone, state left behind
        os.kill(pid, signal.SIGKILL)
    proc = launch(home, "local", "up", "--loopback", "--nodes", "2")
    try:
        assert proc.returncode == 0, proc.stderr
        assert launch(home, "exec", "--", "true").returncode == 0
    finally:
        launch(home, "local", "down")


def test_port_already_taken(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        # --loopback: ports on 127.0.0.1 are the loopback mode's (rehearsal nodes each answer on port 22).
        proc = launch(tmp_path / "home", "local", "up", "--loopback", "--nodes", "2", "--base-port", str(port))
    assert_one_line_error(proc, f"port {port} on 127.0.0.1 is already in use")
    assert not (tmp_path / "home" / "clusters" / "local").exists()


def test_bad_node_counts(tmp_path):
    assert_one_line_error(launch(tmp_path, "local", "up", "--nodes", "0"), "--nodes must be >= 1")
    assert_one_line_error(launch(tmp_path, "local", "up", "--nodes", "nope"), "--nodes")


def test_no_sshd_on_the_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path))
    monkeypatch.setattr(local, "SSHD", str(tmp_path / "no-such-sshd"))
    with pytest.raises(LaunchError, match="no sshd at .*install openssh-server"):
        local.up(2, loopback=True)  # loopback: the mode that runs this machine's sshd


def test_unknown_cluster(cluster):
    assert_one_line_error(launch(cluster, "exec", "--cluster", "prod", "--", "true"),
                          "unknown cluster 'prod'; known clusters: local")


@pytest.mark.skipif(shutil.which("ssh") is None, reason="needs the OpenSSH client")
def test_help_lists_the_commands(tmp_path):
    out = launch(tmp_path, "--help").stdout
    for cmd in ("local", "data", "train", "exec", "status"):
        assert cmd in out
