"""The check that the suite leaves the machine as it found it (tests/machine_check.py) can fail: a run of pytest of its
own, on a tiny test file, that leaves a file under a watched directory, a mount, a network namespace, a bridge and two
processes (a child, and a daemon that left pytest's session) behind ends failing and names each; the same run
leaving nothing passes, under pytest-xdist too, where the controller alone checks, once.

Each run is in a private mount and network namespace whose /run is its own (unshare(1)): what it leaves behind goes
with it, and another run on this machine cannot add a namespace or an interface under it."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

LEAVES_THINGS = '''
import os, subprocess, sys
from pathlib import Path

def test_leaves_things_behind(tmp_path):
    (Path(os.environ["SCALETRAIN_MACHINE_WATCH"]) / "left-behind.conf").write_text("x")
    (tmp_path / "m").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "leftover-tmpfs", str(tmp_path / "m")], check=True)
    subprocess.run(["ip", "netns", "add", "leftover-ns"], check=True)
    subprocess.run(["ip", "link", "add", "leftoverbr", "type", "bridge"], check=True)
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    Path(os.environ["PIDS"], "child").write_text(str(child.pid))
    # A daemon: forked away from pytest's session (setsid -f), its parent gone; its command line names the run's tmp.
    code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    subprocess.run(["setsid", "-f", sys.executable, "-c", code, str(tmp_path / "daemon.pid")], check=True)
    for _ in range(100):
        if (tmp_path / "daemon.pid").exists() and (tmp_path / "daemon.pid").read_text():
            break
        __import__("time").sleep(0.05)
    Path(os.environ["PIDS"], "daemon").write_text((tmp_path / "daemon.pid").read_text())
    # A daemon that names nothing of the run: out of pytest's session and parent chain, only its environment says so.
    subprocess.run(["setsid", "-f", "sh", "-c", 'echo $$ > "$PIDS/anonymous"; exec sleep 601'], check=True)
    for _ in range(100):
        if Path(os.environ["PIDS"], "anonymous").exists() and Path(os.environ["PIDS"], "anonymous").read_text():
            break
        __import__("time").sleep(0.05)
'''

LEAVES_A_FILE = '''
import os
from pathlib import Path

def test_one(): pass

def test_leaves_a_file(tmp_path):
    (Path(os.environ["SCALETRAIN_MACHINE_WATCH"]) / "left-behind.conf").write_text("x")
'''

LEAVES_NOTHING = '''
import os, subprocess
from pathlib import Path

def test_cleans_up(tmp_path):
    assert (Path(os.environ["SCALETRAIN_MACHINE_WATCH"]) / "existing.conf").read_text()   # reading changes nothing
    (tmp_path / "m").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(tmp_path / "m")], check=True)
    subprocess.run(["umount", str(tmp_path / "m")], check=True)
    subprocess.run(["sleep", "0.1"], check=True)

def test_two(): pass
'''


def namespace() -> list[str]:
    flags = ["--mount", "--net"] if os.geteuid() == 0 else ["--user", "--map-root-user", "--mount", "--net"]
    argv = [shutil.which("unshare") or "unshare", *flags, "--", "bash", "-c",
            'mount -t tmpfs tmpfs /run && exec "$@"', "private"]
    probe = subprocess.run([*argv, "ip", "link", "add", "probebr", "type", "bridge"], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no private mount and network namespace here: {probe.stderr.strip()}")
    return argv


def run_pytest(tmp_path: Path, source: str, *extra: str, beside: str = "") -> tuple[subprocess.CompletedProcess, Path]:
    """The tiny test file run by pytest of its own with the machine check; ``beside``: a shell loop run meanwhile by
    the shell that starts pytest (the same session, not pytest's descendant), as a developer's terminal would."""
    run = tmp_path / "run"
    for d in ("watched", "pids", "tests"):
        (run / d).mkdir(parents=True, exist_ok=True)
    (run / "watched" / "existing.conf").write_text("there before\n")
    (run / "tests" / "test_tiny.py").write_text(source)
    (run / "tests" / "pytest.ini").write_text("[pytest]\n")
    env = {**os.environ, "PYTHONPATH": str(TESTS), "SCALETRAIN_MACHINE_WATCH": str(run / "watched"),
           "PIDS": str(run / "pids")}
    shell = []
    if beside:
        # The loop a bash of its own, whose command line (unlike a subshell's, a copy of this one's) names no path
        shell = ["bash", "-c", 'bash -c "$BESIDE" & loop=$!; "$@"; rc=$?; touch "$PIDS/stop"; wait $loop; exit $rc',
                 "shell"]
        env["BESIDE"] = beside
    done = subprocess.run([*namespace(), *shell, sys.executable, "-m", "pytest", "-p", "machine_check", "-p",
                           "no:cacheprovider", "-q", "-c", str(run / "tests" / "pytest.ini"), "--rootdir",
                           str(run / "tests"), "--basetemp", str(run / "basetemp"), *extra,
                           str(run / "tests" / "test_tiny.py")], env=env, capture_output=True, text=True, timeout=300,
                          # a session of its own: "started after the run began, in pytest's session" must not
                          # take in another xdist worker's processes (a fresh clone flagged a concurrent
                          # `launch local fault`, 2026-11-28)
                          start_new_session=True)
    return done, run


def end_left_processes(run: Path) -> None:
    """The processes the tiny test started and left, which this test started: ended by their ids."""
    for f in (run / "pids").iterdir():
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(f.read_text()), signal.SIGKILL)


def test_a_session_that_leaves_things_behind_fails_naming_each(tmp_path) -> None:
    done, run = run_pytest(tmp_path, LEAVES_THINGS)
    try:
        pids = {f.name: int(f.read_text()) for f in (run / "pids").iterdir()}
        out = done.stdout
        assert done.returncode == 1, out + done.stderr
        assert "1 passed" in out
        assert "error: the test session changed this machine or left things behind (7):" in out
        assert f"  added {run / 'watched' / 'left-behind.conf'}" in out
        assert "  network namespace left: leftover-ns" in out
        assert "  network interface left: leftoverbr" in out
        assert "  mount left: " in out and "/m (tmpfs from leftover-tmpfs)" in out
        assert f"  process left: {pids['child']} sleep 600" in out
        assert f"  process left: {pids['daemon']} {sys.executable} -c" in out
        assert f"  process left: {pids['anonymous']} sleep 601" in out
        assert "existing.conf" not in out
    finally:
        end_left_processes(run)


@pytest.mark.parametrize("workers", [(), ("-n", "2")], ids=["one process", "xdist"])
def test_a_session_that_leaves_nothing_passes(tmp_path, workers) -> None:
    done, _ = run_pytest(tmp_path, LEAVES_NOTHING, *workers)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert "changed this machine" not in done.stdout + done.stderr


def test_what_the_rest_of_the_machine_does_meanwhile_is_not_the_runs(tmp_path) -> None:
    """A developer's shell loop beside the suite, in the terminal's session, starts a `sleep` every moment: each
    started after the run began, in pytest's session, and none of them the run's (issue 45: a passing module
    ended "process left: 18510 sleep 1" when the check took the whole session as the run's)."""
    done, run = run_pytest(tmp_path, LEAVES_NOTHING, beside='while [ ! -e "$PIDS/stop" ]; do sleep 0.2; done')
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert "changed this machine" not in done.stdout + done.stderr
    assert (run / "pids" / "stop").exists()   # the loop ran beside pytest until it ended


def test_under_xdist_the_controller_checks_once(tmp_path) -> None:
    done, run = run_pytest(tmp_path, LEAVES_A_FILE, "-n", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "2 passed" in done.stdout
    assert done.stdout.count("error: the test session changed this machine") == 1
    assert done.stdout.count(f"added {run / 'watched' / 'left-behind.conf'}") == 1


def test_another_runs_rehearsal_cluster_is_not_this_runs(tmp_path) -> None:
    """Names shaped like a rehearsal cluster's count only with the tag of a state directory below this run's
    temporary directories (launcher/plans/rehearsal.network); any other new namespace or interface counts."""
    from machine_check import Snapshot, differences

    from launcher.plans import rehearsal

    ours = rehearsal.tag(str((tmp_path / "popen-gw0" / "test_up0" / "home" / "clusters" / "local").resolve()))
    (tmp_path / "popen-gw0" / "test_up0").mkdir(parents=True)   # the cluster's own directory already removed
    theirs = rehearsal.tag("/tmp/pytest-of-root/pytest-9/popen-gw1/test_other0/clusters/local")
    before = Snapshot({}, set(), {"lo"}, set(), 0)
    after = Snapshot({}, {f"st-{ours}-node0", f"st-{theirs}-node0", "other-ns"},
                     {"lo", f"st{ours}br", f"st{ours}v0", f"st{theirs}br", "dummy7"}, set(), 0)
    assert differences(before, after, [], [str(tmp_path)]) == [
        "network namespace left: other-ns", f"network namespace left: st-{ours}-node0",
        "network interface left: dummy7", f"network interface left: st{ours}br", f"network interface left: st{ours}v0"]
