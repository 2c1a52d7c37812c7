"""launcher.execute.results: which files of a run directory come back (pure), and the fetch over real sshd/SFTP from a
rehearsal node (its own machine: the run directory is on its /fsx, which this machine does not have)."""

from __future__ import annotations

import json

import pytest
from clusterutil import launch, needs_root, node_run, on_host, up

from launcher import cluster as clusters
from launcher.execute import results

LISTING = "\n".join([
    "metrics.jsonl\t2048", "summary.json\t512", "hostfile\t24", ".summary.json.tmp\t100",
    "checkpoint-epoch002.pt\t9000", "checkpoint-epoch010.pt\t9100", "checkpoint-epoch001.pt\t8900",
    "tensorboard/events.out.tfevents.1.node0\t4096", "tensorboard/.hidden\t1", "params-rank0.pt\t300",
    "find: './lost+found': Permission denied", "",
])


def test_parse_listing_keeps_path_size_lines_only():
    files = results.parse_listing(LISTING)
    assert results.RemoteFile("checkpoint-epoch010.pt", 9100) in files
    assert all("Permission" not in f.path for f in files) and len(files) == 10


def test_checkpoint_index_orders_by_epoch_number_not_by_name():
    index = results.checkpoint_index(results.parse_listing(LISTING))
    assert [(c["name"], c["epoch"], c["bytes"]) for c in index] == [
        ("checkpoint-epoch001.pt", 1, 8900), ("checkpoint-epoch002.pt", 2, 9000), ("checkpoint-epoch010.pt", 10, 9100)]


@pytest.mark.parametrize("newest", [False, True])
def test_fetch_plan_takes_the_record_events_and_maybe_the_newest_checkpoint(newest):
    chosen = [f.path for f in results.fetch_plan(results.parse_listing(LISTING), newest_checkpoint=newest)]
    assert chosen[:4] == ["metrics.jsonl", "summary.json", "hostfile", "tensorboard/events.out.tfevents.1.node0"]
    assert chosen[4:] == (["checkpoint-epoch010.pt"] if newest else [])


def test_a_run_that_failed_before_any_output_fetches_what_there_is():
    files = results.parse_listing("hostfile\t24\n")
    assert [f.path for f in results.fetch_plan(files, newest_checkpoint=True)] == ["hostfile"]
    assert results.checkpoint_index(files) == []


@pytest.mark.cluster
@needs_root
def test_fetch_copies_the_record_from_node0_over_sftp(tmp_path, monkeypatch):
    home = tmp_path / "home"
    up(home, "--nodes", "2")
    try:
        monkeypatch.setenv("SCALETRAIN_HOME", str(home))
        c = clusters.load("local")
        on_node = node_run("fetched")
        run = on_host(home, on_node)  # written here, read there: the nodes' shared storage
        (run / "tensorboard").mkdir(parents=True)
        (run / "metrics.jsonl").write_text('{"epoch": 0}\n')
        (run / "summary.json").write_text('{"top1": 0.5}\n')
        (run / "tensorboard" / "events.out.tfevents.1").write_bytes(b"\0" * 100)
        for epoch in (0, 1):
            (run / f"checkpoint-epoch{epoch:03d}.pt").write_bytes(bytes([epoch]) * (1000 + epoch))
        dest = tmp_path / "fetched"
        got = results.fetch(c, c.nodes[0], on_node, dest, newest_checkpoint=True)
        assert [f.path for f in got] == ["metrics.jsonl", "summary.json", "tensorboard/events.out.tfevents.1",
                                         "checkpoint-epoch001.pt"]
        assert (dest / "summary.json").read_text() == '{"top1": 0.5}\n'
        assert (dest / "checkpoint-epoch001.pt").read_bytes() == b"\1" * 1001
        assert not (dest / "checkpoint-epoch000.pt").exists()
        index = json.loads((dest / "checkpoints.json").read_text())
        assert index["node"] == "node0" and index["run_directory"] == on_node
        assert [ck["bytes"] for ck in index["checkpoints"]] == [1000, 1001]
        assert not list(dest.rglob(".*part"))
        # A directory of this machine is not on the node.
        (tmp_path / "on-node").mkdir()
        with pytest.raises(results.LaunchError, match="cannot list the run directory"):
            results.fetch(c, c.nodes[0], str(tmp_path / "on-node"), dest, newest_checkpoint=False)
    finally:
        launch(home, "local", "down")
