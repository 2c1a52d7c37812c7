"""Ctrl-C during `launch exec` stops the launcher within seconds with one line and exit 130, and the nodes' commands
end with their SSH sessions (issue 26 asks this of every command that runs a remote command; exec already did, and
this keeps it so). On a loopback cluster (sshd processes on 127.0.0.1), under the cluster lock."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from clusterutil import launch, launch_background


def _running(token: str) -> bool:
    return subprocess.run(["pgrep", "-f", token], capture_output=True).returncode == 0


def _ctrl_c(proc: subprocess.Popen, what: str) -> tuple[str, float]:
    """Ctrl-C to a running launch command: (its stderr, seconds until it exited); a fail if not gone in 15 s."""
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"{what} was still running 15 s after Ctrl-C (it waited for the nodes' commands)")
    return err, time.monotonic() - started


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True, timeout=300)
    yield home
    launch(home, "local", "down", timeout=120)


def test_ctrl_c_during_exec_is_prompt_and_one_line(home):
    token = "61.2345"  # a sleep no one else runs, to know the nodes' commands started
    sleep = f"^sleep {token}$"  # the nodes' sleep itself: `launch exec -- sleep 61.2345` matches the bare words too,
    proc = launch_background(home, "exec", "--", "sleep", token)  # so the Ctrl-C came while it was still loading
    deadline = time.monotonic() + 60
    while not _running(sleep) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _running(sleep), "the nodes' commands never started"
    time.sleep(0.5)
    err, took = _ctrl_c(proc, "launch exec")
    assert took < 5
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "error: interrupted", err
    # ...and the nodes' commands end with their SSH sessions, leaving nothing running.
    deadline = time.monotonic() + 10
    while _running(sleep) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _running(sleep)


def test_ctrl_c_during_doctor_is_prompt_and_one_line(home):
    """Ctrl-C while `launch doctor` runs its MPI test across the nodes ends it with one line and exit 130. The hello
    is short on loopback nodes (a try whose doctor ended before the interrupt is tried again), too short to show
    that the wait is cut: invoke would wait for the command's end before raising, which a real node's nccl-tests
    makes minutes; tests/test_ssh_keepalive.py's Ctrl-C test holds remote.check to stopping a 30 s command at once."""
    for _ in range(5):
        proc = launch_background(home, "doctor")
        deadline = time.monotonic() + 60
        while not _running("doctor-hostfile") and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is not None:
            continue  # finished before its MPI test was seen: try again
        err, took = _ctrl_c(proc, "launch doctor")
        if proc.returncode != 130 and "interrupted" not in err:
            continue  # the MPI test had ended as the signal left: the doctor finished on its own
        assert took < 5
        assert proc.returncode == 130 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1] == "error: interrupted", err
        return
    pytest.fail("never caught launch doctor inside its MPI test in 5 tries")
