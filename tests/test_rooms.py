"""The launcher's rooms keep their rule (docs/design.md, "Rooms"): a pure module (the plans, the cost model and its
prices and report, the doctor's checks, the AWS backend's decisions, the Cluster model) imports nothing that reaches a
network, a process or the clock, neither itself nor through the project's own modules it imports; and no module of
launcher/ or training/ grows past 500 lines."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ("launcher", "infra", "ami", "training")

# The pure modules. Every module under launcher/plans/ is one, so a new plan is held to the rule without a line here.
PURE = sorted({
    "launcher", "launcher.errors", "launcher.render",
    "launcher.cluster", "launcher.cluster.aws", "launcher.cluster.aws.access", "launcher.cluster.aws.discover",
    "launcher.cluster.aws.lifecycle", "launcher.cluster.aws.readiness",
    "launcher.cost", "launcher.cost.inputs", "launcher.cost.model", "launcher.cost.prices", "launcher.cost.report",
    "launcher.cost.workloads", "launcher.cost.shape",
    "launcher.cost.runcheck",
    "launcher.doctor", "launcher.doctor.checks", "launcher.doctor.busbw", "launcher.doctor.probes",
    "launcher.doctor.gpuarch",
    "launcher.plans", *(f"launcher.plans.{p.stem}" for p in (ROOT / "launcher" / "plans").glob("*.py")
                        if p.stem != "__init__"),
})

# Modules whose import alone means sockets, processes, threads, signals or the clock; and the clients built on them.
FORBIDDEN_MODULES = {
    "asyncio", "concurrent", "http", "multiprocessing", "pty", "requests", "sched", "select", "selectors", "signal",
    "socket", "socketserver", "ssl", "subprocess", "threading", "time", "urllib",
    "boto3", "botocore", "fabric", "invoke", "paramiko",
}
CLOCK_READS = {"now", "utcnow", "today"}             # datetime.now(), date.today(): the caller passes the time
OS_PROCESS_CALLS = {"system", "popen", "fork", "forkpty", "kill", "killpg"}  # and os.exec*, os.spawn*, os.wait*


def _source_of(module: str) -> tuple[str, bool]:
    """(source text, is a package) of a project module, found without importing it."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin, f"{module} not found"
    return Path(spec.origin).read_text(), spec.submodule_search_locations is not None


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def violations(module: str, source: str) -> tuple[list[str], set[str]]:
    """(what breaks the rule in `source`, the project modules it imports), anywhere in it, function bodies too."""
    found: list[str] = []
    imported: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names
                                     if node.module.split(".")[0] in PROJECT and _is_module(f"{node.module}.{a.name}")]
        for name in names:
            top = name.split(".")[0]
            if top in FORBIDDEN_MODULES:
                found.append(f"{module}:{node.lineno} imports {name}")
            elif top in PROJECT:
                imported.add(name)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            attr, owner = node.func.attr, node.func.value
            if attr in CLOCK_READS:
                found.append(f"{module}:{node.lineno} reads the clock (.{attr}())")
            if isinstance(owner, ast.Name) and owner.id == "os" and (
                    attr in OS_PROCESS_CALLS or attr.startswith(("exec", "spawn", "posix_spawn", "wait"))):
                found.append(f"{module}:{node.lineno} starts or signals a process (os.{attr})")
    return found, imported


def closure_violations(roots: list[str]) -> list[str]:
    """The rule over `roots` and every project module they import, transitively; a launcher module reached from a
    pure one must itself be listed as pure."""
    seen: set[str] = set()
    todo = list(roots)
    found: list[str] = []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module.startswith("launcher") and module not in PURE:
            found.append(f"{module} is not a pure module, and a pure module imports it")
            continue
        source, _ = _source_of(module)
        bad, imported = violations(module, source)
        found += bad
        todo += sorted(imported - seen)
    return found


def test_pure_modules_reach_no_network_process_or_clock():
    assert closure_violations(PURE) == []


@pytest.mark.parametrize(("source", "expected"), [
    ("import time\n", "imports time"),
    ("def f():\n    from subprocess import run\n", "imports subprocess"),
    ("import boto3.session\n", "imports boto3.session"),
    ("from concurrent.futures import ThreadPoolExecutor\n", "imports concurrent.futures"),
    ("import datetime as dt\nstamp = dt.datetime.now(dt.timezone.utc)\n", "reads the clock (.now())"),
    ("import datetime\nday = datetime.date.today()\n", "reads the clock (.today())"),
    ("import os\nos.system('true')\n", "starts or signals a process (os.system)"),
    ("import os\nos.execvp('ssh', ['ssh'])\n", "starts or signals a process (os.execvp)"),
])
def test_the_check_catches_what_it_forbids(source, expected):
    found, _ = violations("launcher.plans.example", source)
    assert [v.split(" ", 1)[1] for v in found] == [expected]


def test_the_check_follows_imports_into_impure_launcher_modules():
    """A pure module that imports the SSH executor breaks the rule through it, even though it imports nothing
    forbidden itself."""
    found, imported = violations("launcher.plans.example", "from launcher.execute import remote\n")
    assert found == [] and "launcher.execute.remote" in imported
    assert closure_violations(["launcher.execute.remote"]) == [
        "launcher.execute.remote is not a pure module, and a pure module imports it"]


def test_importing_every_pure_module_loads_no_aws_ssh_or_torch_client():
    """What the static check cannot see: a third-party import chain. Every pure module, imported in a fresh
    interpreter, must leave boto3, botocore, fabric, paramiko, invoke and torch unloaded."""
    code = ("import importlib, sys\n"
            f"for m in {PURE!r}: importlib.import_module(m)\n"
            "print(' '.join(m for m in ('boto3', 'botocore', 'fabric', 'paramiko', 'invoke', 'torch') "
            "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == ""


@pytest.mark.parametrize("package", ["launcher", "training"])
def test_no_module_is_over_500_lines(package):
    long = {str(p.relative_to(ROOT)): n for p in sorted((ROOT / package).rglob("*.py"))
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}, f"split these along their seams: {long}"


# The launcher's rooms (docs/design.md, "Rooms"): each package of launcher/, and the modules at its top.
def _room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """(module imported, name imported or '', line) of every import of a launcher module in ``path``, function
    bodies too."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names if a.name.startswith("launcher")]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and \
                node.module.startswith("launcher"):
            out += [(node.module, a.name, node.lineno) for a in node.names]
    return out


def _launcher_modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "launcher").rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        found[".".join(parts)] = path
    return found


def room_graph() -> dict[str, set[str]]:
    """Which room imports which (a room's own package model, launcher.cluster's __init__, counts as the room)."""
    graph: dict[str, set[str]] = {}
    for module, path in _launcher_modules().items():
        mine = _room(module)
        for imported, name, _ in _imports(path):
            target = imported if f"{imported}.{name}" not in _launcher_modules() else f"{imported}.{name}"
            theirs = _room(target)
            if theirs != mine:
                graph.setdefault(mine, set()).add(theirs)
    return graph


def test_no_import_circle_between_the_cluster_model_execution_and_the_local_backend():
    """cluster/ (the model and the AWS backend's decisions) <- execute/ (commands on nodes) <- local/ (the local
    backend, which runs commands on its nodes): no way back, so each can be read, tested and replaced alone."""
    graph = room_graph()
    for room in ("launcher.cluster", "launcher.execute", "launcher.local"):
        assert room in graph or room == "launcher.cluster"
    assert "launcher.local" not in graph.get("launcher.cluster", set())
    assert "launcher.execute" not in graph.get("launcher.cluster", set())
    assert "launcher.local" not in graph.get("launcher.execute", set())


def test_no_private_name_is_imported_across_rooms():
    modules = _launcher_modules()
    crossing = [f"{module}:{line} imports {imported}.{name}"
                for module, path in modules.items() for imported, name, line in _imports(path)
                if name.startswith("_") and name != "__version__" and _room(imported) != _room(module)]
    assert crossing == []


# Spelled apart: tests/conftest.py's scheduler puts a module whose text holds the mark in the serial group.
CLUSTER_MARK = ".".join(("mark", "cluster"))


def test_every_module_of_the_cluster_side_shell_has_a_test_that_brings_up_no_cluster():
    """launcher/execute/ carries the decisions out on the cluster; a module of it that only cluster tests reach is
    one whose mutants only a rehearsal cluster can catch, and a probe found 10 of 19 surviving there (issue 45). Each
    is imported by a test module that marks no test cluster (tests/conftest.py's own test of a cluster module)."""
    modules = sorted(p.stem for p in (ROOT / "launcher" / "execute").glob("*.py") if p.stem != "__init__")
    reached: set[str] = set()
    for test in (ROOT / "tests").glob("test_*.py"):
        if CLUSTER_MARK in test.read_text() or test.name == Path(__file__).name:
            continue
        for module, name, _ in _imports(test):
            if module == "launcher.execute":
                reached.add(name)
            elif module.startswith("launcher.execute."):
                reached.add(module.split(".")[2])
        # ... or run as its node runs it: `python -m launcher.execute.X`
        reached |= {node.value.split(".")[2] for node in ast.walk(ast.parse(test.read_text()))
                    if isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and node.value.startswith("launcher.execute.") and node.value.count(".") == 2}
    assert [m for m in modules if m not in reached] == [], "give these a test module that needs no cluster"
