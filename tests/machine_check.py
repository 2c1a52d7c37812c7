"""The suite leaves the machine as it found it (issue 37 item 9): a pytest plugin that snapshots the machine once before
any test (and before pytest-xdist starts its workers) and compares once after every worker has finished, in the
controller process only. The session fails, naming each thing, when the run

- changed anything under /etc or /opt (each file's mtime and size) or /usr (each directory's mtime: a file added or
  removed changes its directory's; /usr has too many files to stat at every run);
- left a network namespace (`ip netns list`, /run/netns) or a network interface (`ip -o link`: a rehearsal cluster's
  bridge and veths) that was not there before: any, but of those named as a rehearsal cluster's only the ones of its
  own clusters (by the tag of their state directory), as other runs on this machine make theirs meanwhile;
- left a mount (the host's /proc/self/mountinfo) under its own temporary directories or the watched system
  directories (not under the rehearsal root's cache, where another run building the root mounts /proc and more);
- left a process of its own running: one whose parent chain leads to the pytest process, one that carries the run's
  own mark in its environment (RUN_MARK, set in the controller before any test or xdist worker starts and inherited
  by everything they start, a daemon that left pytest's session or lost its parent among them), or one whose command
  line names the run's temporary directories (or, started after the run began, the rehearsal root's cache).

  Only what the run made counts, never what the rest of the machine does meanwhile: a developer's shell loop in the
  same terminal session (its `sleep 1`, started after the run began, in pytest's session, but neither pytest's
  descendant nor carrying its mark) is not the run's (issue 45: a passing module ended "process left: 18510 sleep 1").
  A process of the run that both clears its environment and leaves the run's parent chain and names none of its
  directories is not seen; none of the suite's does (a rehearsal node's init is started with the cluster's
  directory, under the run's, on its command line).

A concurrent run of the suite, or a rehearsal cluster brought up by someone else meanwhile, can add a namespace or an
interface too: the failure lists exactly what it found, for a person to judge.

tests/conftest.py loads it; a run of its own loads it with `-p machine_check` (tests/test_zzz_machine_unchanged.py).
SCALETRAIN_MACHINE_WATCH (colon-separated directories, walked file by file) replaces /etc, /usr and /opt: that test's
way to watch a directory of its own.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

WATCH_ENV = "SCALETRAIN_MACHINE_WATCH"
RUN_MARK = "SCALETRAIN_TEST_RUN"    # environ(7) variable that marks every process this run starts
FILES_WATCHED = ("/etc", "/opt")     # every file: mtime and size
DIRS_WATCHED = ("/usr",)             # directories only: an added or removed file changes its directory's mtime
EXIT_GRACE_S = 3.0                   # how long a process of the run may take to finish exiting after it


def rehearsal_cache() -> Path:
    """Where launcher/local/rehearsal_root.py keeps the rehearsal root (cache_root; not imported: a plugin loaded
    before the project is importable must not need it)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaletrain" / "rehearsal"


def walk(root: str, dirs_only: bool) -> dict[str, tuple[int, int]]:
    """path -> (mtime_ns, size) of ``root`` and everything below it (directories only when ``dirs_only``), symbolic
    links not followed; what cannot be read is left out."""
    out: dict[str, tuple[int, int]] = {}
    try:
        st = os.lstat(root)
    except OSError:
        return out
    out[root] = (st.st_mtime_ns, 0)
    stack = [root]
    while stack:
        d = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            try:
                is_dir = e.is_dir(follow_symlinks=False)
                if dirs_only and not is_dir:
                    continue
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            out[e.path] = (st.st_mtime_ns, 0 if is_dir else st.st_size)
            if is_dir:
                stack.append(e.path)
    return out


def _lines(argv: list[str]) -> list[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30).stdout.splitlines()
    except (OSError, subprocess.SubprocessError):
        return []


def network_namespaces() -> set[str]:
    names = {line.split()[0] for line in _lines(["ip", "netns", "list"]) if line.strip()}
    with contextlib.suppress(OSError):
        names |= set(os.listdir("/run/netns"))
    return names


def interfaces() -> set[str]:
    """`ip -o link` names ("3: st1a2b3br: <...>", "7: st1a2b3v0@if2: <...>"): the part before any @."""
    return {line.split(":", 2)[1].strip().split("@")[0] for line in _lines(["ip", "-o", "link"]) if ":" in line}


def mounts() -> set[tuple[str, str, str]]:
    """(mount point, file system type, source) of each of this machine's mounts (proc(5), /proc/PID/mountinfo)."""
    out = set()
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return out
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 2:
            out.add((fields[4].replace("\\040", " "), tail[0], tail[1]))
    return out


def _ticks_now() -> int:
    """The time since boot in clock ticks, the unit of /proc/PID/stat's start time."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


@dataclass
class Proc:
    pid: int
    ppid: int
    sid: int
    state: str
    start: int
    cmdline: str


def processes() -> dict[int, Proc]:
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        rest = stat[stat.rindex(")") + 2:].split()   # after "PID (comm) ": state ppid pgrp session ... starttime
        out[int(entry)] = Proc(int(entry), int(rest[1]), int(rest[3]), rest[0], int(rest[19]), cmdline.strip())
    return out


@dataclass
class Snapshot:
    files: dict[str, tuple[int, int]]
    netns: set[str]
    links: set[str]
    mounts: set[tuple[str, str, str]]
    started: int                       # clock ticks since boot when it was taken
    watched: tuple[str, ...] = field(default=())


def watched() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories walked file by file, directories walked by their directories)."""
    if os.environ.get(WATCH_ENV):
        return tuple(p for p in os.environ[WATCH_ENV].split(":") if p), ()
    return FILES_WATCHED, DIRS_WATCHED


def snapshot() -> Snapshot:
    full, dirs = watched()
    files: dict[str, tuple[int, int]] = {}
    for d in full:
        files |= walk(d, dirs_only=False)
    for d in dirs:
        files |= walk(d, dirs_only=True)
    return Snapshot(files, network_namespaces(), interfaces(), mounts(), _ticks_now(), (*full, *dirs))


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def marked(pid: int, mark: str) -> bool:
    """Whether process ``pid`` was started with ``RUN_MARK=mark`` in its environment (proc(5), /proc/PID/environ:
    the environment it was started with)."""
    try:
        return f"{RUN_MARK}={mark}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def own_processes(before: Snapshot, me: int, run_dirs: list[str], mark: str | None = None) -> list[Proc]:
    """The processes of this run still running: see the module's notes."""
    procs = processes()
    ancestors, p = set(), me
    while p in procs and p not in ancestors:
        ancestors.add(p)
        p = procs[p].ppid
    cache = str(rehearsal_cache())
    found = []
    for proc in procs.values():
        if proc.pid in ancestors or proc.state in ("Z", "X") or not proc.cmdline:
            continue
        chain, p, seen = False, proc.ppid, set()
        while p in procs and p not in seen:
            if p == me:
                chain = True
                break
            seen.add(p)
            p = procs[p].ppid
        late = proc.start > before.started
        if (chain or (mark is not None and marked(proc.pid, mark)) or any(d in proc.cmdline for d in run_dirs)
                or (late and cache in proc.cmdline)):
            found.append(proc)
    return found


# A rehearsal cluster's names (launcher/plans/rehearsal.network): namespaces st-TAG-NODE, interfaces stTAGbr, stTAGvN,
# TAG the first 5 hex digits of the sha256 of its state directory. Another run's cluster on this machine has the same
# shape; one of this run's has the tag of a state directory below the run's temporary directories.
_REHEARSAL_NAME = re.compile(r"^st-?([0-9a-f]{5})(?:-|br$|v)")


def cluster_tags(run_dirs: list[str]) -> set[str]:
    """The tags of this run's rehearsal clusters: of every clusters/NAME below the run's temporary directories (down
    to tests' own tmp_path/home), and of clusters/local where a cluster's directory is already gone."""
    keys: set[str] = set()
    for run in map(Path, run_dirs):
        for depth in range(0, 4):
            pattern = "/".join(["*"] * depth)
            for d in (run.glob(pattern) if pattern else [run]):
                if d.is_dir():
                    keys |= {str(d / "clusters" / "local"), str(d / "home" / "clusters" / "local")}
                    keys |= {str(c) for c in d.glob("clusters/*")} | {str(c) for c in d.glob("home/clusters/*")}
    return {hashlib.sha256(k.encode()).hexdigest()[:5] for k in keys}


def _ours(name: str, tags: set[str]) -> bool:
    """A namespace or interface of this run: any not named as a rehearsal cluster's, and those of its clusters."""
    m = _REHEARSAL_NAME.match(name)
    return m is None or m[1] in tags


def differences(before: Snapshot, after: Snapshot, leftover: list[Proc], run_dirs: list[str]) -> list[str]:
    """One line per thing the run changed or left behind."""
    added = sorted(after.files.keys() - before.files.keys())
    removed = sorted(before.files.keys() - after.files.keys())
    out = [f"added {p}" for p in added] + [f"removed {p}" for p in removed]
    explained = {os.path.dirname(p) for p in (*added, *removed)}   # a directory's mtime moves with what it holds
    for path in sorted(before.files.keys() & after.files.keys()):
        if before.files[path] != after.files[path] and path not in explained:
            out.append(f"modified {path}")
    tags = cluster_tags(run_dirs)
    out += [f"network namespace left: {n}" for n in sorted(after.netns - before.netns) if _ours(n, tags)]
    out += [f"network interface left: {n}" for n in sorted(after.links - before.links) if _ours(n, tags)]
    # Not the rehearsal root's cache: another run building it meanwhile mounts /proc, /sys and more below it.
    ours = [*run_dirs, *after.watched]
    for point, kind, source in sorted(after.mounts - before.mounts):
        if _under(point, ours) or _under(source, ours):
            out.append(f"mount left: {point} ({kind} from {source})")
    out += [f"process left: {p.pid} {p.cmdline[:200]}" for p in leftover]
    return out


_KEY = pytest.StashKey[Snapshot]()


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")


def _run_dirs(config: pytest.Config) -> list[str]:
    factory = getattr(config, "_tmp_path_factory", None)
    return [str(factory.getbasetemp())] if factory is not None else []


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if _controller(session.config):
        session.config.stash[_KEY] = snapshot()
        # Before pytest-xdist starts its workers (its sessionstart is trylast), so they and all they start inherit it.
        os.environ[RUN_MARK] = f"{os.getpid()}-{time.time_ns()}"


@pytest.hookimpl(wrapper=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus):
    # After every other implementation: pytest-xdist's (trylast) stops the workers, which must not count as left.
    result = yield
    config = session.config
    before = config.stash.get(_KEY, None)
    if before is None or not _controller(config):
        return result
    run_dirs = _run_dirs(config)
    deadline = time.monotonic() + EXIT_GRACE_S
    mark = os.environ.get(RUN_MARK)
    while (leftover := own_processes(before, os.getpid(), run_dirs, mark)) and time.monotonic() < deadline:
        time.sleep(0.2)
    changes = differences(before, snapshot(), leftover, run_dirs)
    if changes:
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        text = "\n".join([f"error: the test session changed this machine or left things behind ({len(changes)}):",
                          *(f"  {line}" for line in changes)])
        if reporter is not None:
            reporter.write_line("")  # after the progress line
            reporter.write_line(text, red=True)
        else:
            print(text, flush=True)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
    return result
