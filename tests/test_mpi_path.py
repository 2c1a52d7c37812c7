"""The cluster's MPI is run by its absolute path, and the remote orted through --prefix, never looked up on PATH.

On AWS the image's Open MPI sits in /opt/amazon/openmpi/bin, which only a login shell's PATH holds; the launcher's
SSH commands are non-login shells. Rehearsal nodes are built the same way (ami/rehearsal/openmpi.sh puts MPI at the
image's prefix and on no PATH), and here each node's mpirun and orted are wrappers that record, on the shared
storage, that they ran and on which node, then run the real ones. A launcher that ran a bare `mpirun`, or left the
remote orted to PATH, finds no MPI on the node at all: the run fails and the record stays empty.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from clusterutil import SHARDS, TINY, launch, needs_root, node_run, on_host, rehearsal_cluster_with_shards

from ami import paths

pytestmark = [pytest.mark.cluster, needs_root]

LOG = "/fsx/scaletrain/mpi-ran.log"


def wrap(program: str) -> str:
    """Shell run on a node: `program` in the image's MPI becomes a wrapper that logs, then runs the real one under
    its own name (mpirun names itself in `--version` by argv[0]; the doctor reads that)."""
    path = f"{paths.MPI_PREFIX}/bin/{program}"
    script = f'#!/bin/bash\necho "{program} $(hostname)" >> {LOG}\nexec -a "$0" REAL "$@"\n'
    # mpirun is a link to orterun: the wrapper runs orterun; orted is a program: it is moved aside.
    return (f'real=$(readlink -f {path}); if [ "$real" = {path} ]; then real={path}.real; mv {path} "$real"; '
            f'else rm {path}; fi; printf %s {shlex.quote(script)} | sed "s|REAL|$real|" > {path} && chmod 755 {path}')


@pytest.fixture(scope="module")
def moved(tmp_path_factory):
    with rehearsal_cluster_with_shards(tmp_path_factory.mktemp("mpipath")) as (root, home):
        # A non-login shell on a node, as the launcher's SSH commands run, finds no MPI on PATH.
        proc = launch(home, "exec", "--", "command -v mpirun orted || echo no-mpi-on-path")
        assert proc.returncode == 0, proc.stderr
        assert sorted(proc.stdout.splitlines()) == ["[node0] no-mpi-on-path", "[node1] no-mpi-on-path"]
        launch(home, "exec", "--", f"{wrap('mpirun')} && {wrap('orted')}", check=True)
        yield root, home, on_host(home, LOG)


def ran(log: Path) -> list[str]:
    lines = log.read_text().splitlines() if log.exists() else []
    log.unlink(missing_ok=True)
    return sorted(lines)


def test_doctor_runs_the_clusters_mpi_on_every_node(moved):
    root, home, log = moved
    proc = launch(home, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 ranks, one on each of node0, node1" in proc.stdout
    # `mpirun --version` on each node, the test across nodes from node0, and the orted it started on node1 through
    # --prefix: every one of them the image's MPI.
    got = ran(log)
    assert got == ["mpirun node0", "mpirun node0", "mpirun node1", "orted node1"], got


def test_train_runs_the_clusters_mpi_and_the_remote_orted_through_its_prefix(moved):
    root, home, log = moved
    proc = launch(home, "train", "--cluster", "local", "--nodes", "2", "--data", SHARDS,
                  "--epochs", "1", "--output", node_run("mpipath"), *TINY)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert f"rank(s): {paths.MPIRUN} --prefix {paths.MPI_PREFIX} --allow-run-as-root -np 2" in proc.stdout
    got = ran(log)
    assert got == ["mpirun node0", "orted node1"], got
