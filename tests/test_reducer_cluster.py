"""The reducer tier end to end on a real rehearsal cluster: 2 worker nodes and 1 reducer node (each its own machine:
namespaces, root built by the image recipe, only /fsx shared), one MPMD mpirun from `launch train --reducers 1`, against
the same run reduced by DDP's allreduce."""

from __future__ import annotations

import json

import pytest
import torch
from clusterutil import (
    SHARDS,
    assert_one_line_error,
    launch,
    needs_root,
    node_run,
    on_host,
    rehearsal_cluster_with_shards,
)
from clusterutil import TINY as TINY_RUN

pytestmark = [pytest.mark.cluster, needs_root]

TINY = [*TINY_RUN, "--epochs", "1"]
TRAINER = ["--", "--lr-per-256", "0.8", "--log-every", "2", "--steps-per-epoch", "4", "--threads", "1",
           "--dump-rank-params"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    with rehearsal_cluster_with_shards(tmp_path_factory.mktemp("reducer"), "--nodes", "2", "--reducers", "1") as found:
        yield found


def test_reducer_tier_trains_like_the_allreduce(env):
    root, home = env
    runs = {}
    for name, extra in (("ring", ["--engine", "ddp"]), ("tier", ["--reducers", "1"])):
        run = node_run(f"reducer-{name}")
        runs[name] = on_host(home, run)  # the ranks' parameters, on the shared storage
        proc = launch(home, "train", "--nodes", "2", "--data", SHARDS, "--output", run, *TINY, *extra, *TRAINER)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 reducer node(s)" in proc.stdout and "training.reducer --workers 2" in proc.stdout
    assert "training resnet18 on 2 rank(s) (reducer)" in proc.stdout  # the reducer is not a training rank
    summary = json.loads((home / "runs" / "local" / "reducer-tier" / "summary.json").read_text())  # fetched back
    assert summary["engine"] == "reducer" and summary["ranks"] == 2 and summary["train_images"] == 4 * 16
    tier = [torch.load(runs["tier"] / f"params-rank{r}.pt") for r in (0, 1)]
    ring = torch.load(runs["ring"] / "params-rank0.pt")
    # Both workers hold the same parameters, bit for bit: the reducer answered both alike.
    assert all(torch.equal(tier[0][k], tier[1][k]) for k in tier[0])
    # After 4 steps the parameters match the allreduce run's to fp32 reduction-order tolerance.
    assert tier[0].keys() == ring.keys()
    worst = max(float((tier[0][k] - ring[k]).abs().max()) for k in ring)
    assert all(torch.allclose(tier[0][k], ring[k], rtol=1e-4, atol=1e-5) for k in ring), worst


def test_more_reducers_than_the_cluster_has(env):
    root, home = env
    proc = launch(home, "train", "--data", SHARDS, "--reducers", "2", *TINY)
    assert_one_line_error(proc, "--reducers 2 is more than the 1 reducer node(s)")
