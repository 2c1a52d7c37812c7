"""Plans over nodes of different sizes: every per-rank figure comes from the smallest node, so no rank on it is
oversubscribed (OMP_NUM_THREADS, the trainer's loader processes, the reducers' threads). Pure, no servers."""

from __future__ import annotations

import pytest

from launcher.cluster import Cluster, Node
from launcher.plans import job as plan
from launcher.plans import loading

SPEC = plan.TrainSpec(data="/data/shards", output="/runs/r1", model="resnet18", image_size=32, epochs=3,
                      batch_per_gpu=32, warmup_epochs=1)


def node(name: str, cpus: int, slots: int, role: str = "worker", gpus: int = 0) -> Node:
    return Node(name=name, address=f"10.0.0.{len(name)}", role=role, slots=slots, cpus=cpus, gpus=gpus,
                workdir=f"/work/{name}")


def cluster(nodes: list[Node]) -> Cluster:
    return Cluster(name="mixed", backend="local", nodes=nodes, user="ubuntu", ssh_config="/c/ssh_config",
                   known_hosts="/c/known_hosts", python="/venv/bin/python", mpirun="/usr/bin/mpirun")


def forwarded(argv: list[str], key: str) -> list[str]:
    """The values of every ``-x KEY=VALUE`` in an mpirun line."""
    return [a.split("=", 1)[1] for i, a in enumerate(argv) if argv[i - 1] == "-x" and a.startswith(f"{key}=")]


# A big node (32 cores over 4 ranks: 8 each) and a small one (12 over 4: 3 each), in either order.
@pytest.mark.parametrize("order", [(0, 1), (1, 0)])
def test_omp_threads_come_from_the_smallest_nodes_share(order):
    nodes = [[node("big", cpus=32, slots=4), node("small", cpus=12, slots=4)][i] for i in order]
    c = cluster(nodes)
    assert plan.rank_env(c, nodes)["OMP_NUM_THREADS"] == "3"
    assert forwarded(plan.mpirun_argv(c, nodes, SPEC, "/h"), "OMP_NUM_THREADS") == ["3"]


def test_three_sizes_the_middle_one_first():
    nodes = [node("mid", cpus=16, slots=2), node("big", cpus=96, slots=2), node("tiny", cpus=4, slots=2)]
    assert plan.rank_env(cluster(nodes), nodes)["OMP_NUM_THREADS"] == "2"


def test_gpu_ranks_loader_processes_come_from_the_smallest_nodes_share():
    nodes = [node("big", cpus=96, slots=8, gpus=8), node("small", cpus=32, slots=8, gpus=8)]
    argv = plan.mpirun_argv(cluster(nodes), nodes, SPEC.model_copy(update={"workers": None}), "/h")
    expected = loading.for_share(4, gpus=True).workers_per_rank
    assert expected != loading.for_share(12, gpus=True).workers_per_rank
    assert argv[argv.index("--workers") + 1] == str(expected)


def test_reducers_threads_come_from_the_smallest_reducer_node():
    workers = [node("w0", cpus=16, slots=1), node("w1", cpus=16, slots=1)]
    reducers = [node("r-big", cpus=72, slots=1, role="reducer"), node("r-small", cpus=8, slots=1, role="reducer")]
    spec = SPEC.model_copy(update={"engine": "reducer", "reducers": 2})
    argv = plan.mpmd_mpirun_argv(cluster(workers + reducers), workers, reducers, spec, "/h")
    worker_part, reducer_part = argv[:argv.index(":")], argv[argv.index(":") + 1:]
    assert forwarded(reducer_part, "OMP_NUM_THREADS") == ["8"]
    assert forwarded(worker_part, "OMP_NUM_THREADS") == ["16"]
