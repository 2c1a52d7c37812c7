"""`launch train --max-restarts N` and the cluster's storage: refused on an AWS stack whose storage is BeeGFS (a
replacement instance joins none of the RAM disks the launcher set up; tests/test_aws_slurm_train.py shows it end to
end), kept everywhere else: FSx, no storage, and every local cluster."""

from __future__ import annotations

import pytest

from launcher import cli
from launcher.cli import train as train_cli
from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.execute import run
from launcher.plans import storage

REFUSAL = ("--max-restarts needs storage a replacement node mounts by its own boot (fsx); this cluster's beegfs "
           "lives on the nodes' RAM disks, which a replacement does not join; deploy with -c storage=fsx or run "
           "without --max-restarts")


@pytest.mark.parametrize(("kind", "max_restarts", "problem"), [
    ("beegfs", 1, REFUSAL),
    ("beegfs", 5, REFUSAL),
    ("beegfs", 0, None),
    ("fsx", 3, None),
    ("none", 3, None),
])  # fmt: skip
def test_only_beegfs_refuses_restarts(kind: str, max_restarts: int, problem: str | None) -> None:
    assert storage.restarts_problem(kind, max_restarts) == problem


def test_a_local_cluster_keeps_max_restarts(monkeypatch, tmp_path, capsys) -> None:
    """A local cluster is no stack: nothing is asked of AWS, and the run starts with the option as given."""
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    node = Node(name="node0", address="127.0.0.1", port=2200, role="worker", slots=1, cpus=1, workdir=str(tmp_path))
    local = Cluster(name="local", backend="local", nodes=[node], user="me", ssh_config="/s/ssh_config",
                    known_hosts="/s/known_hosts", python="python")
    monkeypatch.setattr(train_cli, "target", lambda cluster: (local, None))
    started = []

    def reached(c, chosen, spec, **kw):
        started.append(c.name)
        raise LaunchError("the run started")

    monkeypatch.setattr(run, "train", reached)
    assert cli.main(["train", "--epochs", "1", "--max-restarts", "2", "--data", str(tmp_path)]) == 1
    assert started == ["local"]
    err = capsys.readouterr().err
    assert err == "error: the run started\n" and "--max-restarts needs" not in err
