"""A `launch run` job's own environment, on its node: the virtual environment of a resolved requirements set on the
shared storage (launcher/plans/requirements.py names it and says how it is made). The first rank to take the set's
lock makes it, once, for every node and every later run of the same set (a requeued job too); the others wait until
it is ready. The lock is a directory: mkdir is atomic on a local disk, on Lustre and over SFTP (sshfs, the rehearsal
nodes' storage), where flock(2) is not shared between nodes (each node's FUSE mount keeps its own locks)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from launcher.plans import requirements as reqs


class EnvError(Exception):
    """One line: why the job's environment could not be made."""


@contextlib.contextmanager
def _beating(lock: Path) -> Iterator[None]:
    """Touch the lock while its environment is made, so that nobody takes it for one a lost node left."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(reqs.LOCK_BEAT_S):
            with contextlib.suppress(OSError):
                os.utime(lock)

    t = threading.Thread(target=beat, daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join()


def _make(env: Path, doc: dict) -> None:
    shutil.rmtree(env, ignore_errors=True)  # what a lost node left half made
    proc = subprocess.run(reqs.venv_argv(sys.executable, str(env)), capture_output=True, text=True)
    if proc.returncode != 0:
        raise EnvError(f"python -m venv {env} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site = env / "lib" / version / "site-packages"
    image = list(dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]))
    (site / "_scaletrain_image.pth").write_text(reqs.layer_pth(image))
    pins = env / "scaletrain-requirements.txt"
    pins.write_text("".join(f"{p}\n" for p in doc["pins"]))
    proc = subprocess.run(reqs.install_argv(str(env), doc, str(pins)), capture_output=True, text=True,
                          env={**os.environ, "PIP_NO_INDEX": "1", "PYTHONNOUSERSITE": "1"})
    if proc.returncode != 0:
        said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
        raise EnvError(f"installing {len(doc['pins'])} package(s) into {env} failed: {said[-1] if said else '?'}")
    tmp = env / f"{reqs.READY}.{secrets.token_hex(4)}"
    tmp.write_text(doc["hash"] + "\n")
    tmp.rename(env / reqs.READY)


def ensure(document: str, say: Callable[[str], None] = print) -> tuple[Path, bool]:
    """(the set's environment, whether this process made it). Waits, up to WAIT_S, for another node making it."""
    try:
        doc = reqs.read_set(Path(document).read_text())
    except (OSError, ValueError) as e:
        raise EnvError(f"cannot read the requirements set {document}: {e}") from None
    env = Path(doc["env"])
    ready = env / reqs.READY
    lock = Path(f"{env}{reqs.LOCK_SUFFIX}")
    deadline = time.monotonic() + reqs.WAIT_S
    while not ready.exists():
        try:
            lock.mkdir()
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                if time.time() - lock.stat().st_mtime > reqs.LOCK_STALE_S:
                    # Its maker is gone (a lost node): one waiter moves it aside (rename is atomic) and takes over.
                    aside = Path(f"{lock}.stale-{secrets.token_hex(4)}")
                    with contextlib.suppress(OSError):
                        lock.rename(aside)
                        shutil.rmtree(aside, ignore_errors=True)
                    continue
            if time.monotonic() > deadline:
                raise EnvError(f"{env} was not ready within {reqs.WAIT_S} s (another node holds {lock})") from None
            time.sleep(1)
            continue
        try:
            if ready.exists():  # made between our look and our lock
                break
            started = time.monotonic()
            with _beating(lock):
                _make(env, doc)
            say(f"made environment {env} ({len(doc['pins'])} package(s)) in {time.monotonic() - started:.1f} s")
            return env, True
        finally:
            shutil.rmtree(lock, ignore_errors=True)
    return env, False
