"""`launch run --requirements FILE` on the user's machine: pip downloads the wheels for the nodes' Python and platform
(launcher/plans/requirements.py decides the command and what is refused), and the wheels the shared storage does not
have yet go there, each under its sha256; then the set's document, which the job's ranks read to make or find their
environment (launcher/execute/userenv.py)."""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import shlex
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.execute import remote
from launcher.plans import requirements as reqs


@dataclass(frozen=True)
class Pushed:
    document: str                            # the set's document on the shared storage (ENV.json)
    env: str                                 # the environment the job makes, or finds made
    wheels: int                              # in the set
    sent: int                                # of them sent now
    sent_bytes: int
    ready: bool                              # the environment was already made


def download(node_py: reqs.NodePython, requirements_file: Path, dest: Path,
             find_links: tuple[str, ...] = ()) -> list[reqs.Wheel]:
    """pip download into ``dest`` (the user's pip, its index and configuration); the wheels with their hashes, or a
    one-line LaunchError naming what has no wheel for the nodes."""
    argv = reqs.download_argv(sys.executable, str(requirements_file), str(dest), node_py,
                              tuple(str(Path(f).expanduser().resolve()) for f in find_links))
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    except OSError as e:
        raise LaunchError(f"cannot run pip ({argv[0]} -m pip): {e.strerror or e}") from None
    if proc.returncode != 0:
        raise LaunchError(reqs.pip_failure(proc.stdout + "\n" + proc.stderr, node_py))
    found = []
    for path in sorted(dest.iterdir()):
        if not path.name.endswith(".whl"):  # --only-binary=:all: leaves nothing else, but say it if it did
            raise LaunchError(f"pip download left {path.name}, not a wheel, for the nodes ({node_py.describe()})")
        data = path.read_bytes()
        found.append(reqs.Wheel(path.name, hashlib.sha256(data).hexdigest(), len(data)))
    return found


def push(c: Cluster, node: Node, shared_root: str, wheels: list[reqs.Wheel], folder: Path,
         node_py: reqs.NodePython) -> Pushed:
    """Send what the shared storage lacks of ``wheels`` (files in ``folder``) through ``node``; write the set's
    document. A wheel lands in its hash's folder by a rename, so a half-sent one is never taken for sent."""
    doc = reqs.set_document(wheels, node_py, shared_root)
    store = f"{shared_root}/{reqs.WHEELS}"
    paths = [w.path(shared_root) for w in wheels]
    probe = (f"mkdir -p {shlex.quote(store)} {shlex.quote(str(Path(doc['env']).parent))} && "
             + "".join(f"test -f {shlex.quote(p)} && echo {shlex.quote(p)}; " for p in paths)
             + f"test -f {shlex.quote(doc['env'] + '/' + reqs.READY)} && echo READY; true")
    code, out = remote.check(c, node, probe)
    if code != 0:
        raise LaunchError(f"cannot reach {store} on {node.name} (exit {code})")
    have = set(out.splitlines())   # one path a line: a shared root may hold a space ("my fsx")
    missing = [w for w in wheels if w.path(shared_root) not in have]
    if missing:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:  # wheels are zip files already: no second compression
            for w in missing:
                tar.add(folder / w.filename, arcname=f"{w.sha256}/{w.filename}", recursive=False)
        incoming = f"{store}/.incoming-{secrets.token_hex(4)}"
        q = shlex.quote(incoming)
        remote.put_bytes(c, node, buf.getvalue(), f"{incoming}.tar", mode=0o644)
        step = (f"mkdir -p {q} && tar -xf {q}.tar -C {q} --no-same-owner && "
                f"for d in {q}/*; do [ -e {shlex.quote(store)}/\"$(basename \"$d\")\" ] || "
                f"mv \"$d\" {shlex.quote(store)}/; done; rm -rf {q} {q}.tar")
        code, out = remote.check(c, node, f"{step} 2>&1")
        if code != 0:
            raise LaunchError(f"sending wheels to {node.name}:{store} failed: "
                              f"{(out.strip().splitlines() or ['(no output)'])[-1]}")
    remote.put_bytes(c, node, json.dumps(doc, indent=1).encode(), reqs.set_document_path(doc), mode=0o644)
    return Pushed(reqs.set_document_path(doc), doc["env"], len(wheels), len(missing),
                  sum(w.size for w in missing), "READY" in have)
