"""`launch data convert` from the command line: on this machine, by hand on N nodes, and on a local cluster.

The cluster test runs the real thing: `launch data convert --cluster local` on a 2-node rehearsal cluster (each node
its own machine, converting with the image's venv; they share only /fsx, as cluster nodes share FSx), against a
single-machine run.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest
from clusterutil import assert_one_line_error, launch, launch_background, needs_root, on_host, put_on_shared, up

from launcher.cluster import Cluster, Node
from launcher.plans import dataprep
from training.convert import convert
from training.sample import make_sample

OPTIONS = {"shard_size": 3, "seed": 4, "quality": 90}
CLI_OPTIONS = ["--shard-size", "3", "--seed", "4", "--quality", "90"]


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, Path, dict]:
    """A small data set with one bad input, and its single-machine conversion."""
    root = tmp_path_factory.mktemp("cli")
    make_sample(root / "src", classes=3, per_class=5, val_per_class=2, seed=2)
    (root / "src" / "val" / "n01443537" / "ILSVRC2012_val_00000099.JPEG").write_bytes(b"\xff\xd8\xff")
    return root / "src", root / "single", convert(root / "src", root / "single", **OPTIONS)


def test_convert_prints_what_it_wrote_and_every_rejection(source, tmp_path):
    src, single, manifest = source
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "out"), "--workers", "2",
                  *CLI_OPTIONS, check=True)
    assert f"wrote {tmp_path / 'out'}/manifest.json (train: 15 samples in 5 shards, val: 6 samples in 3 shards); " \
           "1 input rejected" in proc.stdout
    assert "rejected val/n01443537/ILSVRC2012_val_00000099.JPEG: truncated or corrupt image" in proc.stderr
    assert files_under(tmp_path / "out") == files_under(single)


def test_by_hand_on_two_nodes_then_merge(source, tmp_path):
    src, single, manifest = source
    out, home = tmp_path / "out", tmp_path / "home"
    for node in ("1", "0"):
        proc = launch(home, "data", "convert", str(src), "--out", str(out), "--node-index", node, "--node-count", "2",
                      "--workers", "1", *CLI_OPTIONS, check=True)
        assert f"manifest.node-{node}-of-2.json" in proc.stdout
        if node == "1":
            assert_one_line_error(launch(home, "data", "convert", "--out", str(out), "--node-count", "2", "--merge"),
                                  "node 0 of 2 has not finished converting")
    launch(home, "data", "convert", "--out", str(out), "--node-count", "2", "--merge", check=True)
    assert json.loads((out / "manifest.json").read_text()) == manifest
    for entry in manifest["shards"]:
        assert (out / entry["name"]).read_bytes() == (single / entry["name"]).read_bytes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "o"], "missing argument SRC"),
        (["nowhere", "--out", "o"], "SRC nowhere does not exist"),
        (["{src}", "--out", "{tmp}/o", "--quality", "0"], "--quality must be between 1 and 100, got 0"),
        (["{src}", "--out", "{tmp}/o", "--node-index", "2", "--node-count", "2"],
         "--node-index must be between 0 and 1 (--node-count 2), got 2"),
        (["{src}", "--out", "o", "--merge"], "--merge takes only --out and --node-count; leave out SRC"),
        (["{src}", "--out", "/fsx/o", "--cluster", "nosuch"], "unknown cluster 'nosuch'"),
        # With --cluster the paths are the nodes': a relative one would be resolved against this machine.
        (["raw", "--out", "/fsx/o", "--cluster", "nosuch"], "SRC raw must be an absolute path as the nodes see it"),
        (["/fsx/raw", "--out", "~/o", "--cluster", "nosuch"], "--out ~/o must be an absolute path as the nodes"),
        (["{src}", "--out", "o", "--resize", "x"], "Invalid value for '--resize'"),
    ],
)
def test_bad_input_is_a_one_line_error(source, tmp_path, args, message):
    args = [a.format(src=source[0], tmp=tmp_path) for a in args]
    assert_one_line_error(launch(tmp_path / "home", "data", "convert", *args), message)


def test_cluster_commands_give_each_node_its_share_and_cores():
    nodes = [Node(name=f"node{i}", address="127.0.0.1", port=2200 + i, role="worker", slots=1, cpus=4,
                  workdir=f"/w/{i}") for i in range(2)]
    nodes.append(Node(name="reducer0", address="127.0.0.1", port=2202, role="reducer", slots=0, cpus=8,
                      workdir="/w/r"))
    cluster = Cluster(name="c", backend="local", nodes=nodes, user="u", ssh_config="/s", known_hosts="/k",
                      python="/venv/bin/python")
    spec = dataprep.ConvertSpec(src="/fsx/imagenet raw", out="/fsx/shards", resize=256)
    steps = dataprep.plan_convert(cluster, spec)
    base = ("TTY_COMPATIBLE=0 /venv/bin/python -m launcher data convert '/fsx/imagenet raw' --out /fsx/shards "
            "--shard-size 1000 --seed 0 --quality 95 --resize 256")
    assert [(n.name, cmd) for n, cmd in steps] == [
        ("node0", f"{base} --workers 4 --node-index 0 --node-count 3 2>&1"),
        ("node1", f"{base} --workers 4 --node-index 1 --node-count 3 2>&1"),
        ("reducer0", f"{base} --workers 8 --node-index 2 --node-count 3 2>&1"),
    ]
    assert dataprep.merge_command(cluster, spec, 3) == (
        "/venv/bin/python -m launcher data convert --out /fsx/shards --node-count 3 --merge 2>&1")
    fixed = dataprep.plan_convert(cluster, spec.model_copy(update={"workers": 2}))
    assert all("--workers 2 " in cmd for _, cmd in fixed)


@pytest.mark.cluster
@needs_root
def test_convert_on_a_two_node_local_cluster_matches_one_machine(source, tmp_path):
    src, single, manifest = source
    home, converted = tmp_path / "home", "/fsx/scaletrain/converted"
    up(home, "--nodes", "2")
    try:
        on_nodes = put_on_shared(home, src, "/fsx/scaletrain/raw")  # ImageNet uploaded to FSx
        out = on_host(home, converted)  # where this machine sees what the nodes wrote
        expected = {**manifest, "options": {**manifest["options"], "source": on_nodes}}  # the nodes' path to SRC
        proc = launch(home, "data", "convert", on_nodes, "--out", converted, "--cluster", "local", *CLI_OPTIONS)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "[node0] wrote" in proc.stdout and "[node1] wrote" in proc.stdout
        assert f"wrote {converted}/manifest.json (train: 15 samples in 5 shards, val: 6 samples in 3 shards)" \
            in proc.stdout
        assert json.loads((out / "manifest.json").read_text()) == expected
        node_manifests = [json.loads((out / f"manifest.node-{i}-of-2.json").read_text()) for i in range(2)]
        written = [{e["name"] for e in part["shards"]} for part in node_manifests]
        assert written[0] and written[1] and not written[0] & written[1]  # both nodes worked, on disjoint shards
        for entry in manifest["shards"]:
            assert (out / entry["name"]).read_bytes() == (single / entry["name"]).read_bytes()

        # Started again: every node verifies and keeps its shards.
        proc = launch(home, "data", "convert", on_nodes, "--out", converted, "--cluster", "local", *CLI_OPTIONS)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "[node0] resuming: " in proc.stdout and "[node1] resuming: " in proc.stdout
        assert json.loads((out / "manifest.json").read_text()) == expected

        # Ctrl-C while both nodes convert: the launcher stops at once in one line, the nodes' conversions end with
        # their connections (a pty's SIGHUP), and the same command finishes what they left.
        make_sample(tmp_path / "big", classes=6, per_class=200, val_per_class=10, seed=3)
        big = put_on_shared(home, tmp_path / "big", "/fsx/scaletrain/big")
        big_out, args = "/fsx/scaletrain/big-shards", ["--shard-size", "50", "--resize", "48", "--workers", "2"]
        proc = launch_background(home, "data", "convert", big, "--out", big_out, "--cluster", "local", *args)
        deadline = time.monotonic() + 300
        while len(list(on_host(home, big_out).glob("*.tar"))) < 2 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 130 and err.strip().splitlines()[-1:] == ["error: interrupted"], err
        assert time.monotonic() - sent < 5
        assert not (on_host(home, big_out) / "manifest.json").exists()
        deadline = time.monotonic() + 10
        while converting(big_out) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not converting(big_out), "a node kept converting after Ctrl-C"
        proc = launch(home, "data", "convert", big, "--out", big_out, "--cluster", "local", *args)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        reference = convert(tmp_path / "big", tmp_path / "big-single", shard_size=50, resize=48, workers=2)
        for entry in reference["shards"]:
            assert (on_host(home, big_out) / entry["name"]).read_bytes() == \
                (tmp_path / "big-single" / entry["name"]).read_bytes()

        # A node that fails is named, in one line: this machine's copy of the source is not on the nodes.
        proc = launch(home, "data", "convert", str(src), "--out", converted, "--cluster", "local")
        assert_one_line_error(proc, "conversion failed on node0 (exit 2), node1 (exit 2)")  # a bad SRC: exit 2
        assert f"[node0] error: SRC {src} does not exist" in proc.stdout
    finally:
        launch(home, "local", "down")


def converting(out: str) -> list[int]:
    """Processes on this machine (the rehearsal nodes' too: they are its namespaces) converting into `out`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes().split(b"\0")
        except OSError:
            continue
        if b"convert" in argv and out.encode() in argv:
            found.append(int(cmdline.parent.name))
    return found


def test_progress_off_a_terminal_is_a_line_with_rate_and_eta(monkeypatch, capsys):
    from launcher.cli import data as cli

    monkeypatch.setattr(cli._Tick, "LINE_EVERY_S", 0.0)
    with cli._progress("convert", 0) as tick:
        tick.restart(4)
        tick()
        tick()
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2
    assert lines[1].startswith("convert: 2/4 images, ") and " img/s, ETA 00:00:0" in lines[1]
