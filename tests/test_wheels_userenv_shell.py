"""`launch run --requirements` run after run, with no cluster: the node is this machine (remote.check runs the
launcher's command lines in bash here, remote.put_bytes writes the file here, as SFTP does: a temporary name, then a
rename) and the shared storage is a tmp dir. What a user notices: a wheel already on the shared storage is not sent
again, an environment already made is said to be made and is not made again, and a rank that takes the set's lock
just after another node finished making the environment uses it instead of making it again (which would delete it
under the ranks already importing from it). Wheels come from a wheelhouse the test builds, never the network."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
from pathlib import Path

import pytest
from wheelhouse import PURE_SETUP, build

from launcher.cluster import Cluster, Node
from launcher.execute import remote, userenv, wheels
from launcher.plans import requirements as reqs

NODE_PY = reqs.node_python("debian bookworm", torch="2.13.0", horovod="0.28.1")
NODE = Node(name="node0", address="127.0.0.1", role="worker", slots=1, cpus=2, workdir="/work/node0")
CLUSTER = Cluster(name="here", backend="local", nodes=[NODE], user="root", ssh_config="/c/ssh_config",
                  known_hosts="/c/known_hosts", python="/venv/bin/python", mpirun="/usr/bin/mpirun")


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    """Two pure-Python wheels (pip wheel, offline): tinypure-1.0 and tinytwo-1.0."""
    root = tmp_path_factory.mktemp("wheels")
    out = root / "wheels"
    build(root, "tinypure", {"setup.py": PURE_SETUP, "tinypure.py": "VALUE = 42\n"}, out)
    build(root, "tinytwo", {"setup.py": PURE_SETUP.replace("tinypure", "tinytwo"), "tinytwo.py": "VALUE = 2\n"},
          out)
    return out


def chosen(folder: Path, *names: str) -> list[reqs.Wheel]:
    found = []
    for p in sorted(folder.glob("*.whl")):
        if p.name.split("-")[0] in names:
            data = p.read_bytes()
            found.append(reqs.Wheel(p.name, hashlib.sha256(data).hexdigest(), len(data)))
    assert len(found) == len(names)
    return found


@pytest.fixture
def here(monkeypatch):
    """The node is this machine; every file put on it, by path."""
    put: list[str] = []

    def check(c, node, command, *, timeout_s=None):
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
        return proc.returncode, proc.stdout

    def put_bytes(c, node, data, path, mode=0o600):
        put.append(path)
        tmp = Path(f"{path}.part")
        tmp.write_bytes(data)
        tmp.chmod(mode)
        tmp.rename(path)

    monkeypatch.setattr(remote, "check", check)
    monkeypatch.setattr(remote, "put_bytes", put_bytes)
    return put


@pytest.fixture
def builds(monkeypatch):
    """The environments this process made (userenv._make, the real one, counted)."""
    made: list[Path] = []
    real = userenv._make

    def counted(env: Path, doc: dict) -> None:
        made.append(env)
        real(env, doc)

    monkeypatch.setattr(userenv, "_make", counted)
    return made


def stored(shared: Path, ws: list[reqs.Wheel]) -> dict[str, tuple[int, int]]:
    """Each wheel on the shared storage: (inode, mtime_ns), to see it is the same file, untouched."""
    out = {}
    for w in ws:
        st = os.stat(w.path(str(shared)))
        out[w.filename] = (st.st_ino, st.st_mtime_ns)
    return out


@pytest.mark.parametrize("root", ["fsx", "my fsx"])   # a space in the shared root: still one path a line
def test_a_wheel_already_on_the_shared_storage_is_not_sent_again(tmp_path, wheelhouse, here, root):
    shared = tmp_path / root
    shared.mkdir()
    one = chosen(wheelhouse, "tinypure")
    first = wheels.push(CLUSTER, NODE, str(shared), one, wheelhouse, NODE_PY)
    assert (first.wheels, first.sent, first.sent_bytes) == (1, 1, one[0].size)
    landed = Path(one[0].path(str(shared)))
    assert landed.read_bytes() == (wheelhouse / one[0].filename).read_bytes()
    before = stored(shared, one)

    here.clear()
    again = wheels.push(CLUSTER, NODE, str(shared), one, wheelhouse, NODE_PY)
    assert (again.wheels, again.sent, again.sent_bytes) == (1, 0, 0)
    assert here == [again.document]  # the set's document only: no archive of wheels went to the node
    assert stored(shared, one) == before
    assert again.document == first.document

    # A set with one wheel more: only that one is sent; the one there stays the same file.
    both = chosen(wheelhouse, "tinypure", "tinytwo")
    here.clear()
    grown = wheels.push(CLUSTER, NODE, str(shared), both, wheelhouse, NODE_PY)
    new = next(w for w in both if w.filename.startswith("tinytwo"))
    assert (grown.wheels, grown.sent, grown.sent_bytes) == (2, 1, new.size)
    assert stored(shared, one) == before
    assert Path(new.path(str(shared))).read_bytes() == (wheelhouse / new.filename).read_bytes()
    assert not list((shared / reqs.WHEELS).glob(".incoming-*")), "the archive's leftovers stay on the node"


def test_an_environment_made_once_is_said_ready_and_not_made_again(tmp_path, wheelhouse, here, builds):
    """The user's run, then the job's rank, twice: the second run says the environment was made before (what
    `launch run` prints: "(made before)"), and the second job's rank finds it."""
    shared = tmp_path / "fsx"
    shared.mkdir()
    ws = chosen(wheelhouse, "tinypure")
    first = wheels.push(CLUSTER, NODE, str(shared), ws, wheelhouse, NODE_PY)
    assert first.ready is False
    env, made = userenv.ensure(first.document, say=lambda line: None)
    assert made and builds == [env] and (env / reqs.READY).exists()
    assert Path(first.env) == env
    ran = subprocess.run([str(env / "bin/python"), "-c", "import tinypure; print(tinypure.VALUE)"],
                         capture_output=True, text=True)
    assert ran.stdout.strip() == "42", ran.stderr
    marker = os.stat(env / reqs.READY)

    second = wheels.push(CLUSTER, NODE, str(shared), ws, wheelhouse, NODE_PY)
    assert second.ready is True and second.sent == 0 and second.env == first.env
    said: list[str] = []
    env2, made2 = userenv.ensure(second.document, say=said.append)
    assert (env2, made2) == (env, False) and said == [] and builds == [env]
    assert os.stat(env / reqs.READY).st_ino == marker.st_ino


def test_a_rank_that_takes_the_lock_just_after_another_made_the_environment_uses_it(tmp_path, wheelhouse, monkeypatch,
                                                                                      builds):
    """The race, forced: this rank looks (not ready yet) and, before it takes the set's lock, another node takes the
    lock, makes the environment and lets the lock go. This rank's lock then succeeds; it must look again and find
    the environment ready, not make it again (its _make would first delete what the other ranks import from)."""
    shared = tmp_path / "fsx"
    ws = chosen(wheelhouse, "tinypure")
    doc = reqs.set_document(ws, NODE_PY, str(shared))
    for w in ws:
        Path(w.path(str(shared))).parent.mkdir(parents=True)
        shutil.copy(wheelhouse / w.filename, w.path(str(shared)))
    Path(doc["env"]).parent.mkdir(parents=True)
    document = reqs.set_document_path(doc)
    Path(document).write_text(json.dumps(doc))
    env = Path(doc["env"])
    lock = Path(f"{env}{reqs.LOCK_SUFFIX}")

    real_mkdir = pathlib.Path.mkdir
    other: dict = {}

    def mkdir(self, *args, **kwargs):
        if Path(self) == lock and "started" not in other:
            # Between this rank's look and its lock: the other node's whole ensure, lock taken and let go.
            other["started"] = True
            other["got"] = userenv.ensure(document, say=lambda line: None)
            other["ready_inode"] = os.stat(env / reqs.READY).st_ino
            other["pins_inode"] = os.stat(env / "scaletrain-requirements.txt").st_ino
            other["lock_left"] = lock.exists()
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    said: list[str] = []
    got, made = userenv.ensure(document, say=said.append)
    monkeypatch.undo()

    assert other["got"] == (env, True) and not other["lock_left"], "the other node made it and let the lock go"
    assert (got, made) == (env, False) and said == []
    assert builds == [env], f"made {len(builds)} times"
    assert os.stat(env / reqs.READY).st_ino == other["ready_inode"]
    assert os.stat(env / "scaletrain-requirements.txt").st_ino == other["pins_inode"]
    assert not lock.exists()
    ran = subprocess.run([str(env / "bin/python"), "-c", "import tinypure; print(tinypure.VALUE)"],
                         capture_output=True, text=True)
    assert ran.stdout.strip() == "42", ran.stderr
