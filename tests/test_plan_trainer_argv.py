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
    per_core = instance.vcpus // instance.gpus // 2  # one per physical core of the GPU's share
    assert cfg.workers == est["loader_workers_per_rank"] == plan.workers_per_rank == per_core
    assert cfg.threads == plan.threads_per_rank == 1
    assert cfg.decode == est["decode"]  # and where they decode (plan_document's nodes are of the catalog type)
    assert cfg.batch_per_gpu == est["batch_per_gpu"] and cfg.epochs == 90


def test_p4d_starts_one_decoder_per_core_48_per_node():
    """96 vCPUs, 8 GPUs. Two workers per rank (16 per node) decoded a third of what the GPUs take; all but one vCPU
    (88 per node) took the CPU time the training loops need (measured on an H200: 15 processes on 16 vCPUs ran at
    0.71 of synthetic, 8 at 0.91). One per physical core: 6 per rank, 48 per node. At this machine's per-core rate the
    full-size shards then just feed the GPUs; --resize 256 shards leave room."""
    p4d = next(t for t in gpu_types() if t.name == "p4d.24xlarge")
    doc = offline.plan_document(p4d, 1, imagenet(90))
    argv = doc["mpirun"]
    assert argv[argv.index("--workers") + 1] == "6" and argv[argv.index("--threads") + 1] == "1"
    assert "--decode" not in argv  # A100: no measured GPU decoder, so the CPUs decode
    est = doc["estimate"]
    assert est["decode"] == "cpu" and est["loader_images_per_sec"] >= 0.99 * est["gpu_demand_images_per_sec"]
