"""The input pipeline is sized to the node: on every GPU type of the catalog the loader processes the trainer starts
(launcher.plans.loading) decode at least 1.2x what the node's GPUs take, at the per-core rate bench/loader.py measured;
the table in docs/benchmarks.md is the one the model gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.catalog import get, gpu_types
from launcher.cost.inputs import imagenet
from launcher.cost.model import estimate
from launcher.cost.validation import loader_rows, render_loader
from launcher.plans import loading

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"


@pytest.mark.parametrize("row", loader_rows(), ids=lambda r: r[0])
def test_loader_capacity_is_at_least_1_2x_the_gpu_demand(row):
    name, _, _, full, resized, demand, _ = row
    assert full >= 1.2 * demand and resized > full, name


def test_two_workers_per_gpu_left_a_p4d_input_bound_at_a_third_of_its_gpus():
    """The issue's case: 16 decode processes for ~17k img/s of GPU demand."""
    rows = {r[0]: r for r in loader_rows()}
    _, _, _, _, _, demand, old = rows["p4d.24xlarge"]
    assert old < 0.5 * demand


def test_the_estimate_and_the_plan_read_the_same_sizing():
    for t in gpu_types():
        plan = loading.for_instance(t)
        assert estimate(t, 1, imagenet(1)).loader_workers_per_rank == plan.workers_per_rank
        assert plan.processes_per_node(t.gpus) + t.gpus <= t.vcpus  # workers + the ranks fit the vCPUs


def test_sizing_rules():
    assert loading.for_share(12, gpus=True).model_dump() == {"vcpus_per_rank": 12, "workers_per_rank": 11,
                                                             "threads_per_rank": 1}
    assert loading.for_share(1, gpus=True).workers_per_rank == 1
    assert loading.for_share(4, gpus=False).model_dump() == {"vcpus_per_rank": 4, "workers_per_rank": 2,
                                                             "threads_per_rank": None}
    # 88 processes on 48 cores: 48 at the full rate, 40 on second hyperthreads at a quarter.
    assert loading.decode_capacity(96, 88, 100.0, 0.25) == pytest.approx(100 * (48 + 10))
    assert loading.decode_capacity(96, 200, 100.0, 0.25) == loading.decode_capacity(96, 96, 100.0, 0.25)
    with pytest.raises(ValueError, match="at least 1 vCPU"):
        loading.for_share(0, gpus=True)


def test_resized_shards_lift_an_input_bound_shape():
    fast = estimate(get("p4d.24xlarge"), 1, imagenet(90), gpu_throughput=5000)
    assert fast.bound == "input-bound" and "--resize 256" in fast.advice
    resized = estimate(get("p4d.24xlarge"), 1, imagenet(90), gpu_throughput=5000, resized_shards=True)
    assert resized.images_per_sec > fast.images_per_sec and "--resize" not in resized.advice


def test_benchmarks_page_has_the_current_table():
    assert render_loader() in DOC.read_text(), "update docs/benchmarks.md with `.venv/bin/python -m " \
                                               "launcher.cost.validation --loader`"


def test_each_shape_says_what_bounds_it_and_what_would_change_it():
    seed000 = estimate(get("p3.16xlarge"), 8, imagenet(90))
    assert seed000.bound == "network-bound"
    assert "worker network (TCP)" in seed000.advice and "an EFA type" in seed000.advice
    assert "--fp16-allreduce" in seed000.advice
    assert "--fp16-allreduce" not in estimate(get("p3.16xlarge"), 8, imagenet(90, fp16_allreduce=True)).advice
    assert estimate(get("p4d.24xlarge"), 8, imagenet(90)).bound == "compute-bound"
    assert estimate(get("p3.16xlarge"), 1, imagenet(90)).bound == "compute-bound"  # one node: nothing to wait on
    tier = estimate(get("p3.16xlarge"), 8, imagenet(90), strategy="ps", tier_nodes=1)
    assert tier.bound == "network-bound" and "more reducer or server nodes" in tier.advice
