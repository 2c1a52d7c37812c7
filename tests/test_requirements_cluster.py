"""`launch run --requirements` on a real local cluster with Slurm: two rehearsal nodes that cannot reach a package
index (checked here), a torchrun script that imports a pure-Python package and one with compiled code, neither in
the image, both from a wheelhouse this test builds (PIP_NO_INDEX=1: no network on this machine's side either).

One cluster for the module; its runs are Slurm jobs queued one after another."""

from __future__ import annotations

import json
import re

import pytest
from clusterutil import assert_one_line_error, cluster_state, launch, needs_root, on_host, up
from wheelhouse import tiny_wheels

from launcher.plans import requirements as reqs

pytestmark = [pytest.mark.cluster, needs_root]

SCRIPT = """import os, socket
import torch, torch.distributed as dist
import tinyext, tinypure
dist.init_process_group("gloo")
t = torch.tensor([float(tinyext.twice(dist.get_rank() + 1))])
dist.all_reduce(t)
print(f"host={socket.gethostname()} rank={dist.get_rank()} pure={tinypure.VALUE} sum={t.item():g} "
      f"from={os.path.dirname(tinyext.__file__).split('/scaletrain/')[-1]}", flush=True)
dist.destroy_process_group()
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    root = tmp_path_factory.mktemp("reqs")
    home = root / "home"
    up(home, "--nodes", "2", "--slurm")
    try:
        yield root, home, tiny_wheels(root)
    finally:
        launch(home, "local", "down")


def wheel_store(home) -> list[str]:
    store = on_host(home, f"/fsx/scaletrain/{reqs.WHEELS}")
    return sorted(p.name for p in store.rglob("*.whl")) if store.exists() else []


def test_the_nodes_cannot_reach_a_package_index(cluster):
    _, home, _ = cluster
    python = cluster_state(home)["python"]
    proc = launch(home, "exec", "--cluster", "local", "--",
                  f"{python} -m pip download --no-cache-dir --retries 0 --timeout 5 -d /tmp/no-index six "
                  "&& echo REACHED || echo UNREACHABLE", timeout=120)
    assert proc.stdout.count("UNREACHABLE") == 2 and "REACHED\n" not in proc.stdout.replace("UNREACHABLE", ""), \
        proc.stdout + proc.stderr


def test_requirements_reach_nodes_without_internet_once(cluster, tmp_path, monkeypatch):
    """The issue's "done when": both nodes import both packages from the job's own environment; a second run sends
    no wheel and makes no environment; another torch is refused before anything is sent."""
    _, home, wheelhouse = cluster
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    work = tmp_path / "proj"
    work.mkdir()
    (work / "script.py").write_text(SCRIPT)
    (work / "requirements.txt").write_text("tinypure==1.0\ntinyext\n")
    args = ("run", "--cluster", "local", "--workdir", str(work), "--requirements", str(work / "requirements.txt"),
            "--find-links", str(wheelhouse), "--", "python", "script.py")
    first = launch(home, *args)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    said = next(ln for ln in first.stdout.splitlines() if ln.startswith("requirements: "))
    assert "2 wheel(s) for CPython 3.11 on manylinux_2_36_x86_64, 2 sent" in said and "(the job makes it)" in said
    env = re.search(r"environment (\S+)", said).group(1)
    assert len(re.findall(rf"^\[rank \d\] made environment {env} \(2 package\(s\)\)", first.stdout, re.M)) == 1, \
        first.stdout
    ranks = sorted(ln for ln in first.stdout.splitlines() if "pure=" in ln)
    assert len(ranks) == 2 and {re.search(r"host=(\w+)", ln).group(1) for ln in ranks} == {"node0", "node1"}, ranks
    for ln in ranks:  # 2*1 + 2*2, from the environment on the shared storage
        assert "pure=42 sum=6 from=envs/" in ln, ranks
    assert wheel_store(home) == ["tinyext-2.0-cp311-cp311-linux_x86_64.whl", "tinypure-1.0-py3-none-any.whl"]

    again = launch(home, *args)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert f"2 wheel(s) for CPython 3.11 on manylinux_2_36_x86_64, 0 sent (0.00 MiB); environment {env} " \
           "(made before)" in again.stdout, again.stdout
    assert "made environment" not in again.stdout and sum("pure=42 sum=6" in ln
                                                           for ln in again.stdout.splitlines()) == 2, again.stdout

    jobs_before = json.loads(launch(home, "jobs", "--cluster", "local", "--json", check=True).stdout)
    (work / "torch.txt").write_text("tinypure==1.0\ntorch==2.0.0\n")
    refused = launch(home, "run", "--cluster", "local", "--workdir", str(work), "--requirements",
                     str(work / "torch.txt"), "--find-links", str(wheelhouse), "--", "python", "script.py")
    assert_one_line_error(refused, "torch==2.0.0 would replace the image's torch 2.13.0")
    assert refused.returncode == 2 and "synced" not in refused.stdout and "requirements:" not in refused.stdout
    assert json.loads(launch(home, "jobs", "--cluster", "local", "--json", check=True).stdout) == jobs_before
    assert wheel_store(home) == ["tinyext-2.0-cp311-cp311-linux_x86_64.whl", "tinypure-1.0-py3-none-any.whl"]
