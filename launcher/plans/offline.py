"""`launch plan` from a spec alone: the plan for a cluster shape that does not exist yet, and its estimate.

The hostfile and mpirun line come from launcher.plans.job's pure functions over a hypothetical :class:`Cluster` of
that shape (slots = the catalog's GPUs, nodes named node0..N-1 and reducer0..K-1 as placeholders for the addresses
discovery will find); the EFA devices and environment from launcher.plans.efa; the learning-rate schedule from
training.schedule (pure, no torch); the estimate from launcher.cost.model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ami import paths
from infra.catalog import InstanceType, get
from infra.layout import efa_device_count, interfaces
from launcher.cluster import Cluster, Node
from launcher.cost.inputs import DEFAULT_CONSTANTS, GpuThroughput, ModelConstants, Precision, Workload
from launcher.cost.model import Estimate, estimate, steps_per_epoch  # steps_per_epoch: this module's API too
from launcher.cost.prices import PriceQuote
from launcher.plans import efa, job
from training.schedule import default_warmup_epochs, peak_lr, schedule_by_epoch, warmup_problem

__all__ = ["PLACEHOLDERS", "TRAINER_PRECISION", "hypothetical_cluster", "plan_document", "steps_per_epoch"]

# The model's precision -> the trainer's --precision: mixed precision is the trainer's fp16 autocast + loss scaling.
TRAINER_PRECISION = {"amp": "fp16", "fp32": "fp32"}

# What an offline plan cannot know yet; discovery of a deployed stack replaces these.
PLACEHOLDERS = {
    "user": "ubuntu",
    "python": paths.PYTHON,
    "ssh_config": "/home/ubuntu/.scaletrain/clusters/plan/ssh_config",
    "known_hosts": "/home/ubuntu/.scaletrain/clusters/plan/known_hosts",
    "data": "/shared/imagenet/shards",
    "output": "/shared/runs/plan",
}


def hypothetical_cluster(instance: InstanceType, nodes: int, *, tier: InstanceType | None = None,
                         tier_nodes: int = 0) -> Cluster:
    """An AWS cluster of this shape, as the stack's defaults build it: workers with one slot per GPU (on EFA where
    the type has it), then the CPU tier's nodes (no slots; on TCP, the transport the stack gives reducers beside
    workers whose EFA traffic cannot reach another family, and the one the reducer engine uses anyway)."""
    efa_count = efa_device_count(interfaces(instance, efa=True)) if instance.has_efa else 0
    workers = [Node(name=f"node{i}", address=f"node{i}", role="worker", slots=instance.gpus, cpus=instance.vcpus,
                    gpus=instance.gpus, workdir="/home/ubuntu/scaletrain", transport="efa" if efa_count else "tcp",
                    efa_devices=efa_count) for i in range(nodes)]
    reducers = [Node(name=f"reducer{i}", address=f"reducer{i}", role="reducer", slots=0, cpus=tier.vcpus,
                     workdir="/home/ubuntu/scaletrain") for i in range(tier_nodes if tier is not None else 0)]
    return Cluster(name="plan", backend="aws", nodes=workers + reducers, user=PLACEHOLDERS["user"],
                   ssh_config=PLACEHOLDERS["ssh_config"], known_hosts=PLACEHOLDERS["known_hosts"],
                   python=PLACEHOLDERS["python"], mpirun=paths.MPIRUN, mpi_prefix=paths.MPI_PREFIX,
                   instance_type=instance.name)


def plan_document(
    instance: InstanceType,
    nodes: int,
    workload: Workload,
    *,
    strategy: str = "horovod",
    tier: InstanceType | None = None,
    tier_nodes: int | None = None,
    batch_per_gpu: int | None = None,
    warmup_epochs: float | None = None,
    gpu_throughput: float | None = None,
    precision: Precision = "amp",
    measured: Mapping[str, GpuThroughput] | None = None,
    price: PriceQuote | None = None,
    tier_price: PriceQuote | None = None,
    versions: efa.SoftwareVersions | None = None,
    constants: ModelConstants = DEFAULT_CONSTANTS,
    resized_shards: bool = False,
) -> dict[str, Any]:
    """Everything `launch plan --json` prints, as one JSON-ready object. ``resized_shards``: the shards were
    converted with ``--resize`` (the loader decodes faster; launcher.cost.model's loader ceiling). ``warmup_epochs``
    None: the trainer's own default for the run's length (training.schedule.default_warmup_epochs), written into
    the mpirun line so the plan shows what the ranks will do."""
    est: Estimate = estimate(instance, nodes, workload, strategy=strategy, tier=tier, tier_nodes=tier_nodes,
                             gpu_throughput=gpu_throughput, precision=precision, measured=measured,
                             batch_per_gpu=batch_per_gpu, price=price, tier_price=tier_price, constants=constants,
                             resized_shards=resized_shards)
    if warmup_epochs is None:
        warmup_epochs = default_warmup_epochs(workload.epochs)
    if problem := warmup_problem(warmup_epochs, workload.epochs):
        raise ValueError(problem)
    batch_per_gpu = est.batch_per_gpu  # None given: the published figure's (ResNet-50: 256)
    tier_instance = get(est.tier_type) if est.tier_type else None
    cluster = hypothetical_cluster(instance, nodes, tier=tier_instance, tier_nodes=est.tier_nodes)
    workers = cluster.workers
    tiered = est.strategy == "reducers" and bool(cluster.reducers)
    # Every option the estimate read reaches the trainer: precision, fp16 gradients, and the loader's workers and
    # threads (job.sized, from the same launcher.plans.loading the model's loader ceiling uses).
    spec = job.TrainSpec(data=PLACEHOLDERS["data"], output=PLACEHOLDERS["output"], epochs=workload.epochs,
                         batch_per_gpu=batch_per_gpu, warmup_epochs=warmup_epochs,
                         precision=TRAINER_PRECISION[precision], fp16_allreduce=workload.grad_bytes_per_param == 2,
                         engine="reducer" if tiered else "horovod", reducers=len(cluster.reducers) if tiered else 0)
    # The software of the image ami/ builds (ami/versions.json), unless the caller knows the image's.
    versions = versions or _image_versions()
    fabric = efa.fabric_env(instance, versions)
    # With the tier: one MPMD mpirun, the trainer on the workers, training.reducer on the reducer nodes.
    argv = job.launch_argv(cluster, workers, cluster.reducers if tiered else [], spec, f"{spec.output}/hostfile",
                           fabric_env=fabric, mca=efa.mpi_mca(instance, mpi_interface=cluster.mpi_interface))
    ranks = sum(n.slots for n in workers)
    global_batch = ranks * batch_per_gpu * est.accumulation_steps
    steps = steps_per_epoch(workload.images_per_epoch, ranks, batch_per_gpu * est.accumulation_steps)
    schedule = schedule_by_epoch(steps, workload.epochs, peak_lr(global_batch), warmup_epochs)
    return {
        "shape": {"instance_type": instance.name, "nodes": nodes, "gpus_per_node": instance.gpus, "ranks": ranks,
                  "strategy": est.strategy, "reducer_type": est.tier_type, "reducers": est.tier_nodes,
                  "market": est.market, "efa": instance.has_efa},
        "hostfile": job.mpmd_hostfile(workers, cluster.reducers) if tiered else job.hostfile(workers),
        "mpirun": argv,
        "env": {**job.rank_env(cluster, workers), **fabric},
        "efa_devices": efa.efa_devices(instance, [n.name for n in workers]),
        "reducer_nodes": [n.name for n in cluster.reducers],
        "global_batch": global_batch,
        "steps_per_epoch": steps,
        "warmup_epochs": warmup_epochs,
        "lr_schedule": [[epoch, lr] for epoch, lr in schedule],
        "estimate": est.model_dump(mode="json"),
        "placeholders": dict(PLACEHOLDERS),
        "software": versions.model_dump(),
        "notes": _notes(est) + ([f"EFA settings for aws-ofi-nccl {versions.aws_ofi_nccl}, libfabric "
                                 f"{versions.libfabric} (the image ami/ builds, unless told otherwise); "
                                 "`launch train` uses the deployed image's"] if instance.has_efa else []),
    }


def _image_versions() -> efa.SoftwareVersions:
    from ami.render import load_versions  # ami.render imports launcher.plans.efa: imported here, not at the top

    pinned = load_versions()
    return efa.SoftwareVersions(aws_ofi_nccl=pinned.aws_ofi_nccl, libfabric=pinned.libfabric)


def _notes(est: Estimate) -> list[str]:
    notes = ["node names and paths are placeholders until the stack is deployed and discovered"]
    if est.workload != "resnet50":
        notes.append(f"the estimate is {est.workload}'s; the hostfile, mpirun line and LR schedule are the project's "
                     f"ResNet-50 trainer's: train {est.workload} with your own script (`launch run`)")
    if est.strategy == "reducers":
        notes.append("the reducer engine (training/reducer.py) moves gradients over gloo on TCP, not NCCL over "
                     "EFA: on GPU nodes it stages buckets through host memory")
    elif est.strategy == "ps":
        notes.append("parameter servers are modelled for comparison (seed 003); the trainer has no "
                     "parameter-server engine")
    return notes

