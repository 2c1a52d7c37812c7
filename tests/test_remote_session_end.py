"""remote.ends_with_session: a command run without a pty ends, with everything it started, when its SSH session
ends, and otherwise keeps its own output and status. Run here as sshd runs a session's command without a pty: the
login shell (bash, and dash for a node whose shell is sh) with `-c LINE`, in a session of its own (setsid), stdin a
pipe from the server that reaches end-of-file when the connection is gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest

from launcher.execute.remote import ends_with_session

SHELLS = [s for s in ("bash", "dash") if shutil.which(s)]


def _session(shell: str, command: str) -> subprocess.Popen:
    return subprocess.Popen(["setsid", shell, "-c", ends_with_session(command)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _ended(proc: subprocess.Popen) -> tuple[int, str, str]:
    """(status, stdout, stderr) once the command ended by itself, its session still open; the session then ends."""
    out, err = proc.stdout.read(), proc.stderr.read()
    status = proc.wait(timeout=30)
    proc.stdin.close()
    return status, out, err


def _alive(pattern: str) -> bool:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True).returncode == 0


@pytest.mark.parametrize("shell", SHELLS)
def test_output_and_status_are_the_commands(shell):
    assert _ended(_session(shell, "echo out; echo err >&2; exit 7")) == (7, "out\n", "err\n")


@pytest.mark.parametrize("shell", SHELLS)
def test_a_command_ending_in_a_comment_or_reading_stdin_still_ends(shell):
    assert _ended(_session(shell, "cat; echo read-nothing # a comment")) == (0, "read-nothing\n", "")


@pytest.mark.parametrize("shell", SHELLS)
def test_a_lost_session_ends_the_command_and_what_it_started(shell):
    token = f"7{os.getpid() % 1000}.{SHELLS.index(shell)}31"
    proc = _session(shell, f"sleep {token} & sleep {token}1; echo never")
    deadline = time.monotonic() + 10
    while not _alive(f"^sleep {token}1$") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive(f"^sleep {token}$") and _alive(f"^sleep {token}1$")
    proc.stdin.close()  # the connection is gone: sshd closes the command's stdin
    out = proc.stdout.read()
    proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while _alive(f"^sleep {token}") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(f"^sleep {token}"), "the command outlived its session"
    assert "never" not in out and proc.returncode != 0


@pytest.mark.parametrize("shell", SHELLS)
def test_a_command_that_ends_leaves_what_it_started_on_purpose(shell):
    """A daemon the command started (nohup, setsid) stays once the command has ended, and the session's end later
    hangs nothing up: the watcher is gone with the command."""
    token = f"8{os.getpid() % 1000}.{SHELLS.index(shell)}42"
    status, out, _ = _ended(_session(shell, f"nohup sleep {token} >/dev/null 2>&1 & echo started"))
    try:
        assert (status, out) == (0, "started\n")
        time.sleep(0.5)
        assert _alive(f"^sleep {token}$")
    finally:
        subprocess.run(["pkill", "-f", f"^sleep {token}$"])
