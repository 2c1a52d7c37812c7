"""A node dies mid-run (a rehearsal node: its namespaces go away with every process in them), `launch local replace`
brings it back as a new machine booted from the image (new address, new disk, new host key), and `launch train
--resume` finishes the run from the last checkpoint on the shared storage, on the nodes as they are now."""

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
    SHARDS,
    TINY,
    assert_one_line_error,
    cluster_state,
    kill_node,
    launch,
    launch_background,
    needs_root,
    node_run,
    on_host,
    rehearsal_cluster_with_shards,
)

from launcher import cluster as clusters
from launcher.errors import LaunchError
from launcher.local import backend as local
from launcher.local import rehearsal_nodes as nodes_

pytestmark = [pytest.mark.cluster, needs_root]

EPOCHS = 8  # node1 dies right after the first checkpoint; the resumed run still has several epochs to train


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with rehearsal_cluster_with_shards(tmp_path_factory.mktemp("replaced")) as found:
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


def pins(known_hosts: str, address: str) -> list[str]:
    """The host keys known_hosts pins for an address (port 22: the bare address)."""
    return sorted(" ".join(ln.split()[1:3]) for ln in known_hosts.splitlines() if ln.split()[0] == address)


def test_resume_after_a_node_is_replaced(env):
    root, home = env
    run = node_run("replaced")
    shared = on_host(home, run)
    args = ["train", "--nodes", "2", "--data", SHARDS, "--epochs", str(EPOCHS), "--output", run, *TINY]
    proc = launch_background(home, *args, "--", "--lr-per-256", "0.8", "--log-every", "2")
    try:
        deadline = time.monotonic() + 300
        while not list(shared.glob("checkpoint-epoch*.pt")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before node1 could be lost"
        assert list(shared.glob("checkpoint-epoch*.pt")), "no checkpoint within 300 s"
        before = cluster_state(home)
        known_before = (home / "clusters" / "local" / "known_hosts").read_text()
        old1 = next(n for n in before["nodes"] if n["name"] == "node1")
        old_keys = pins(known_before, old1["address"])
        assert old_keys, known_before
        assert len(kill_node(home, "node1")) > 2, "nothing ran on node1"  # more than its init and sshd
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "training failed: node node1 (", "stopped answering")
    first = [r["epoch"] for r in epoch_rows(shared)]
    assert first == list(range(len(first))) and len(first) < EPOCHS

    # The Auto Scaling group's part: a new machine for node1, nothing else touched.
    proc = launch(home, "local", "replace")
    assert proc.returncode == 0, proc.stderr
    after = cluster_state(home)
    new1 = next(n for n in after["nodes"] if n["name"] == "node1")
    assert f"node1 replaced: {new1['address']}:22" in proc.stdout and "node0" not in proc.stdout
    assert new1["address"] != old1["address"] and after["processes"]["node1"] != before["processes"]["node1"]
    assert after["nodes"][0] == before["nodes"][0] and after["processes"]["node0"] == before["processes"]["node0"]
    known = (home / "clusters" / "local" / "known_hosts").read_text()
    new_keys = pins(known, new1["address"])
    assert new_keys and not set(new_keys) & set(old_keys)
    assert not pins(known, old1["address"]) and not any(k.split()[1] in known for k in old_keys)
    node0 = before["nodes"][0]["address"]
    assert pins(known, node0) == pins(known_before, node0)  # node0's pins are unchanged
    assert f"HostName {new1['address']}" in (home / "clusters" / "local" / "ssh_config").read_text()

    newest = max(int(re.search(r"\d+", p.name)[0]) for p in shared.glob("checkpoint-epoch*.pt"))
    proc = launch(home, *args, "--resume", "--", "--lr-per-256", "0.8", "--log-every", "2", "--dump-rank-params")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert f"resuming from checkpoint-epoch{newest:03d}.pt: epoch {newest + 1}" in proc.stdout
    # The resumed run continues after the checkpoint to the last epoch; it does not start again from 0.
    rows = epoch_rows(shared)
    # A row the killed run wrote after its newest checkpoint is trimmed on resume (training/checkpoint.py
    # trim_metrics): each epoch once, in order, the resumed ones after the kept ones.
    assert [r["epoch"] for r in rows] == list(range(EPOCHS)), [r["epoch"] for r in rows]
    assert rows[newest + 1]["step"] > rows[newest]["step"]
    assert json.loads((shared / "summary.json").read_text())["epochs"] == EPOCHS
    # Horovod kept the ranks in lock-step across the new node: identical parameters at the end.
    p0, p1 = torch.load(shared / "params-rank0.pt"), torch.load(shared / "params-rank1.pt")
    assert p0.keys() == p1.keys() and all(torch.equal(p0[k], p1[k]) for k in p0)


def test_a_replacement_that_does_not_start_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    c = local.up(2)
    d = clusters.cluster_dir(c.name)
    try:
        os.kill(c.processes["node1"], signal.SIGKILL)
        os.waitpid(c.processes["node1"], 0)
        files = {p: p.read_text() for p in (d / "cluster.json", d / "ssh_config", d / "known_hosts")}

        def no_boot(node, *args, **kwargs):
            raise LaunchError(f"{node} did not boot: sshd: no hostkeys available -- exiting.")

        monkeypatch.setattr(nodes_, "boot", no_boot)
        with pytest.raises(LaunchError, match="node1 did not boot"):
            local.replace(c, [])
        assert {p: p.read_text() for p in files} == files
        assert local.running_nodes(clusters.load(c.name)) == ["node0"]
        assert sorted(p.name for p in (d / "nodes").iterdir()) == ["node0", "node1"]
    finally:
        local.down(clusters.load(c.name))
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert not any(ns in netns for ns in c.rehearsal.netns.values())  # nothing the failed boot made is left
