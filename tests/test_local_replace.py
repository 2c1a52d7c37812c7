"""`launch local replace`'s decisions, without servers: which nodes, the new ssh_config and known_hosts text."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.files import keygen
from launcher.local import backend as local

KEY0 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPd+thCJVU0OWwNN2Zo8HNNgfvVHNCXIU/6HUnA4k6IS scaletrain-local-node0"
OLD1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAILNz2E/+QBJrh78oN6D1Cz8NCZ73lrIe0NWg7nFfcGnM scaletrain-local-node1"
NEW1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB3U3IjKm7ytNadxhjxn3Xt4foKMVpPDZE6/H64KF7TP scaletrain-local-node1"


def three_nodes(ports=(2200, 2201, 2202)) -> Cluster:
    nodes = [Node(name=name, address="127.0.0.1", port=port, role=role, slots=1, cpus=1, workdir=f"/w/{name}")
             for (name, role), port in zip(local.node_names(2, 1), ports, strict=True)]
    return Cluster(name="local", backend="local", nodes=nodes, user="me", ssh_config="/s/local/ssh_config",
                   known_hosts="/s/local/known_hosts", python="python", processes={"node0": 1, "node1": 2,
                                                                                    "reducer0": 3})


def test_with_no_names_every_dead_node_is_replaced_in_cluster_order():
    c = three_nodes()
    assert local.to_replace(c, [], running={"node0"}) == ["node1", "reducer0"]
    assert local.to_replace(c, [], running={"node0", "node1", "reducer0"}) == []


def test_named_dead_nodes_are_replaced_once_in_cluster_order():
    c = three_nodes()
    assert local.to_replace(c, ["reducer0", "node1", "node1"], running={"node0"}) == ["node1", "reducer0"]
    assert local.to_replace(c, ["node1"], running={"node0"}) == ["node1"]  # reducer0 is dead too, but not named


def test_a_running_node_is_refused_naming_it():
    with pytest.raises(LaunchError, match=r"^node0 of cluster 'local' is still running; only a node whose sshd "
                                          r"died can be replaced"):
        local.to_replace(three_nodes(), ["node0", "node1"], running={"node0"})


def test_an_unknown_node_is_refused_naming_the_nodes_there_are():
    with pytest.raises(LaunchError, match=r"^no node 'node7' in cluster 'local'; nodes: node0, node1, reducer0$"):
        local.to_replace(three_nodes(), ["node7"], running=set())


def test_new_port_and_key_pinned_old_ones_gone():
    before = three_nodes()
    after = three_nodes(ports=(2200, 40123, 2202))
    keys = {"node0": KEY0, "node1": OLD1, "reducer0": KEY0}
    old_config, old_known = local.ssh_files(before, keys)
    config, known = local.ssh_files(after, keys | {"node1": NEW1})
    assert "Port 2201" in old_config and "Port 2201" not in config
    assert "Host node1\n    HostName 127.0.0.1\n    Port 40123\n" in config
    assert "IdentityFile /s/local/id_ed25519" in config and "UserKnownHostsFile /s/local/known_hosts" in config
    assert "StrictHostKeyChecking yes" in config  # never learn a key on first use
    assert f"[127.0.0.1]:2201 {OLD1}\n" in old_known
    assert known == f"[127.0.0.1]:2200 {KEY0}\n[127.0.0.1]:40123 {NEW1}\n[127.0.0.1]:2202 {KEY0}\n"
    assert OLD1.split()[1] not in known


def test_fresh_ports_are_distinct_free_and_avoid_the_old_ones():
    taken = set(local.pick_ports(20, None))
    ports = local.fresh_ports(3, taken)
    assert len(set(ports)) == 3 and not set(ports) & taken and all(local.port_free(p) for p in ports)


@pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs ssh-keygen")
def test_fingerprint_is_openssh_s(tmp_path):
    pub = keygen(tmp_path / "key", "test")
    out = subprocess.run(["ssh-keygen", "-lf", str(tmp_path / "key.pub")], capture_output=True, text=True,
                         check=True).stdout
    assert local.fingerprint(pub) == out.split()[1]


def test_a_node_whose_sshd_is_given_up_at_once_leaves_no_process(tmp_path, monkeypatch):
    # Given up before the child has even exec'ed sshd: the process must still be stopped, not left to start.
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    started = []
    real_popen = local.subprocess.Popen

    def recording_popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        return proc

    def no_banner(port, proc, log, timeout=15.0):
        raise LaunchError(f"sshd on port {port} did not answer")

    monkeypatch.setattr(local.subprocess, "Popen", recording_popen)
    monkeypatch.setattr(local, "_wait_for_banner", no_banner)
    with pytest.raises(LaunchError, match="did not answer"):
        local.up(2, loopback=True)  # loopback: its sshd processes and banner wait are what this tests
    sshd = [proc for proc in started if proc.args[0] == local.SSHD]
    assert len(sshd) == 1 and sshd[0].poll() is not None  # stopped and reaped
    time.sleep(0.5)  # long enough for an orphaned child to have exec'ed sshd
    assert not [pid for pid in Path("/proc").glob("[0-9]*") if str(tmp_path) in _cmdline(pid)]


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:  # gone meanwhile
        return ""
