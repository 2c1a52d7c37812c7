"""Files and keys on this machine, for every room: a file written whole or not at all, and an SSH key pair."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """``text`` to ``path``, written aside and renamed: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def keygen(path: Path, comment: str) -> str:
    """An ed25519 key pair at ``path`` (and ``path``.pub), without a passphrase; the public key's line."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    return Path(f"{path}.pub").read_text()
