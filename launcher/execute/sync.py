"""Copy a working directory to the cluster's shared storage, sending only what changed since the last copy (the
decisions are launcher/plans/userjob.sync_plan's; this module lists, packs and unpacks). One tar archive over SFTP,
unpacked on the node into the copy; the copy's manifest is written last, so an interrupted sync is redone, never
trusted."""

from __future__ import annotations

import io
import json
import os
import shlex
import socket
import tarfile
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.execute import remote
from launcher.plans import userjob


@dataclass(frozen=True)
class Synced:
    path: str                                # the copy on the shared storage
    plan: userjob.SyncPlan


def scan(root: Path) -> dict[str, tuple[int, int]]:
    """The working directory's files (relative POSIX path -> size, mtime ns), without what is ignored. Symbolic
    links are followed when they point at a file inside or outside; a dangling one is left out."""
    text = (root / userjob.IGNORE_FILE).read_text(errors="replace") if (root / userjob.IGNORE_FILE).is_file() else None
    patterns = userjob.ignore_patterns(text)
    found: dict[str, tuple[int, int]] = {}
    for folder, dirs, files in os.walk(root, followlinks=False):
        rel_dir = Path(folder).relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirs[:] = sorted(d for d in dirs if not userjob.ignored(rel_dir + d, patterns))
        for name in files:
            rel = rel_dir + name
            if userjob.ignored(rel, patterns):
                continue
            try:
                st = (Path(folder) / name).stat()
            except OSError:
                continue
            found[rel] = (st.st_size, st.st_mtime_ns)
    return found


def pack(root: Path, paths: tuple[str, ...]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for rel in paths:
            tar.add(root / rel, arcname=rel, recursive=False)
    return buf.getvalue()


def push(c: Cluster, node: Node, root: Path, shared_root: str) -> Synced:
    """``root`` to ``shared_root``/work/NAME on the storage ``node`` mounts; only new and changed files travel."""
    root = root.expanduser().resolve()
    if not root.is_dir():
        raise LaunchError(f"--workdir {root} is not a directory")
    local = scan(root)
    total = sum(size for size, _ in local.values())
    if total > userjob.MAX_SYNC_BYTES:
        raise LaunchError(f"--workdir {root} holds {total / 2**30:.1f} GiB (more than "
                          f"{userjob.MAX_SYNC_BYTES / 2**30:.0f} GiB): put data on the shared storage or S3 and leave "
                          f"it out with {userjob.IGNORE_FILE} (one pattern per line)")
    dest = f"{shared_root}/work/{userjob.workdir_name(str(root), socket.gethostname())}"
    q = shlex.quote(dest)
    code, text = remote.check(c, node, f"mkdir -p {q} && cat {q}/{userjob.MANIFEST} 2>/dev/null; true")
    try:
        had = {k: tuple(v) for k, v in json.loads(text).items()} if text.strip() else {}
    except ValueError:
        had = {}
    plan = userjob.sync_plan(local, had)
    steps = []
    if plan.send:
        remote.put_bytes(c, node, pack(root, plan.send), f"{dest}/.sync.tar.gz")
        steps.append(f"tar -xzf {q}/.sync.tar.gz -C {q} --no-same-owner && rm -f {q}/.sync.tar.gz")
    if plan.delete:
        steps.append(f"cd {q} && rm -f -- " + " ".join(shlex.quote(p) for p in plan.delete))
    for step in steps:
        code, text = remote.check(c, node, f"{step} 2>&1")
        if code != 0:
            raise LaunchError(f"copying {root} to {node.name}:{dest} failed: {text.strip().splitlines()[-1:]}")
    if plan.send or plan.delete or not had:
        remote.put_text(c, node, json.dumps(local), f"{dest}/{userjob.MANIFEST}", mode=0o644)
    return Synced(dest, plan)
