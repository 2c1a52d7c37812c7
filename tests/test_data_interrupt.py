"""Ctrl-C during `launch data convert --workers 2` and `launch data sample` (issue 26): the command stops within a
couple of seconds with one line and exit 130, whatever it was doing (importing, starting its workers, writing
shards, near the end), no worker prints a traceback or lingers, and the same command run again finishes with the
output an uninterrupted run gives.

A terminal's Ctrl-C sends SIGINT to every process of the foreground process group, the workers too; the tests do the
same: the command runs in a session of its own and gets `killpg(SIGINT)`. The issue saw a hang in 2 of 23 tries, so
one test interrupts the same command many times in a row.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterutil import ROOT, alive, launch

from launcher.local.backend import descendants
from training.convert import convert
from training.sample import make_sample

STOP_WITHIN_S = 3.0  # "a couple of seconds", with room for a loaded 2-core machine
CONVERT = ["--shard-size", "100", "--resize", "48", "--workers", "2"]  # the command


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[Path, Path]:
    """The issue's `big` data set, larger so that a conversion lasts long enough to be interrupted at each point;
    and its conversion, uninterrupted."""
    root = tmp_path_factory.mktemp("interrupt")
    make_sample(root / "big", classes=10, per_class=300, val_per_class=30)
    convert(root / "big", root / "reference", shard_size=100, resize=48, workers=2)
    return root / "big", root / "reference"


def start(home: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "SCALETRAIN_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-m", "launcher", *args], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def importing(proc: subprocess.Popen) -> bool:
    """The launcher is still importing its libraries (pydantic's core is loaded part-way through)."""
    try:
        return "pydantic_core" in Path(f"/proc/{proc.pid}/maps").read_text()
    except OSError:
        return False


def workers(proc: subprocess.Popen) -> list[int]:
    return [p for p in descendants(proc.pid) if "spawn_main" in cmdline(p)]


def wait_for(condition, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"ended before it could be interrupted: {proc.communicate()}"
        assert time.monotonic() < deadline, "the point to interrupt at never came"
        time.sleep(0.005)


def interrupt(proc: subprocess.Popen) -> tuple[float, str]:
    """Ctrl-C as a terminal sends it; (seconds until the command ended, its stderr). Fails on a hang, after
    leaving no process behind."""
    below = descendants(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)
    sent = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail("hung after Ctrl-C")
    took = time.monotonic() - sent
    deadline = time.monotonic() + 5
    while any(alive(p) for p in below) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [p for p in below if alive(p)], "processes left behind after Ctrl-C"
    return took, err


def assert_stopped_in_one_line(proc: subprocess.Popen, took: float, err: str, point: str) -> None:
    assert proc.returncode == 130, (point, proc.returncode, err)
    said = [line for line in err.splitlines() if line.strip() and not line.startswith("resuming: ")]  # progress
    assert said == ["error: interrupted"], (point, err)  # no traceback, no worker's "Fatal Python error"
    assert took < STOP_WITHIN_S, (point, took)


# Where Ctrl-C lands: the launcher importing; its workers starting (the issue's "Fatal Python error:
# init_import_site"); the first shards written; near the end.
POINTS = ["importing", "workers starting", "shards written", "near the end"]


def test_ctrl_c_during_a_parallel_convert_stops_at_once_in_one_line_and_the_same_command_resumes(big, tmp_path):
    src, reference = big
    out, home = tmp_path / "out", tmp_path / "home"
    total = len(list(reference.glob("*.tar")))
    args = ["data", "convert", str(src), "--out", str(out), *CONVERT]
    for attempt in range(12):
        point = POINTS[attempt % len(POINTS)]
        if point == "near the end":
            # On the same output the earlier attempts left, resuming: start afresh to have shards left to write.
            for p in out.glob("*.tar"):
                p.unlink()
        before = len(list(out.glob("*.tar")))
        proc = start(home, *args)
        wait_for(lambda proc=proc: importing(proc), proc)
        if point == "importing":
            pass
        elif point == "workers starting":
            wait_for(lambda proc=proc: workers(proc), proc)
        elif point == "shards written":
            wait_for(lambda before=before: len(list(out.glob("*.tar"))) >= before + 2, proc)
        else:
            wait_for(lambda: len(list(out.glob("*.tar"))) >= total - 4, proc)
        took, err = interrupt(proc)
        print(f"{point}: {before} shards before, {len(list(out.glob('*.tar')))} after, stopped in {took:.2f} s")
        assert_stopped_in_one_line(proc, took, err, point)
        assert not (out / "manifest.json").exists(), point

    done = launch(home, *args, check=True)
    assert "wrote " in done.stdout and "0 inputs rejected" in done.stdout
    assert files_under(out) == files_under(reference)


def test_ctrl_c_during_data_sample_stops_at_once_and_the_same_command_finishes_the_sample(tmp_path):
    out, home = tmp_path / "s", tmp_path / "home"
    args = ["data", "sample", "--out", str(out), "--classes", "10", "--per-class", "300"]
    for point in ("importing", "images written"):
        proc = start(home, *args)
        if point == "importing":
            wait_for(lambda proc=proc: importing(proc), proc)
        else:
            wait_for(lambda: len(list(out.glob("train/*/*.JPEG"))) >= 50, proc)
        took, err = interrupt(proc)
        assert_stopped_in_one_line(proc, took, err, point)

    launch(home, *args, check=True)
    make_sample(tmp_path / "fresh", classes=10, per_class=300)
    assert files_under(out) == files_under(tmp_path / "fresh")


def test_ctrl_c_during_convert_on_a_cluster_hangs_up_every_node_at_once(monkeypatch):
    """`launch data convert --cluster`: Ctrl-C ends the launcher at once and hangs up every node's conversion (its
    pty's SIGHUP ends it there), instead of waiting for every node to finish converting. The nodes here are stand-ins
    that convert until they are hung up (at most 20 s)."""
    import threading

    from launcher.cluster import Cluster, Node
    from launcher.execute import dataprep, remote
    from launcher.plans.dataprep import ConvertSpec

    hung_up: list[str] = []

    def converting(cluster, node, command, *, pty, hangup, **_):
        assert pty and command.startswith("TTY_COMPATIBLE=0 ")  # SIGHUP reaches it; no progress bars come back
        deadline = time.monotonic() + 20
        while not hangup.done and time.monotonic() < deadline:
            time.sleep(0.01)
        hung_up.append(node.name) if hangup.done else None
        return -1, []

    monkeypatch.setattr(remote, "stream", converting)
    nodes = [Node(name=f"node{i}", address="127.0.0.1", port=2200 + i, role="worker", slots=1, cpus=2,
                  workdir=f"/w/{i}") for i in range(2)]
    cluster = Cluster(name="c", backend="local", nodes=nodes, user="u", ssh_config="/s", known_hosts="/k",
                      python="/venv/bin/python")
    main = threading.main_thread().ident  # Ctrl-C while the nodes convert: the kernel gives it the main thread
    threading.Timer(0.5, signal.pthread_kill, (main, signal.SIGINT)).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        dataprep.convert_on_cluster(cluster, ConvertSpec(src="/fsx/raw", out="/fsx/shards"))
    assert time.monotonic() - started < 2
    deadline = time.monotonic() + 5
    while len(hung_up) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sorted(hung_up) == ["node0", "node1"]


def test_a_stopped_worker_pool_leaves_no_thread_for_the_exit_hook_to_race():
    """stop() returns once the pool's manager thread has closed its wake-up pipe. On Python 3.11 the interpreter's
    exit hook (concurrent.futures.process._python_exit) writes to that pipe without the pool's lock; a manager thread
    still closing it then printed an OSError traceback after "error: interrupted" (CI, Ctrl-C as workers started)."""
    import concurrent.futures.process as cfp

    from training.shardwriter import WorkerPool

    for _ in range(5):
        pool = WorkerPool(2)
        jobs = [pool.submit(time.sleep, 30) for _ in range(2)]
        while not all(job.running() for job in jobs):
            time.sleep(0.01)
        pool.stop()
        assert not [t for t, wakeup in list(cfp._threads_wakeups.items()) if t.is_alive() or not wakeup._closed]
        pool.progress.close()
