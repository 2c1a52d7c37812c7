"""The cluster's MPI is run by its absolute path, and the remote orted through --prefix, never looked up on PATH.

On AWS the image's Open MPI sits in /opt/amazon/openmpi/bin, which only a login shell's PATH holds; the launcher's
SSH commands are non-login shells. Here the local cluster's MPI is moved the same way: its mpirun and orted are
wrappers in a directory on no PATH (each records that it ran, on which node, then runs Debian's). A launcher that
ran a bare `mpirun`, or left the remote orted to PATH, would run Debian's /usr/bin ones and the record stays empty.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clusterutil import TINY, launch, local_cluster_with_shards

pytestmark = pytest.mark.cluster


def wrapper(path: Path, real: str, log: Path) -> None:
    path.write_text(f'#!/bin/sh\necho "{path.name} ${{SCALETRAIN_NODE:-launcher}}" >> {log}\nexec {real} "$@"\n')
    path.chmod(0o755)


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    with local_cluster_with_shards(tmp_path_factory.mktemp("mpipath")) as (root, home):
        prefix = root / "opt" / "openmpi"
        (prefix / "bin").mkdir(parents=True)
        log = root / "ran.log"
        wrapper(prefix / "bin" / "mpirun", "/usr/bin/mpirun", log)
        wrapper(prefix / "bin" / "orted", "/usr/bin/orted", log)
        state = home / "clusters" / "local" / "cluster.json"
        cluster = json.loads(state.read_text())
        assert cluster["mpirun"] == "/usr/bin/mpirun"  # `launch local up` recorded this machine's, absolute
        state.write_text(json.dumps({**cluster, "mpirun": str(prefix / "bin" / "mpirun"), "mpi_prefix": str(prefix)}))
        yield root, home, prefix, log


def ran(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return sorted(lines)


def test_doctor_runs_the_clusters_mpi_on_every_node(moved):
    root, home, prefix, log = moved
    proc = launch(home, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ranks, one on each of node0, node1" in proc.stdout
    # `mpirun --version` on each node, the test across nodes from node0, and an orted started on both through
    # --prefix: every one of them the cluster's MPI.
    assert ran(log) == ["mpirun node0", "mpirun node0", "mpirun node1", "orted node0", "orted node1"]


def test_train_runs_the_clusters_mpi_and_the_remote_orted_through_its_prefix(moved):
    root, home, prefix, log = moved
    proc = launch(home, "train", "--cluster", "local", "--nodes", "2", "--data", str(root / "shards"),
                  "--epochs", "1", "--output", str(root / "run"), *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert f"rank(s): {prefix}/bin/mpirun --prefix {prefix} --allow-run-as-root -np 2" in proc.stdout or \
        f"rank(s): {prefix}/bin/mpirun --prefix {prefix} -np 2" in proc.stdout
    assert ran(log) == ["mpirun node0", "orted node0", "orted node1"]
