"""How many data-loader processes and torch threads each training rank gets, and what they can decode: one
decision, read by the trainer's command line (launcher.plans.job) and by the cost model's loader ceiling
(launcher.cost.model), so the run and its estimate assume the same input pipeline.

On a GPU node a rank's share of the node is ``vcpus // gpus`` vCPUs (the catalog's: p4d.24xlarge 96 / 8 = 12). Its
loader processes get one physical core each, ``share // THREADS_PER_CORE`` (p4d: 6 per rank, 48 per node); the
cores' second hyperthreads are left to the rank's own process (the training loop launching kernels, collating and
pinning batches, the copy to the GPU, Horovod's or NCCL's background threads). Measured on an H200 with 16 vCPUs
(docs/benchmarks.md, "GPU"), ResNet-50 fp16 on --resize 256 shards against 5,438 img/s on synthetic input: 8 loader
processes 4,930 img/s (0.91), 6 processes 4,746, 11 processes 4,674, 15 processes 3,864 (0.71). Past one per core
the loader takes the CPU time the training loop needs and the GPU waits, though the loader alone decodes more
(15 processes: 7,628 img/s with no model). The rank runs one torch CPU thread: its GPU does the arithmetic. PyTorch's
DataLoader pins each worker process to one intra-op thread (torch/utils/data/_utils/worker.py,
``torch.set_num_threads(1)``; https://pytorch.org/docs/stable/data.html#multi-process-data-loading).

What they decode: the per-core rate bench/loader.py measures (RandomResizedCrop + flip at 224 px, one process, one
thread), times the processes, counting SMT: an EC2 vCPU is one hyperthread of a core, two per core on every GPU type
in the catalog (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/cpu-options-supported-instances-values.html).
The first process on a core gets the measured rate; a second on the same core adds ``smt_gain`` of it (Intel: up to
30% more throughput from Hyper-Threading, https://www.intel.com/content/www/us/en/gaming/resources/hyper-threading.html);
with one process per core that term is zero.

Where the GPU decodes instead (``decode_path``): the trainer's ``--decode gpu`` (training/gpudecode.py: nvJPEG, the
crop and flip on the GPU) is chosen when the rank's loader processes cannot feed its GPU and the GPU's own decoder,
net of the GPU time it takes, gives more. Measured on the same H200: training with it ran at 0.84 of synthetic on
full-size shards (4,561 img/s; the CPU path 3,615-3,895) and 0.83-0.87 on resized ones (the CPU path, 8 processes:
0.91), so it wins where the CPUs fall short and loses where they keep up.

Nodes without GPUs (the local rehearsal cluster's CPU ranks) keep the trainer's own defaults: there the rank's
threads do the arithmetic and two loader processes feed them.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from infra.catalog import gpu_jpeg_decode

__all__ = ["CPU_RANK_WORKERS", "GPU_DECODE_SHARE", "THREADS_PER_CORE", "LoaderPlan", "decode_capacity", "decode_path",
           "for_instance", "for_share", "loader_plan", "node_input"]

CPU_RANK_WORKERS = 2  # training/train.py's default, for ranks that compute on CPUs
THREADS_PER_CORE = 2  # vCPUs per physical core on the catalog's GPU types (SMT on)
# Training with --decode gpu against synthetic input, same GPU (H200, ResNet-50 fp16): 0.84 on full-size shards,
# 0.83-0.87 on --resize 256 ones; nvJPEG's batches and the crops take GPU time the model would have had.
GPU_DECODE_SHARE = 0.84


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
    return LoaderPlan(vcpus_per_rank=vcpus_per_rank, workers_per_rank=max(1, vcpus_per_rank // THREADS_PER_CORE),
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


def decode_path(cpu_capacity: float, demand: float, gpu_decode: float | None) -> str:
    """Where a GPU rank's training images are decoded: "cpu" (its loader processes, which decode ``cpu_capacity``
    images/s) or "gpu" (nvJPEG on its GPU, ``gpu_decode`` images/s alone; None where the GPU has no measured
    decoder), for a GPU that would take ``demand`` images/s. The GPU path gives the smaller of its decoder's rate and
    GPU_DECODE_SHARE of the demand; it is chosen only when that beats what the CPUs give."""
    if gpu_decode is None or cpu_capacity >= demand:
        return "cpu"
    return "gpu" if min(gpu_decode, GPU_DECODE_SHARE * demand) > cpu_capacity else "cpu"


def node_input(instance, plan: LoaderPlan, per_core: float, smt_gain: float, demand: float,
               resized: bool) -> tuple[str, float]:
    """(decode path, images/s the input pipeline of one node of ``instance`` gives) for GPUs that would take
    ``demand`` images/s on that node: the loader processes' capacity, or the GPUs' own decoders where decode_path
    chooses them (``resized``: the shards were converted with --resize 256)."""
    cpu = decode_capacity(instance.vcpus, plan.processes_per_node(instance.gpus), per_core, smt_gain)
    gpu_rate = gpu_jpeg_decode(instance.gpu_model, resized)
    if decode_path(cpu / instance.gpus, demand / instance.gpus, gpu_rate) == "gpu":
        return "gpu", instance.gpus * min(gpu_rate, GPU_DECODE_SHARE * demand / instance.gpus)
    return "cpu", cpu
