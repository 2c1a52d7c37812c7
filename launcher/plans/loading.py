"""How many data-loader processes and torch threads each training rank gets, and what they can decode: one
decision, read by the trainer's command line (launcher.plans.job) and by the cost model's loader ceiling
(launcher.cost.model), so the run and its estimate assume the same input pipeline.

On a GPU node a rank's share of the node is ``vcpus // gpus`` vCPUs (the catalog's: p4d.24xlarge 96 / 8 = 12). One
of them is left to the rank's own process (the training loop, collating and pinning batches, the copy to the GPU,
Horovod's or NCCL's background threads); the rest decode, one loader process each (p4d: 11 per rank, 88 per node).
The rank itself runs one torch CPU thread: its GPU does the arithmetic. PyTorch's DataLoader pins each worker
process to one intra-op thread (torch/utils/data/_utils/worker.py, ``torch.set_num_threads(1)``;
https://pytorch.org/docs/stable/data.html#multi-process-data-loading), so workers + 1 processes fill the share
without oversubscribing it.

What they decode: the per-core rate bench/loader.py measures (RandomResizedCrop + flip at 224 px, one process, one
thread), times the processes, counting SMT: an EC2 vCPU is one hyperthread of a core, two per core on every GPU type
in the catalog (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/cpu-options-supported-instances-values.html).
The first process on a core gets the measured rate; a second on the same core adds ``smt_gain`` of it (Intel: up to
30% more throughput from Hyper-Threading, https://www.intel.com/content/www/us/en/gaming/resources/hyper-threading.html).

Nodes without GPUs (the local rehearsal cluster's CPU ranks) keep the trainer's own defaults: there the rank's
threads do the arithmetic and two loader processes feed them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["CPU_RANK_WORKERS", "THREADS_PER_CORE", "LoaderPlan", "decode_capacity", "for_instance", "for_share",
           "loader_plan"]

CPU_RANK_WORKERS = 2  # training/train.py's default, for ranks that compute on CPUs
THREADS_PER_CORE = 2  # vCPUs per physical core on the catalog's GPU types (SMT on)
RANK_PROCESS_VCPUS = 1  # the rank's own process: loop, collation, pinning, the allreduce's background threads


class LoaderPlan(BaseModel):
    """The input pipeline of one rank on a node."""

    model_config = ConfigDict(frozen=True)

    vcpus_per_rank: int
    workers_per_rank: int
    threads_per_rank: int | None  # torch threads in the rank; None: the trainer's default (CPU ranks)

    def processes_per_node(self, ranks: int) -> int:
        return self.workers_per_rank * ranks


def for_share(vcpus_per_rank: int, *, gpus: bool) -> LoaderPlan:
    """The plan for a rank with ``vcpus_per_rank`` vCPUs of its own; ``gpus``: the rank drives a GPU."""
    if vcpus_per_rank < 1:
        raise ValueError(f"a rank needs at least 1 vCPU, got {vcpus_per_rank}")
    if not gpus:
        return LoaderPlan(vcpus_per_rank=vcpus_per_rank, workers_per_rank=CPU_RANK_WORKERS, threads_per_rank=None)
    return LoaderPlan(vcpus_per_rank=vcpus_per_rank, workers_per_rank=max(1, vcpus_per_rank - RANK_PROCESS_VCPUS),
                      threads_per_rank=1)


def loader_plan(vcpus: int, ranks: int, *, gpus: bool) -> LoaderPlan:
    """A node with ``vcpus`` and ``ranks`` training ranks (its GPUs on AWS)."""
    if ranks < 1:
        raise ValueError(f"a node needs at least 1 rank, got {ranks}")
    return for_share(max(1, vcpus // ranks), gpus=gpus)


def for_instance(instance) -> LoaderPlan:
    """The plan for one GPU rank of a catalog instance type (``infra.catalog.InstanceType``)."""
    return loader_plan(instance.vcpus, instance.gpus, gpus=True)


def decode_capacity(vcpus: int, processes: int, img_per_sec_per_core: float, smt_gain: float) -> float:
    """Images/s ``processes`` loader processes decode on a node of ``vcpus`` vCPUs (``THREADS_PER_CORE`` per core):
    one per core at the full per-core rate, the rest on the cores' second hyperthreads at ``smt_gain`` of it."""
    cores = vcpus // THREADS_PER_CORE
    running = min(processes, vcpus)
    return img_per_sec_per_core * (min(running, cores) + smt_gain * max(0, running - cores))
