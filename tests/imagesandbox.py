"""The sandbox every test that runs an image script (ami/components/*.sh) runs it in: a private mount namespace where
/etc, /usr and /opt are read-only and the system directories a test lets a script write are scratch directories of
its own. The suite runs as root on a build machine, where a component's `echo ... >/etc/apt/sources.list.d/...`
would otherwise land on that machine (issue 37 item 9)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

READ_ONLY = ("/etc", "/usr", "/opt")
MOUNT = shutil.which("mount") or "/bin/mount"
BASH = shutil.which("bash") or "/bin/bash"
# unshare(1)'s ways into a private mount namespace, in order: a user namespace mapping this user to root (works
# unprivileged, where the kernel allows user namespaces), else a mount namespace alone (root, where it does not).
NAMESPACES = (["--user", "--map-root-user", "--mount"], ["--mount"])
_chosen: list[list[str] | str] = []   # once per process: the NAMESPACES entry that works, or why none does


def _namespace() -> list[str]:
    if not _chosen:
        why = "unshare (util-linux) is not installed"
        for flags in NAMESPACES if shutil.which("unshare") else ():
            # access(2) answers EROFS for a read-only mount: nothing is written to find out.
            probe = subprocess.run([shutil.which("unshare") or "unshare", *flags, "--", BASH, "-c",
                                    " && ".join([*(_read_only(d) for d in READ_ONLY),
                                                 *(f"test ! -w {d}" for d in READ_ONLY)])],
                                   capture_output=True, text=True, timeout=30)
            if probe.returncode == 0:
                _chosen.append(flags)
                break
            why = probe.stderr.strip() or f"{' '.join(flags)}: {', '.join(READ_ONLY)} stayed writable"
        else:
            _chosen.append(why)
    if isinstance(_chosen[0], str):
        pytest.skip(f"no private mount namespace with a read-only /etc here ({_chosen[0]}): an image script is never "
                    "run without one")
    return _chosen[0]


def _read_only(d: str) -> str:
    return f"{MOUNT} --bind {d} {d} && {MOUNT} -o remount,bind,ro {d}"


def sandbox(root: Path, scratch: tuple[str, ...] = ()) -> list[str]:
    """The argv prefix that runs a command in a private mount namespace where READ_ONLY are read-only bind mounts of
    themselves and each of ``scratch`` (system directories a script may write) is root/<its name>. Skips the test
    where the machine allows no such namespace."""
    steps = [_read_only(d) for d in READ_ONLY]
    for target in scratch:
        (root / Path(target).name).mkdir(exist_ok=True)
        steps.append(f"{MOUNT} --bind {root / Path(target).name} {target}")
    return [shutil.which("unshare") or "unshare", *_namespace(), "--", BASH, "-c",
            f'{" && ".join(steps)} && exec "$@"', "sandbox"]
