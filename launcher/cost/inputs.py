"""The cost model's inputs: what is trained (:class:`Workload`), every assumption and fit the model makes
(:class:`ModelConstants`), the strategies it knows, and the single-GPU figure it starts from (:class:`GpuThroughput`:
an override, this project's measurement, or the catalog's published one). Pure; launcher.cost.model computes with them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.catalog import WORKLOADS, InstanceType, published_throughput

__all__ = [
    "BYTES_PER_IMAGE",
    "DEFAULT_CONSTANTS",
    "DEFAULT_TIER_TYPE",
    "IMAGENET_BYTES",
    "IMAGENET_TRAIN_IMAGES",
    "IMAGENET_VAL_IMAGES",
    "RESNET50_PARAMS",
    "STRATEGIES",
    "STRATEGY_LABELS",
    "GpuThroughput",
    "ModelConstants",
    "Precision",
    "Strategy",
    "Workload",
    "imagenet",
    "resolve_gpu_throughput",
]

RESNET50_PARAMS = 25_557_032  # torchvision resnet50: conv + bn + fc weights and biases
IMAGENET_TRAIN_IMAGES = 1_281_167  # ILSVRC2012 train split
IMAGENET_VAL_IMAGES = 50_000  # ILSVRC2012 validation split
# ILSVRC2012_img_train.tar (147,897,477,120 B) + ILSVRC2012_img_val.tar (6,744,924,160 B): the JPEG bytes the shards
# hold. Per image that is ~115 kB, used for data sets given only by image count.
IMAGENET_BYTES = 147_897_477_120 + 6_744_924_160
BYTES_PER_IMAGE = IMAGENET_BYTES / (IMAGENET_TRAIN_IMAGES + IMAGENET_VAL_IMAGES)

Strategy = Literal["horovod", "ps", "reducers"]
STRATEGIES: tuple[Strategy, ...] = ("horovod", "ps", "reducers")
STRATEGY_LABELS: dict[str, str] = {
    "horovod": "Horovod ring allreduce",
    "ps": "parameter servers",
    "reducers": "reducer tier",
}
# The CPU tier's instance type when none is named. Parameter servers: seed 000 used m4.16xlarge (64 vCPUs, 25 Gbps),
# which the catalog does not carry; m5.24xlarge has the same 25 Gbps. Reducers: seed 004's C5n.
DEFAULT_TIER_TYPE: dict[str, str] = {"ps": "m5.24xlarge", "reducers": "c5n.18xlarge"}
Precision = Literal["amp", "fp32"]


class Workload(BaseModel):
    """What is trained: how many samples (images, sequences), how many epochs, and how heavy the model is.

    ``name`` picks the catalog's per-GPU figure (infra.catalog.published_throughput): ``resnet50`` (and ``custom``,
    scaled by ``flops_ratio``), ``bert-large`` or ``mask-rcnn``; launcher.cost.workloads builds each recipe.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    images_per_epoch: int = Field(gt=0, description="samples per epoch: images, or sequences for bert-large")
    epochs: int = Field(gt=0)
    name: str = Field("resnet50", description="resnet50, bert-large, mask-rcnn or custom")
    sample_noun: str = Field("images", description="what one sample is, for people: images, sequences, samples")
    global_batch: int | None = Field(
        None, gt=0, description="the recipe's global batch; gradient accumulation makes it up when the GPUs' "
                                "micro-batches fall short (None: no accumulation, the global batch grows with GPUs)"
    )
    node_efficiency_8gpu: float | None = Field(
        None, gt=0, le=1, description="one node of 8 GPUs against 8 x one GPU for this workload; None: "
                                      "ModelConstants.node_efficiency_8gpu (ResNet-50's)"
    )
    decodes_images: bool = Field(True, description="its loader decodes JPEGs (the CPU ceiling applies)")
    checkpoint_bytes_per_param: int = Field(8, ge=1, description="8: fp32 weights + SGD momentum; 12 with Adam/LAMB")
    flops_ratio: float = Field(
        1.0, gt=0, description="cost per image relative to ResNet-50 at 224 px (ResNet-18 at 32 px: ~0.0099)"
    )
    param_count: int = Field(RESNET50_PARAMS, gt=0, description="parameters whose gradients are allreduced")
    grad_bytes_per_param: int = Field(
        4, ge=1, le=8, description="4 for fp32 gradients, 2 with fp16 compression"
    )
    val_images: int = Field(IMAGENET_VAL_IMAGES, ge=0, description="images of the one validation pass at the end")
    dataset_bytes: int | None = Field(
        None, ge=0, description="bytes staged from S3 before training; default: images x ImageNet's ~115 kB"
    )
    checkpoint_every_epoch: bool = True

    @property
    def grad_bytes(self) -> int:
        return self.param_count * self.grad_bytes_per_param

    @property
    def checkpoint_bytes(self) -> int:
        """fp32 weights plus the optimizer's state: what a checkpoint holds, to within the batch-norm buffers."""
        return self.param_count * self.checkpoint_bytes_per_param

    @property
    def rate_unit(self) -> str:
        """'img/s', 'seq/s' or 'samples/s'."""
        return {"images": "img/s", "sequences": "seq/s"}.get(self.sample_noun, f"{self.sample_noun}/s")

    @property
    def staged_bytes(self) -> float:
        if self.dataset_bytes is not None:
            return float(self.dataset_bytes)
        return (self.images_per_epoch + self.val_images) * BYTES_PER_IMAGE


def imagenet(epochs: int = 90, *, fp16_allreduce: bool = False) -> Workload:
    """ResNet-50 on ImageNet-1k at 224 px: seed 000's workload."""
    return Workload(images_per_epoch=IMAGENET_TRAIN_IMAGES, epochs=epochs, dataset_bytes=IMAGENET_BYTES,
                    grad_bytes_per_param=2 if fp16_allreduce else 4)


class ModelConstants(BaseModel):
    """The model's assumptions, in one place. Defaults are calibrated to seeds 000 and 003 (see module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Fraction of the network line rate an allreduce achieves: nccl-tests' bus bandwidth (busbw, comparable to the
    # hardware's link speed whatever the rank count: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md)
    # over the instance's line rate. EFA: 4 x p4d.24xlarge (4 EFA, 400 Gbps = 50 GB/s), all_reduce_perf of 1 GiB,
    # busbw 29.6 GB/s = 0.59 (https://github.com/NVIDIA/nccl/issues/527, aws-ofi-nccl over libfabric EFA). FITTED to
    # that point; held out: 3 x p4d (31.8 GB/s) and p3dn's single EFA at 8-32 nodes (6-8 GB/s of 12.5,
    # https://github.com/NVIDIA/nccl/issues/235), docs/model-validation.md. TCP (NCCL/Horovod sockets on ENA):
    # 0.7 is what, with the overlap below, reproduces seed 000's 90% on 25 Gbps (FITTED to seed 000).
    network_efficiency_tcp: float = Field(0.70, gt=0, le=1)
    network_efficiency_efa: float = Field(0.59, gt=0, le=1)
    # Per-hop latency (alpha) of a message across nodes, seconds.
    network_latency_tcp_s: float = Field(30e-6, ge=0)
    network_latency_efa_s: float = Field(15e-6, ge=0)
    # Fraction of ONE direction of the per-GPU interconnect a ring achieves (the catalog figure is
    # bidirectional, so the usable bandwidth is catalog / 2 * this), and its per-hop latency.
    interconnect_efficiency: float = Field(0.70, gt=0, le=1)
    interconnect_latency_s: float = Field(5e-6, ge=0)
    # Backward propagation is ~2/3 of a training step's compute (it does ~2x the forward's FLOPs); a
    # validation image (forward only) therefore costs 1/3 of a training image.
    backward_share: float = Field(2 / 3, gt=0, lt=1)
    # Communication can hide behind at most this fraction of backward. Calibrated: 0.2 turns seed
    # 000's ~84 ms of allreduce per step into ~36 ms exposed, i.e. 91% scaling. It is low because the
    # 2018 stack (Horovod 0.13, 64 MB fusion buffer, 5 ms cycle) issued most traffic late, and it
    # absorbs what the model does not itemise (stragglers, input pipeline, negotiation).
    overlap_fraction: float = Field(0.27, ge=0, le=1)
    # What a multi-node step costs beyond the communication backward cannot hide (nodes > 1 only).
    # Stragglers: every node's time between two gradient syncs varies by this coefficient of variation (OS noise,
    # input hiccups, clocks under a power budget), and a synchronous step waits for the slowest of n nodes: for n
    # normal draws the expected maximum is about mean + sigma * sqrt(2 ln n) (the Gaussian extreme-value bound,
    # https://en.wikipedia.org/wiki/Extreme_value_theory; Dean & Barroso, 'The Tail at Scale', CACM 2013,
    # https://research.google/pubs/the-tail-at-scale/, on why the slowest of many sets the pace). The variation of k
    # accumulated micro-batches adds in quadrature (sigma * sqrt(k)). FITTED to seed 002's Horovod 94% on
    # 8 x p4d.24xlarge, where the allreduce itself hides; held out: NVIDIA's BERT multi-node table and seed 004
    # (docs/model-validation.md).
    straggler_cv: float = Field(0.027, ge=0, le=1)
    # Negotiation: Horovod's background thread gathers every rank's ready tensors on rank 0 once per cycle before a
    # fused allreduce starts (https://horovod.readthedocs.io/en/stable/timeline_include.html, 'Negotiation'), so the
    # step's last gradients wait up to one cycle: HOROVOD_CYCLE_TIME, 1 ms by default since Horovod 0.21
    # (https://github.com/horovod/horovod/releases/tag/v0.21.0: "Changed default cycle time from 5ms to 1ms",
    # horovod/horovod#2468). Taken as a fixed cost per sync across nodes; an assumption, not a fit.
    negotiation_s: float = Field(1e-3, ge=0)
    # One node of g GPUs trains at this fraction of g x the single-GPU figure (g = 8; for fewer, the loss shrinks in
    # proportion to g - 1). NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5, AMP, batch 256, pytorch-21.03: DGX-1
    # 16GB 1 GPU 1,200 img/s, 8 GPUs 8,322 = 0.867 (FITTED to it; held out: DGX A100 80GB 2,470 -> 16,621, DGX-1 32GB
    # 1,156 -> 8,056; https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Classification/ConvNets/
    # resnet50v1.5/README.md#training-performance-results). What it stands for: the eight ranks share the host's
    # CPUs, memory and PCIe switches for input, NCCL's NVLink allreduce of 102 MB each step, per-GPU batch-norm
    # statistics on a quarter of the images, and clocks under an 8-GPU power budget; the allreduce alone (~1 ms on
    # NVSwitch at nccl-tests' 230 GB/s busbw, https://github.com/NVIDIA/nccl/issues/527) is the smallest part.
    node_efficiency_8gpu: float = Field(0.867, gt=0, le=1)
    # The loader ceiling: images/s ONE CORE decodes and augments (RandomResizedCrop + flip at 224 px, the loader's
    # transform), as `.venv/bin/python bench/loader.py` measured it on 2026-11-23 (x86_64, 2 shared cores, the
    # slower of its runs; 2026-11-21: 559 and 977-998): `loader` on 500x375 q90 shards and `loader, pre-resized` on
    # `launch data convert --resize 256` shards. The processes are launcher.plans.loading's (all but one vCPU of each
    # GPU rank's share), a second process on a core's other hyperthread adding smt_gain of a core (Intel: up to 30%).
    loader_img_per_sec_per_core: float = Field(356.0, gt=0)
    loader_img_per_sec_per_core_resized: float = Field(611.0, gt=0)
    smt_gain: float = Field(0.25, ge=0, le=1)
    # The reducer tier: the engine (training/reducer.py) moves buckets over gloo on TCP, through host memory on the
    # GPU nodes: each bucket is copied device -> host before it is sent and host -> device after the sum comes back.
    # PCIe Gen3 x16 moves ~12 GB/s each way in practice (NVIDIA's bandwidthTest on pinned memory); an assumption.
    host_staging_bytes_per_sec: float = Field(12e9, gt=0)
    # Parameter servers: what one server process gets through per second of incoming gradient when it sums
    # the pushes and runs the optimizer update (ps-lite over ZMQ/TCP). FIT to seed 003: with it, one
    # m5.24xlarge-class (25 Gbps) server for 8 x p3.16xlarge gives 38% scaling, as theirs did.
    ps_server_bytes_per_sec: float = Field(4.0e9, gt=0)
    # Reducers: gradient bytes one vCPU sums per second (AVX float adds, memory-bound; c5n.18xlarge: 72 x 0.5 =
    # 36 GB/s, about a third of its memory bandwidth). An assumption; it binds only for small reducers.
    reducer_sum_bytes_per_sec_per_vcpu: float = Field(0.5e9, gt=0)
    # Fixed costs. Provisioning: billed time from instance launch to SSH-ready nodes (boot, EFA and driver
    # checks) plus termination; an assumption. Staging: each node pulls its share of the data set from S3 at
    # this fraction of min(its line rate, AWS's 100 Gbps EC2-to-S3 ceiling). Checkpoints: rank 0 writes
    # weights + momentum to an EBS gp3 volume at its baseline 125 MiB/s while the other ranks wait; with
    # that, seed 000's per-epoch time comes out at their 33 s.
    provisioning_s: float = Field(300.0, ge=0)
    s3_efficiency: float = Field(0.5, gt=0, le=1)
    s3_max_gbps: float = Field(100.0, gt=0)
    checkpoint_write_bytes_per_sec: float = Field(125 * 2**20, gt=0)


DEFAULT_CONSTANTS = ModelConstants()


class GpuThroughput(BaseModel):
    """Single-GPU training samples/s (ResNet-50 images unless a workload says otherwise) and where it comes from."""

    model_config = ConfigDict(frozen=True)

    img_per_sec: float = Field(gt=0, allow_inf_nan=False)  # a recorded inf is ignored with the file, not priced
    source: str
    batch_per_gpu: int | None = Field(None, gt=0, description="the per-GPU batch of the published figure")


def resolve_gpu_throughput(instance: InstanceType, precision: Precision = "amp", *, override: float | None = None,
                           measured: Mapping[str, GpuThroughput] | None = None,
                           workload: str = "resnet50") -> GpuThroughput:
    """The per-GPU figure the model uses: ``override``, else this project's measurement, else the catalog's.

    ``measured`` maps ``'GPU_MODEL/precision'`` (e.g. ``'V100/amp'``) to figures recorded from runs (see
    :mod:`launcher.cost.measured`); they are ResNet-50's, so other workloads (``'bert-large'``, ``'mask-rcnn'``)
    read the catalog's published figure for their own model. The catalog carries mixed-precision (``amp``) figures
    only.
    """
    if instance.gpus == 0 or instance.resnet50_img_per_sec_per_gpu is None:
        raise ValueError(f"{instance.name} has no GPUs; training needs a GPU instance type")
    if precision not in ("amp", "fp32"):
        raise ValueError(f"unknown precision '{precision}'; choose one of: amp, fp32")
    published = published_throughput(instance, workload if workload in WORKLOADS else "resnet50")
    assert published is not None
    if override is not None:
        if not (override > 0 and math.isfinite(override)):
            raise ValueError(f"gpu_throughput must be a positive number of samples/s, got {override}")
        return GpuThroughput(img_per_sec=override, source="override (--gpu-throughput)",
                             batch_per_gpu=published.batch_per_gpu)
    if workload in WORKLOADS and workload != "resnet50":
        if precision != "amp":
            raise ValueError(f"no {precision} {workload} figure for {instance.gpu_model} (the catalog has mixed "
                             f"precision only); pass --gpu-throughput")
        return GpuThroughput(img_per_sec=published.samples_per_sec, batch_per_gpu=published.batch_per_gpu,
                             source=f"catalog, {instance.gpu_model} {workload} mixed precision: {published.source}")
    key = f"{instance.gpu_model}/{precision}"
    if measured and key in measured:
        return measured[key]
    if precision == "amp":
        return GpuThroughput(img_per_sec=instance.resnet50_img_per_sec_per_gpu,
                             source=f"catalog, {instance.gpu_model} mixed precision: {instance.throughput_source}")
    raise ValueError(f"no {precision} ResNet-50 figure for {instance.gpu_model} (the catalog has mixed precision "
                     f"only and none was measured); pass --gpu-throughput")

