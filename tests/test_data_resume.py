"""Resuming the converter: kill -9 at every step of a run, then run again, and get the uninterrupted output.

The kill points are exact: a subprocess converts and SIGKILLs itself at the n-th input, or just before or just
after the n-th rename (every journal record, shard and manifest reaches its final name by one). A second test
kills a real multi-process `launch data convert` from outside, mid-run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from clusterutil import ROOT, launch
from PIL import Image

from training.convert import ArgumentError, convert
from training.sample import make_sample
from training.shards import JOURNAL

SHARD_SIZE, SEED = 5, 3

KILLER = """
import os, signal, sys
from pathlib import Path
from training import convert

src, out, point, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
count = 0

def hit():
    global count
    count += 1
    if count == n:
        os.kill(os.getpid(), signal.SIGKILL)

real_replace = os.replace

def replace(a, b):
    if point == "before-rename":
        hit()
    real_replace(a, b)
    if point == "after-rename":
        hit()

os.replace = replace
convert.convert(Path(src), Path(out), shard_size=int(sys.argv[5]), seed=int(sys.argv[6]),
                on_sample=hit if point == "sample" else None)
sys.exit(3)  # never killed: the kill point is past the end of the run
"""


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("resume") / "src"
    make_sample(src, classes=3, per_class=4, val_per_class=2, seed=1)
    (src / "train" / "n01440764" / "n01440764_9.JPEG").write_bytes(b"")  # a rejection must survive resuming
    return src


@pytest.fixture(scope="module")
def reference(source, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("reference")
    return out, convert(source, out, shard_size=SHARD_SIZE, seed=SEED)


def kill_at(source: Path, out: Path, point: str, n: int) -> None:
    proc = subprocess.run([sys.executable, "-c", KILLER, str(source), str(out), point, str(n), str(SHARD_SIZE),
                           str(SEED)], env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


# 19 inputs in 5 shards: renames are the journal's conversion.json (which conversion OUT is being written for), record
# 0, shard 0, ..., record 4, shard 4, manifest (12 in all).
INPUTS_PER_SHARD = [5, 5, 3, 5, 1]  # train: 12 images and an empty file; val: 6 images
KILL_POINTS = ([("sample", n) for n in (1, 5, 6, 13, 19)] + [("before-rename", n) for n in range(1, 13)]
               + [("after-rename", n) for n in range(1, 13)])


@pytest.mark.parametrize(("point", "n"), KILL_POINTS)
def test_kill_9_at_any_point_then_resume_gives_the_uninterrupted_output(source, reference, tmp_path, point, n):
    ref_out, ref_manifest = reference
    assert len(ref_manifest["shards"]) == 5
    out = tmp_path / "out"
    kill_at(source, out, point, n)

    # Killed: whatever has a shard's final name is that complete shard, never a partial one.
    expected = files_under(ref_out)
    finished = [name for name in expected if (out / name).is_file() and name.endswith(".tar")]
    for name in finished:
        assert (out / name).read_bytes() == expected[name]

    kept = []
    manifest = convert(source, out, shard_size=SHARD_SIZE, seed=SEED, on_start=lambda _, k: kept.append(k))
    assert manifest == ref_manifest
    assert files_under(out) == expected  # same bytes, no partial file or journal left behind
    if point == "sample":  # killed while converting input n: the shards before it are finished
        finished_shards = sum(1 for end in np.cumsum(INPUTS_PER_SHARD) if end < n)
    else:  # renames: conversion.json, record 0, shard 0, record 1, ...
        finished_shards = min(max(n - 2 if point == "before-rename" else n - 1, 0) // 2, 5)
    assert kept == [finished_shards]  # the finished shards were verified and kept, not written again


def test_a_finished_run_started_again_converts_nothing(source, reference, tmp_path):
    out = tmp_path / "out"
    first = convert(source, out, shard_size=SHARD_SIZE, seed=SEED)
    before = {p: p.stat().st_mtime_ns for p in out.glob("*.tar")}
    calls = []
    again = convert(source, out, shard_size=SHARD_SIZE, seed=SEED, on_start=lambda *a: calls.append(a))
    assert again == first and calls == [(0, 5)]
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.tar")} == before


def test_a_damaged_shard_or_other_options_are_converted_again(source, reference, tmp_path):
    ref_out, ref_manifest = reference
    out = tmp_path / "out"
    convert(source, out, shard_size=SHARD_SIZE, seed=SEED)
    damaged = out / "train-000001.tar"
    data = bytearray(damaged.read_bytes())
    data[700] ^= 0xFF
    damaged.write_bytes(bytes(data))
    calls = []
    assert convert(source, out, shard_size=SHARD_SIZE, seed=SEED, on_start=lambda *a: calls.append(a)) == ref_manifest
    assert calls == [(SHARD_SIZE, 4)]  # only the damaged shard, 5 inputs, written again
    assert files_under(out) == files_under(ref_out)

    # Other options are another conversion: refused, nothing touched (issue 33) ...
    before = files_under(out)
    with pytest.raises(ArgumentError, match="its --shard-size is 5, this run's 8; its --quality is 95, this run's 90"):
        convert(source, out, shard_size=8, seed=SEED, quality=90)
    assert files_under(out) == before
    # ... unless replaced: nothing kept, and shards the new plan does not have are removed.
    calls.clear()
    bigger = convert(source, out, shard_size=8, seed=SEED, quality=90, replace=True,
                     on_start=lambda *a: calls.append(a))
    assert calls == [(19, 0)]
    assert sorted(p.name for p in out.glob("*.tar")) == sorted(e["name"] for e in bigger["shards"])
    assert not (out / JOURNAL).exists()


# --- a real multi-process run, killed from outside ---------------------------------------------------------


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def alive(pid: int) -> bool:
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.fixture(scope="module")
def heavy_source(tmp_path_factory) -> Path:
    """30 large JPEGs: resizing them keeps two workers busy for a second or two."""
    src = tmp_path_factory.mktemp("heavy") / "src"
    rng = np.random.default_rng(0)
    x = np.linspace(0, 255, 1600, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, 1200, dtype=np.float32)[:, None, None]
    pixels = np.concatenate([x + 0 * y, y + 0 * x, (x + y) / 2], axis=2) + rng.normal(0, 8, (1200, 1600, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
    for wnid in ("n01440764", "n01443537", "n01484850"):
        (src / "train" / wnid).mkdir(parents=True)
        for i in range(10):
            image.save(src / "train" / wnid / f"{wnid}_{i}.JPEG", quality=90)
    return src


def test_kill_9_of_a_parallel_launch_data_convert_then_resume(heavy_source, tmp_path):
    options = ["--shard-size", "2", "--resize", "1100", "--seed", "1"]
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SCALETRAIN_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([sys.executable, "-m", "launcher", "data", "convert", str(heavy_source), "--out",
                             str(out), "--workers", "2", *options], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not list(out.glob("train-*.tar")) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        workers = children(proc.pid)
        assert proc.poll() is None and not (out / "manifest.json").exists(), "finished before it could be killed"
        assert len(workers) >= 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers)  # no worker writes on behind a killed run
    assert len(list(out.glob("train-*.tar"))) < 15

    resumed = launch(tmp_path / "home", "data", "convert", str(heavy_source), "--out", str(out), "--workers", "2",
                     *options, check=True)
    assert "resuming: " in resumed.stderr and "verified and kept" in resumed.stderr
    assert "wrote " in resumed.stdout and "(train: 30 samples in 15 shards); 0 inputs rejected" in resumed.stdout
    reference = convert(heavy_source, tmp_path / "reference", shard_size=2, resize=1100, seed=1)
    assert files_under(out) == files_under(tmp_path / "reference")
    assert reference["splits"] == {"train": {"samples": 30, "shards": 15}}
