"""A node that hangs mid-run (frozen, not dead) on a real 2-node rehearsal cluster (each node its own machine, sharing
only /fsx): the watchdog names it and stops the job, where mpirun alone would wait for it for ever."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from clusterutil import (
    SHARDS,
    TINY,
    assert_one_line_error,
    cluster_state,
    descendants,
    launch,
    launch_background,
    needs_root,
    node_run,
    on_host,
    put_on_shared,
    tiny_shards,
    up,
)

pytestmark = [pytest.mark.cluster, needs_root]

# Probing every 2 s, a node is given up after 3 misses (each miss waits up to 10 s for a reply).
FAST_WATCH = ["--probe-interval", "2", "--probe-misses", "3"]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hang")
    return tiny_shards(root / "home", root)


JOB = ("mpirun", "orted", "training.train")  # what mpirun starts on a node: its daemon and the ranks


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return 0


def job_on(home: Path, node: str, words: tuple[str, ...] = JOB) -> list[int]:
    """The job's processes still running on a rehearsal node (under its first process)."""
    first = cluster_state(home)["processes"][node]
    return [p for p in descendants(first) if any(w in cmdline(p) for w in words)]


def hung_node(home: Path, node: str) -> list[int]:
    """What freezes to hang a rehearsal node: every process of the machine (its sshd, whose new sessions get no
    banner, every session, the watchdog's open connection among them, and the job's processes), as a frozen
    instance. Nothing of it is shared with the other nodes but /fsx."""
    first = cluster_state(home)["processes"][node]
    return [first, *descendants(first)]


@contextlib.contextmanager
def training(home: Path, run: str, shards: Path, *watch: str):
    """`launch train` for many epochs on a fresh 2-node cluster (the tiny shards uploaded to its /fsx), yielded once
    rank 0 has written metrics; the processes a test stops are SIGCONT'ed and killed, and the cluster is brought
    down, whatever happens."""
    up(home, "--nodes", "2")
    stopped: list[int] = []
    proc = None
    try:
        put_on_shared(home, shards, SHARDS)
        proc = launch_background(home, "train", "--data", SHARDS, "--epochs", "200", "--output", run, *TINY, *watch)
        metrics = on_host(home, run) / "metrics.jsonl"
        deadline = time.monotonic() + 300
        while not metrics.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, "the run ended before it was under way:\n" + proc.stdout.read()[-3000:]
        yield proc, stopped
    finally:
        # Thawed first; then only the job's processes are killed (`local down` stops the sshd).
        for pid, sig in [*((p, signal.SIGCONT) for p in stopped),
                         *((p, signal.SIGKILL) for p in stopped if any(w in cmdline(p) for w in JOB))]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.communicate()
        launch(home, "local", "down")


def freeze(pids: list[int], stopped: list[int]) -> None:
    stopped += pids
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)


def test_a_hung_node_is_named_and_the_job_stopped(shards, tmp_path):
    home = tmp_path / "home"
    with training(home, node_run(tmp_path.name), shards, *FAST_WATCH) as (proc, stopped):
        assert job_on(home, "node1"), "nothing runs on node1"
        # node1 freezes, the whole machine: its sshd (the kernel still accepts TCP, nothing answers) and the job.
        freeze(hung_node(home, "node1"), stopped)
        out, err = proc.communicate(timeout=300)
        left = job_on(home, "node0")
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "training failed: node node1 stopped answering (no reply to 3 probes", "may be hung")
    assert "node0" not in err.splitlines()[-1]
    assert "[watchdog] node node1 stopped answering" in out
    assert "fetched " in out and f" from node0:{node_run(tmp_path.name)} to " in out  # the record came back
    assert left == [], "mpirun or a rank was left running on node0"


def test_when_the_first_node_hangs_the_launcher_abandons_its_stream(shards, tmp_path):
    home = tmp_path / "home"
    with training(home, node_run(tmp_path.name), shards, *FAST_WATCH) as (proc, stopped):
        # node0 runs mpirun and carries the launcher's stream: nothing there can stop the job any more.
        freeze(hung_node(home, "node0"), stopped)
        out, err = proc.communicate(timeout=300)
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "training failed: node node0 stopped answering (no reply to 3 probes", "may be hung")
    # Nothing more is asked of the hung node: fetching the record from it would only wait out its timeout.
    assert "could not fetch the run's record" not in out and "fetched " not in out


def test_a_job_that_stops_printing_is_stopped_though_every_node_answers(shards, tmp_path):
    home = tmp_path / "home"
    with training(home, node_run(tmp_path.name), shards, *FAST_WATCH, "--stall-timeout", "30") as (proc, stopped):
        # node1's rank freezes but its sshd does not: every probe is answered, rank 0 waits in allreduce.
        freeze(job_on(home, "node1", ("training.train",)), stopped)
        assert stopped, "no rank runs on node1"
        out, err = proc.communicate(timeout=300)
        left = job_on(home, "node0")
    assert_one_line_error(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                          "training failed: no output from the job for", "a rank may be stuck in a collective")
    assert left == [], "mpirun or a rank was left running on node0"


def test_bad_watchdog_options(tmp_path):
    home = tmp_path / "home"
    for args, message in ((["--probe-interval", "0"], "--probe-interval must be a number of seconds > 0, got 0"),
                          (["--probe-misses", "0"], "--probe-misses must be >= 1, got 0"),
                          (["--stall-timeout", "-5"], "--stall-timeout must be a number of seconds >= 0")):
        assert_one_line_error(launch(home, "train", *args), message)


def test_the_stop_script_kills_an_mpirun_that_ignores_sigterm_and_what_it_started(tmp_path):
    from launcher.execute.run import stop_job_script

    pidfile = tmp_path / "mpirun.pid"
    # A stand-in for an mpirun stuck on a hung node: it ignores SIGTERM and has started a rank.
    job = subprocess.Popen(["bash", "-c", f"echo $$ > {pidfile}; trap '' TERM; sleep 300 & wait"])
    try:
        deadline = time.monotonic() + 30
        while not (pidfile.is_file() and descendants(job.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        tree = [job.pid, *descendants(job.pid)]
        assert len(tree) == 2
        subprocess.run(["bash", "-c", stop_job_script(str(pidfile))], check=True, timeout=60)
        job.wait(timeout=30)
        assert not [p for p in tree[1:] if Path(f"/proc/{p}").exists() and "sleep" in cmdline(p)]
    finally:
        job.kill()


def test_the_probes_keep_one_connection_per_node(tmp_path, monkeypatch):
    # Over SSM every new connection is a new session (an AWS CLI process, a StartSession call): the probes reuse
    # one per node while it answers. sshd logs each connection it accepts.
    from launcher import cluster as clusters
    from launcher.execute.run import Watchdog
    from launcher.plans import watchdog

    home = tmp_path / "home"
    up(home, "--nodes", "2")
    try:
        monkeypatch.setenv("SCALETRAIN_HOME", str(home))
        c = clusters.load("local")
        # what each node's sshd logged since it booted (its journal, read from this machine: not over ssh, which
        # would be one more connection to count)
        from launcher.local import rehearsal_nodes

        def sshd_accepted(node) -> int:
            init = rehearsal_nodes.init_pid(c.processes[node.name])
            out = subprocess.run(["nsenter", "-t", str(init), "-a", "journalctl", "--no-pager", "-o", "cat",
                                  "-u", "ssh.service"], capture_output=True, text=True, timeout=60).stdout
            return out.count("Accepted publickey")

        before = {n.name: sshd_accepted(n) for n in c.nodes}
        verdicts = []  # one per round of probes

        def counted(history, *args, **kwargs):
            verdicts.append(len(history))
            return real(history, *args, **kwargs)

        real = watchdog.verdict
        monkeypatch.setattr(watchdog, "verdict", counted)
        dog = Watchdog(c, c.nodes[0], c.nodes, watchdog.Watch(interval_s=0.3, misses=3, stall_s=0), "/nowhere")
        with dog:
            deadline = time.monotonic() + 60
            while len(verdicts) < 6 and time.monotonic() < deadline:
                time.sleep(0.1)
        assert len(verdicts) >= 6
        assert dog.reason is None
        accepted = {n.name: sshd_accepted(n) - before[n.name] for n in c.nodes}
        assert accepted == {"node0": 1, "node1": 1}, accepted
    finally:
        launch(home, "local", "down")
