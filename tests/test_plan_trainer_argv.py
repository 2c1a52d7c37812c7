"""The plan and the run are the same run: every option the estimate reads reaches the trainer's command line, for
every GPU type of the catalog, and the trainer parses that line into the same settings."""

from __future__ import annotations

import pytest

from infra.catalog import gpu_types
from launcher.cost.inputs import imagenet
from launcher.plans import loading, offline
from training.train import parse_args


@pytest.mark.parametrize("instance", gpu_types(), ids=lambda t: t.name)
@pytest.mark.parametrize(("precision", "fp16_allreduce"), [("amp", False), ("amp", True), ("fp32", True)])
def test_plan_options_reach_the_trainer(instance, precision, fp16_allreduce):
    doc = offline.plan_document(instance, 2, imagenet(90, fp16_allreduce=fp16_allreduce), precision=precision,
                                gpu_throughput=500.0)
    argv = doc["mpirun"]
    cfg = parse_args(argv[argv.index("training.train") + 1:])
    est = doc["estimate"]
    assert cfg.precision == {"amp": "fp16", "fp32": "fp32"}[precision]
    assert cfg.fp16_allreduce is fp16_allreduce
    assert (est["network_bytes_per_node"] / (2 * 1 / 2)) == pytest.approx(25_557_032 * (2 if fp16_allreduce else 4))
    # The loader the model counted is the loader the trainer starts: same workers per rank, one torch thread.
    plan = loading.for_instance(instance)
    assert cfg.workers == est["loader_workers_per_rank"] == plan.workers_per_rank == instance.vcpus // instance.gpus - 1
    assert cfg.threads == plan.threads_per_rank == 1
    assert cfg.batch_per_gpu == est["batch_per_gpu"] and cfg.epochs == 90


def test_p4d_starts_88_decoders_per_node_not_16():
    """The issue's case: 96 vCPUs, 8 GPUs. Two workers per rank (16 per node) decoded less than half what the GPUs
    take; the plan now starts 11 per rank, and the model says compute-bound, not input-bound."""
    p4d = next(t for t in gpu_types() if t.name == "p4d.24xlarge")
    doc = offline.plan_document(p4d, 1, imagenet(90))
    argv = doc["mpirun"]
    assert argv[argv.index("--workers") + 1] == "11" and argv[argv.index("--threads") + 1] == "1"
    assert doc["estimate"]["bound"] == "compute-bound"
    assert doc["estimate"]["loader_images_per_sec"] >= 1.2 * doc["estimate"]["gpu_demand_images_per_sec"]
