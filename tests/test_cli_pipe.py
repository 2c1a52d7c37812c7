"""A reader that stops early (`launch cost | head -1`) ends every command one way, in one place (launcher/__main__.py):
quietly, status 141, as git and coreutils end. Real pipes, real processes: the pipe's read end is closed before the
command starts, so its first write finds no reader whatever the pipe's buffer holds."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import __main__ as entry

ROOT = Path(__file__).resolve().parent.parent


def _launch_into_closed_pipe(argv: list[str], tmp_path: Path, *, stream: str = "stdout") -> tuple[int, str]:
    """(exit status, what the other stream got) of `python -m launcher ARGV` whose ``stream`` is a pipe nobody
    reads."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    other = tmp_path / "other"
    env = dict(os.environ, SCALETRAIN_HOME=str(tmp_path / "home"), COLUMNS="100")
    with other.open("w") as seen:
        streams = {"stdout": write_end, "stderr": seen} if stream == "stdout" else {"stdout": seen,
                                                                                     "stderr": write_end}
        proc = subprocess.run([sys.executable, "-m", "launcher", *argv], cwd=ROOT, env=env,
                              stdin=subprocess.DEVNULL, timeout=120, **streams)
    os.close(write_end)
    return proc.returncode, other.read_text()


@pytest.mark.parametrize("argv", [
    ["--help"],                                                         # typer's own rich console
    ["plan", "--nodes", "1", "--instance-type", "p4d.24xlarge"],        # our rich console
    ["plan", "--nodes", "1", "--instance-type", "p4d.24xlarge", "--json"],  # sys.stdout.write
    ["cost", "--instance-types", "p4d.24xlarge", "--nodes", "1", "--strategies", "horovod", "--out", "OUT"],
])
def test_a_closed_stdout_ends_quietly_with_141(argv, tmp_path):
    """Each exited 1 before: rich's default for a broken pipe, and typer's for any other write."""
    code, err = _launch_into_closed_pipe([str(tmp_path / "r") if a == "OUT" else a for a in argv], tmp_path)
    assert (code, err) == (141, "")


def test_a_closed_stderr_ends_the_same_way(tmp_path):
    code, out = _launch_into_closed_pipe(["plan", "--nodes", "0", "--instance-type", "p4d.24xlarge"], tmp_path,
                                         stream="stderr")
    assert (code, out) == (141, "")


def test_what_a_reader_reads_before_it_stops_is_the_output(tmp_path):
    """`launch plan | head -1`: the first line arrives, then the command ends with 141 and says nothing more."""
    env = dict(os.environ, SCALETRAIN_HOME=str(tmp_path / "home"))
    shell = (f"{sys.executable} -m launcher plan --nodes 1 --instance-type p4d.24xlarge | head -1; "
             f"echo \"status=${{PIPESTATUS[0]}}\"")
    done = subprocess.run(["bash", "-c", shell], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    lines = done.stdout.splitlines()
    assert lines[0].startswith("plan: 1 x p4d.24xlarge") and lines[-1] == "status=141" and done.stderr == ""


def test_a_broken_pipe_elsewhere_is_not_taken_for_a_closed_stdout(monkeypatch):
    """An EPIPE from an SSH channel or a child's stdin is the command's failure, not a reader that stopped: it is
    not swallowed into 141 (stdout here is a pytest capture, open)."""
    monkeypatch.setattr(entry, "_closed", lambda stream: False)
    assert not entry._broken_pipe(BrokenPipeError(32, "Broken pipe"))
    monkeypatch.setattr(entry, "_closed", lambda stream: stream is sys.stdout)
    assert entry._broken_pipe(BrokenPipeError(32, "Broken pipe"))
    typer_exit = SystemExit(1)
    typer_exit.__context__ = BrokenPipeError(32, "Broken pipe")
    assert entry._broken_pipe(typer_exit)
    assert not entry._broken_pipe(SystemExit(2))  # any other exit is what it is


def test_closed_tells_a_pipe_without_reader_from_one_with(tmp_path):
    read_end, write_end = os.pipe()
    try:
        with os.fdopen(os.dup(write_end), "w") as stream:
            assert not entry._closed(stream)
            os.close(read_end)
            read_end = -1
            assert entry._closed(stream)
    finally:
        for fd in (read_end, write_end):
            if fd >= 0:
                os.close(fd)
    with (tmp_path / "f").open("w") as regular:
        assert not entry._closed(regular)
