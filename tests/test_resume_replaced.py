"""A node dies mid-run, `launch local replace` brings it back as a new machine (new port, new host key), and
`launch train --resume` finishes the run from the last checkpoint on the nodes as they are now."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time

import pytest
import torch
from clusterutil import (
    TINY,
    assert_one_line_error,
    cluster_state,
    kill_node,
    launch,
    launch_background,
    local_cluster_with_shards,
)

from launcher import cluster as clusters
from launcher.cluster import local
from launcher.errors import LaunchError

pytestmark = pytest.mark.cluster

EPOCHS = 8  # node1 dies right after the first checkpoint; the resumed run still has several epochs to train


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with local_cluster_with_shards(tmp_path_factory.mktemp("replaced")) as found:
        yield found


def epoch_rows(run) -> list[dict]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "epoch_time_s" in r]


def test_replace_refuses_a_running_node_and_an_unknown_one(env):
    _, home = env
    before = cluster_state(home)
    assert_one_line_error(launch(home, "local", "replace", "node0"),
                          "node0 of cluster 'local' is still running; only a node whose sshd died can be replaced")
    assert_one_line_error(launch(home, "local", "replace", "node9"), "no node 'node9' in cluster 'local'; nodes: "
                                                                    "node0, node1")
    assert_one_line_error(launch(home, "local", "replace", "--cluster", "prod"), "unknown cluster 'prod'")
    proc = launch(home, "local", "replace")
    assert proc.returncode == 0 and "nothing to replace: every node of cluster 'local' is running" in proc.stdout
    assert cluster_state(home) == before


def test_resume_after_a_node_is_replaced(env):
    root, home = env
    run = root / "run"
    args = ["train", "--nodes", "2", "--data", str(root / "shards"), "--epochs", str(EPOCHS), "--output", str(run),
            *TINY]
    proc = launch_background(home, *args, "--", "--lr-per-256", "0.8", "--log-every", "2")
    try:
        deadline = time.monotonic() + 300
        while not list(run.glob("checkpoint-epoch*.pt")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before node1 could be lost"
        assert list(run.glob("checkpoint-epoch*.pt")), "no checkpoint within 300 s"
        before = cluster_state(home)
        known_before = (home / "clusters" / "local" / "known_hosts").read_text()
        old_key = (home / "clusters" / "local" / "nodes" / "node1" / "ssh_host_ed25519_key.pub").read_text().split()[1]
        assert len(kill_node(home, "node1")) > 1, "nothing ran on node1"
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "training failed: node node1 (", "stopped answering")
    first = [r["epoch"] for r in epoch_rows(run)]
    assert first == list(range(len(first))) and len(first) < EPOCHS

    # The Auto Scaling group's part: a new machine for node1, nothing else touched.
    proc = launch(home, "local", "replace")
    assert proc.returncode == 0, proc.stderr
    assert "node1 replaced: 127.0.0.1:" in proc.stdout and "node0" not in proc.stdout
    after = cluster_state(home)
    old1, new1 = (next(n for n in s["nodes"] if n["name"] == "node1") for s in (before, after))
    assert new1["port"] != old1["port"] and after["processes"]["node1"] != before["processes"]["node1"]
    assert after["nodes"][0] == before["nodes"][0] and after["processes"]["node0"] == before["processes"]["node0"]
    known = (home / "clusters" / "local" / "known_hosts").read_text()
    new_key = (home / "clusters" / "local" / "nodes" / "node1" / "ssh_host_ed25519_key.pub").read_text().split()[1]
    assert new_key != old_key and old_key not in known and f"[127.0.0.1]:{old1['port']}" not in known
    assert f"[127.0.0.1]:{new1['port']} ssh-ed25519 {new_key}" in known
    assert known.splitlines()[0] == known_before.splitlines()[0]  # node0's pin is unchanged
    assert f"Port {new1['port']}" in (home / "clusters" / "local" / "ssh_config").read_text()

    newest = max(int(re.search(r"\d+", p.name)[0]) for p in run.glob("checkpoint-epoch*.pt"))
    proc = launch(home, *args, "--resume", "--", "--lr-per-256", "0.8", "--log-every", "2", "--dump-rank-params")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert f"resuming from checkpoint-epoch{newest:03d}.pt: epoch {newest + 1}" in proc.stdout
    # The resumed run continues after the checkpoint to the last epoch; it does not start again from 0.
    rows = epoch_rows(run)
    assert [r["epoch"] for r in rows[len(first):]] == list(range(newest + 1, EPOCHS))
    assert rows[len(first)]["step"] > rows[0]["step"]
    assert json.loads((run / "summary.json").read_text())["epochs"] == EPOCHS
    # Horovod kept the ranks in lock-step across the new node: identical parameters at the end.
    p0, p1 = torch.load(run / "params-rank0.pt"), torch.load(run / "params-rank1.pt")
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)


def test_a_replacement_that_does_not_start_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    c = local.up(2, loopback=True)
    d = clusters.cluster_dir(c.name)
    try:
        os.kill(c.processes["node1"], signal.SIGKILL)
        os.waitpid(c.processes["node1"], 0)
        files = {p: p.read_text() for p in (d / "cluster.json", d / "ssh_config", d / "known_hosts",
                                             d / "nodes" / "node1" / "ssh_host_ed25519_key.pub")}

        def no_banner(port, proc, log, timeout=15.0):
            raise LaunchError(f"sshd on port {port} did not answer within {timeout:.0f} s; see {log}")

        monkeypatch.setattr(local, "_wait_for_banner", no_banner)
        with pytest.raises(LaunchError, match="did not answer"):
            local.replace(c, [])
        assert {p: p.read_text() for p in files} == files
        assert local.running_nodes(clusters.load(c.name)) == ["node0"]
        assert sorted(p.name for p in (d / "nodes").iterdir()) == ["node0", "node1"]
    finally:
        local.down(clusters.load(c.name))
