"""The one instance catalog: every instance fact scaletrain uses, with where each figure came from.

Nothing else hard-codes an instance fact. The CDK stacks (instance type, EFA network
cards), the launcher (slots per node, EFA env) and the cost model (GPUs, network, interconnect,
price, per-GPU throughput) all read this module. It imports only the standard library and pydantic,
so the launcher and the tests use it without aws-cdk-lib.

Units, stated once:

- ``network_gbps``: the instance's network bandwidth in gigabits per second, as AWS lists it.
- ``gpu_interconnect_gbps``: per-GPU intra-node bandwidth in gigaBYTES per second, bidirectional
  aggregate, the way NVIDIA quotes NVLink (V100 NVLink 2: 6 links x 50 GB/s = 300 GB/s; A100
  NVLink 3: 600 GB/s; H100/H200 NVLink 4: 900 GB/s) and PCIe the same way (Gen3 x16: 32 GB/s,
  Gen4 x16: 64 GB/s). A ring uses one direction, so the cost model takes half of it.
- ``gpu_memory_gib``: per GPU. ``local_nvme_gb``: total instance-store NVMe, decimal GB as AWS lists.
- ``price_usd_per_hour``: us-east-1, Linux, on-demand, shared tenancy. ``price_date`` is the date the
  figure was observed in its source; ``price_source`` says what that source is and how far it was
  confirmed.

Hardware facts follow the EC2 instance-type specifications
(https://docs.aws.amazon.com/ec2/latest/instancetypes/ac.html for P and G types,
https://docs.aws.amazon.com/ec2/latest/instancetypes/co.html for C5n,
https://docs.aws.amazon.com/ec2/latest/instancetypes/gp.html for M5) and, for EFA network cards,
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-acc-inst-types.html (P5: 32 network cards,
3,200 Gbps). ``efa_cards`` counts the network cards that can carry an EFA interface; 0 means the
type has no EFA at all (p3.16xlarge, the 2018 seed's instance, ran over TCP).

Every non-P3 entry's vCPUs, memory, network, EFA interfaces (MaximumEfaInterfaces = network cards
here), instance storage and GPU memory were cross-checked against the DescribeInstanceTypes snapshot
moto 5.2.5 ships (moto/ec2/resources/instance_types.json.gz); that snapshot has no P3 rows, so the
P3 figures rest on the AWS specification pages alone. GPU memory is what DescribeInstanceTypes reports
(A10G: 22,888 MiB = 22.35 GiB, marketed as 24 GB; H200: 144,384 MiB = 141 GiB).
"""

from __future__ import annotations

import datetime as dt
from typing import NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "MAX_NODES",
    "WORKLOADS",
    "InstanceType",
    "PublishedThroughput",
    "UnknownInstanceType",
    "get",
    "gpu_jpeg_decode",
    "gpu_types",
    "names",
    "nodes_allowed",
    "published_throughput",
]


# The most worker nodes any command plans, prices or deploys (`launch plan`, `launch cost`, the stack's nodes and so
# `launch preflight`): one limit, said in one sentence (nodes_allowed). AWS publishes no hard cap on a cluster's
# instances; its largest GPU clusters are EC2 UltraClusters of "up to 20,000 H100 GPUs" (Amazon EC2 P5 Instances,
# https://aws.amazon.com/ec2/instance-types/p5/), i.e. 2,500 p5.48xlarge, and of "more than 4,000 A100 GPUs" (Amazon
# EC2 P4 Instances, https://aws.amazon.com/ec2/instance-types/p4/), i.e. 500 p4d. 4,096 nodes is above both, so a
# larger count is a typo (5000 for 500), never a cluster anyone can get.
MAX_NODES = 4096


def nodes_allowed(nodes: int, role: str = "worker") -> str | None:
    """None for a node count a command accepts, else what is allowed (after the option and its value): 1 to
    MAX_NODES workers; 0 to MAX_NODES reducer (CPU tier) nodes."""
    low = 1 if role == "worker" else 0
    return None if low <= nodes <= MAX_NODES else f"allowed: {low} to {MAX_NODES} {role} nodes"


class UnknownInstanceType(ValueError):
    """Raised by :func:`get` for a name the catalog does not hold; the message is one line."""


# NVIDIA's open GPU kernel modules support Turing and newer GPUs only
# (https://github.com/NVIDIA/open-gpu-kernel-modules, "Supported GPUs"); Volta needs the proprietary driver.
_PROPRIETARY_DRIVER_ONLY = frozenset({"V100", "V100-32GB"})

# Each GPU's compute capability (NVIDIA, "CUDA GPU Compute Capability", https://developer.nvidia.com/cuda-gpus: V100
# 7.0, A100 8.0, A10G, an A10, 8.6, H100 and H200 9.0), the sm_XY a CUDA build needs kernels for to run there
# (launcher/doctor/gpuarch.py decides whether a torch build's arch list serves it).
_COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "V100": (7, 0), "V100-32GB": (7, 0), "A100-40GB": (8, 0), "A100-80GB": (8, 0), "A10G": (8, 6),
    "H100": (9, 0), "H200": (9, 0),
}


class InstanceType(BaseModel):
    """One EC2 instance type, with its dated on-demand price and a per-GPU ResNet-50 default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="EC2 instance type, e.g. 'p3.16xlarge'")
    family: str = Field(description="the part before the dot: 'p3', 'p3dn', 'p4d', 'p5', 'c5n', ...")
    gpus: int = Field(ge=0, description="NVIDIA GPUs; 0 for CPU-only types")
    gpu_model: str | None = Field(description="'V100', 'A100-40GB', 'H100', 'A10G', ...; None without GPUs")
    gpu_memory_gib: float = Field(ge=0, description="memory per GPU")
    vcpus: int = Field(gt=0)
    memory_gib: float = Field(gt=0)
    network_gbps: float = Field(gt=0, description="network bandwidth, gigabits per second")
    efa_cards: int = Field(ge=0, description="network cards that carry EFA interfaces; 0 = no EFA")
    local_nvme_gb: int = Field(ge=0, description="total instance-store NVMe, decimal GB")
    gpu_interconnect_gbps: float = Field(
        ge=0, description="per-GPU intra-node bandwidth, GB/s (bytes), bidirectional, NVLink or PCIe"
    )
    price_usd_per_hour: float = Field(gt=0, description="us-east-1 Linux on-demand")
    price_date: dt.date = Field(description="date the price was observed in price_source")
    price_source: str = Field(min_length=1)
    resnet50_img_per_sec_per_gpu: float | None = Field(
        gt=0, description="single-GPU mixed-precision ResNet-50 training images/s; None without GPUs"
    )
    throughput_source: str | None = None

    @model_validator(mode="after")
    def _consistent(self) -> InstanceType:
        if self.family != self.name.split(".", 1)[0]:
            raise ValueError(f"{self.name}: family {self.family!r} does not match the name")
        gpu_fields = (self.gpu_model, self.resnet50_img_per_sec_per_gpu, self.throughput_source)
        if self.gpus > 0:
            if None in gpu_fields or self.gpu_memory_gib <= 0 or self.gpu_interconnect_gbps <= 0:
                raise ValueError(f"{self.name}: a GPU type needs its GPU model, memory, link and throughput")
        elif any(f is not None for f in gpu_fields) or self.gpu_memory_gib or self.gpu_interconnect_gbps:
            raise ValueError(f"{self.name}: a CPU-only type carries no GPU facts")
        return self

    @property
    def has_efa(self) -> bool:
        return self.efa_cards > 0

    @property
    def needs_proprietary_driver(self) -> bool:
        """True for GPUs NVIDIA's open kernel modules do not drive (before Turing: the V100).

        The project's default image build (and the Deep Learning Base *OSS* Nvidia Driver AMIs) ship the open
        modules, so these types resolve the image built with ``-c nvidia_kernel_modules=proprietary``
        (:data:`ami.paths.IMAGE_ID_PARAMETER_PROPRIETARY`; ``infra.spec.ClusterSpec.image_parameter``).
        """
        return self.gpu_model in _PROPRIETARY_DRIVER_ONLY

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """(major, minor) of the type's GPU, e.g. (7, 0) for the V100; None without GPUs."""
        return _COMPUTE_CAPABILITY[self.gpu_model] if self.gpu_model else None

    @property
    def network_bytes_per_sec(self) -> float:
        """Line rate in bytes per second (``network_gbps`` is gigabits)."""
        return self.network_gbps * 1e9 / 8


# --- Per-GPU ResNet-50 training throughput (mixed precision, batch 256 per GPU) -----------------


class _Throughput(NamedTuple):
    img_per_sec: float
    source: str


_SEED_000 = (
    "seed 000 (AWS ML blog, 2018-07-20, 'Scalable multi-node deep learning training using GPUs in "
    "the AWS Cloud'): TensorFlow 1.9 + Horovod 0.13, 8 x p3.16xlarge, ~41,000 img/s at 90% scaling "
    "against one node (the seed computes MXNet's that way) => 41,000 / (0.90 x 8) = 5,694 img/s per node, "
    "712 per GPU in a full node; one GPU alone: 712 / 0.867 (NVIDIA's DGX-1 8-GPU over 8 x 1-GPU, the cost "
    "model's node_efficiency_8gpu) = 821 img/s per V100. NVIDIA's newer PyTorch stack does more "
    "(DeepLearningExamples ResNet50 v1.5 PyTorch README, DGX-1 V100 16GB, 1 GPU AMP, pytorch-21.03: "
    "1,200 img/s); pass --gpu-throughput to model that stack"
)
_NVIDIA_A100 = (
    "NVIDIA DeepLearningExamples, PyTorch/Classification/ConvNets/resnet50v1.5/README.md, 'Training "
    "performance: NVIDIA DGX A100 (8x A100 80GB)', 1 GPU, mixed precision, pytorch-21.03 NGC container: "
    "2,470 img/s (https://github.com/NVIDIA/DeepLearningExamples). The 40GB part has the same SMs and "
    "clocks; ResNet-50 at batch 256 fits either, so the same figure is used"
)
_H200_MEASURED = (
    "MEASURED by this project (docs/benchmarks.md, 'GPU'): `bash bench/gpu_device.sh` (bench/gpu.py) on one "
    "NVIDIA H200 (driver 580.159.04), PyTorch 2.11.0+cu130, cuDNN 9.19: the project's trainer (DDP, one rank), "
    "ResNet-50 at 224 px, batch 256, fp16 AMP, channels_last, eager, synthetic input: 5,399 and 5,438 img/s in two "
    "runs on 2026-11-27 (5,400); with --compile 6,025. Real input reached 0.91 of it (8 loader processes, "
    "--resize 256 shards)"
)
_H100_FROM_H200 = (
    "H200's MEASUREMENT, not one made on an H100: the H100 SXM5 has the same 132 SMs and clocks, with 3.35 TB/s of "
    "HBM3 against the H200's 4.8 (the batch-norm and elementwise passes of a step read memory, so an H100 may run "
    "somewhat slower; unmeasured). " + _H200_MEASURED
)
_A10G_ESTIMATE = (
    "ESTIMATE, not an NVIDIA-published figure: no A10G ResNet-50 PyTorch training table was found. "
    "Scaled from the A100 AMP figure (2,470) by the A10G's memory bandwidth (600 vs 2,039 GB/s, "
    "x0.29 = 730) and FP16 tensor throughput (x0.40 = 990), taking roughly the middle: 800 img/s"
)

_RESNET50: dict[str, _Throughput] = {
    "V100": _Throughput(821.0, _SEED_000),
    "V100-32GB": _Throughput(821.0, _SEED_000),
    "A100-40GB": _Throughput(2470.0, _NVIDIA_A100),
    "A100-80GB": _Throughput(2470.0, _NVIDIA_A100),
    "H100": _Throughput(5400.0, _H100_FROM_H200),
    "H200": _Throughput(5400.0, _H200_MEASURED),
    "A10G": _Throughput(800.0, _A10G_ESTIMATE),
}

# --- GPU-side JPEG decoding (the trainer's --decode gpu: nvJPEG through torchvision, crop and flip on the GPU) ----
# Images/s one GPU decodes, crops and flips with no model running (500x375 q90 JPEGs as converted, and --resize 256
# shards), 15 loader processes reading: measured on an H200 by bench/gpu.py's pipeline table, 2026-11-27 (5,361 /
# 9,157 and 5,188 / 9,559 in two runs; the lower of each kept). Only GPUs with NVIDIA's hardware JPEG decoder that
# were measured: the H100 and H200 (one GH100 die) carry seven NVJPG engines (NVIDIA H100 Tensor Core GPU Architecture
# whitepaper: 7 NVJPG, 7 NVDEC); the A100's decoder is not measured here; the V100 and A10G have
# none, and nvJPEG's CUDA decoder there would take the SMs the training needs.
_JPEG_DECODE: dict[str, tuple[float, float]] = {"H100": (5188.0, 9157.0), "H200": (5188.0, 9157.0)}


def gpu_jpeg_decode(gpu_model: str | None, resized: bool) -> float | None:
    """Images/s one GPU of ``gpu_model`` decodes for training on its own (--decode gpu); None where not measured."""
    rates = _JPEG_DECODE.get(gpu_model or "")
    return None if rates is None else rates[1 if resized else 0]

# --- Per-GPU throughput of the other workloads the planner knows (mixed precision) ---------------------------
# Each figure is NVIDIA's single-GPU training throughput at the per-GPU batch its recipe uses, so the cost model's
# one-node and multi-node terms start from one GPU alone, as they do for ResNet-50.

_DLE_BERT = "https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/LanguageModeling/BERT/README.md"
_DLE_BERT_1907 = ("https://github.com/NVIDIA/DeepLearningExamples/blob/23a6382cbe8f77c22b0a7b7d263191ee6b947dfa/"
                  "PyTorch/LanguageModeling/BERT/README.md")
_DLE_MASKRCNN = "https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Segmentation/MaskRCNN/README.md"
_BERT_V100_32 = (
    f"NVIDIA DeepLearningExamples BERT for PyTorch, 'Pre-training NVIDIA DGX-1 With 32G', pytorch:21.11, phase 1 "
    f"(sequence length 128), 1 GPU, mixed precision, batch 64 per GPU (accumulated to 4,096): 224 sequences/s "
    f"({_DLE_BERT}#pre-training-nvidia-dgx-1-with-32g)"
)
_BERT_V100_16 = (
    f"NVIDIA DeepLearningExamples BERT for PyTorch as of pytorch:19.07, 'Pre-training NVIDIA DGX-1 With 16G', phase 1, "
    f"1 GPU, mixed precision, batch 16 per GPU (64 does not fit in 16 GB): 125.44 sequences/s ({_DLE_BERT_1907}"
    f"#pre-training-nvidia-dgx-1-with-16g); the newer 21.11 README has no 16 GB table"
)
_BERT_A100 = (
    f"NVIDIA DeepLearningExamples BERT for PyTorch, 'Pre-training NVIDIA DGX A100 (8x A100 80GB)', pytorch:21.11, "
    f"phase 1, 1 GPU, mixed precision, batch 256 per GPU: 580 sequences/s ({_DLE_BERT}"
    f"#pre-training-nvidia-dgx-a100-8x-a100-80gb)"
)
_BERT_A100_40 = (
    "ESTIMATE for the 40 GB part: the 80 GB figure at batch 128 (the README's TF32 batch; 256 is published for 80 GB "
    "only), same SMs and clocks. " + _BERT_A100
)
_BERT_H100 = (
    "ESTIMATE, not an NVIDIA-published PyTorch figure (DeepLearningExamples has no H100 BERT table): 1.8 x the A100 "
    "figure (580), the ratio the catalog's H100 ResNet-50 estimate used before an H200 was measured (2.2x). "
    + _BERT_A100
)
_BERT_A10G = (
    "ESTIMATE: the A100 figure (580) scaled as the catalog's A10G ResNet-50 estimate is (800 / 2,470), at batch 32 "
    "(24 GB). " + _BERT_A100
)
_MASKRCNN_V100 = (
    f"NVIDIA DeepLearningExamples Mask R-CNN for PyTorch, 'Training performance: NVIDIA DGX-1 (8x V100 32GB)', 21.12, "
    f"1 GPU, mixed precision, batch 12 per GPU: 16 images/s ({_DLE_MASKRCNN}"
    f"#training-performance-nvidia-dgx-1-8x-v100-32gb)"
)
_MASKRCNN_V100_16 = "ESTIMATE for V100 16 GB: the 32 GB figure at batch 6 (12 is NVIDIA's tested size on 32 GB). " \
    + _MASKRCNN_V100
_MASKRCNN_A100 = (
    f"NVIDIA DeepLearningExamples Mask R-CNN for PyTorch, 'Training performance: NVIDIA DGX A100 (8x A100 80GB)', "
    f"21.12, 1 GPU, mixed precision, batch 12 per GPU: 24 images/s ({_DLE_MASKRCNN}"
    f"#training-performance-nvidia-dgx-a100-8x-a100-80gb); the 40 GB part is assumed the same"
)
_MASKRCNN_H100 = ("ESTIMATE: 1.8 x the A100 figure, as the BERT estimate. " + _MASKRCNN_A100)
_MASKRCNN_A10G = ("ESTIMATE: the A100 figure scaled by 800 / 2,470 as the catalog's A10G ResNet-50 estimate, at "
                  "batch 6. " + _MASKRCNN_A100)


class PublishedThroughput(BaseModel):
    """One GPU's training throughput for a workload: samples/s at the per-GPU batch it was measured with."""

    model_config = ConfigDict(frozen=True)

    samples_per_sec: float = Field(gt=0)
    batch_per_gpu: int = Field(gt=0, description="the per-GPU (micro-)batch of the published run")
    source: str = Field(min_length=1)


def _pt(samples_per_sec: float, batch: int, source: str) -> PublishedThroughput:
    return PublishedThroughput(samples_per_sec=samples_per_sec, batch_per_gpu=batch, source=source)


# The workloads the planner knows (launcher.cost.workloads holds their recipes). ResNet-50 reads the entries' own
# resnet50 fields above.
WORKLOADS = ("resnet50", "bert-large", "mask-rcnn")
_PUBLISHED: dict[str, dict[str, PublishedThroughput]] = {
    "bert-large": {
        "V100": _pt(125.44, 16, _BERT_V100_16),
        "V100-32GB": _pt(224.0, 64, _BERT_V100_32),
        "A100-40GB": _pt(580.0, 128, _BERT_A100_40),
        "A100-80GB": _pt(580.0, 256, _BERT_A100),
        "H100": _pt(1044.0, 256, _BERT_H100),
        "H200": _pt(1044.0, 256, "ESTIMATE: the H100 estimate (H200: H100's SMs, more memory). " + _BERT_H100),
        "A10G": _pt(188.0, 32, _BERT_A10G),
    },
    "mask-rcnn": {
        "V100": _pt(16.0, 6, _MASKRCNN_V100_16),
        "V100-32GB": _pt(16.0, 12, _MASKRCNN_V100),
        "A100-40GB": _pt(24.0, 12, _MASKRCNN_A100),
        "A100-80GB": _pt(24.0, 12, _MASKRCNN_A100),
        "H100": _pt(43.0, 12, _MASKRCNN_H100),
        "H200": _pt(43.0, 12, "ESTIMATE: the H100 estimate. " + _MASKRCNN_H100),
        "A10G": _pt(7.8, 6, _MASKRCNN_A10G),
    },
}


def published_throughput(instance: InstanceType, workload: str) -> PublishedThroughput | None:
    """The catalog's single-GPU figure for ``workload`` on ``instance``'s GPU; None for CPU types.

    ``ValueError`` (one line, with the choices) for a workload the catalog does not know.
    """
    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload '{workload}'; choose one of: {', '.join(WORKLOADS)}")
    if instance.gpu_model is None or instance.resnet50_img_per_sec_per_gpu is None:
        return None
    if workload == "resnet50":
        return _pt(instance.resnet50_img_per_sec_per_gpu, 256, instance.throughput_source or "catalog")
    return _PUBLISHED[workload][instance.gpu_model]


# --- Prices: us-east-1, Linux, on-demand ---------------------------------------------------------

_AWS_ON_DEMAND = "https://aws.amazon.com/ec2/pricing/on-demand/"
_PRICE_CUT_2025 = (
    "AWS News Blog, 'Announcing up to 45% price reduction for Amazon EC2 NVIDIA GPU-accelerated "
    "instances' (June 2025; on-demand cuts for P4d, P4de, P5, P5en effective 2025-06-01)"
)
_DATARECEIPTS = (
    "https://raw.githubusercontent.com/datareceipts/data-receipts/main/109-gpu-pricing/hyperscalers.json "
    "(AWS us-east-1 rows, retrieved 2026-11-09)"
)
_PRICE_TABLE_2026_09 = (
    "corroborated by a third-party price table stating it was checked entry by entry against the AWS "
    "Price List (AmazonEC2 us-east-1 offer file version 20260924211011)"
)
_SKYPILOT_AWS = "https://github.com/skypilot-org/skypilot-catalog/blob/master/catalogs/v7/aws/vms.csv"

_PRICE_P3 = (
    f"{_AWS_ON_DEMAND} (us-east-1 Linux list price, unchanged since P3's 2017 launch); "
    f"{_PRICE_TABLE_2026_09} and by the same figure in an Apache-2.0 AWS sample price table. "
    "Not read from AWS directly here"
)
_PRICE_P3DN = (
    f"{_AWS_ON_DEMAND}; UNCONFIRMED against an AWS-published file in this session: the figure is the one "
    "several independent third-party price tables carry (one citing Vantage's EC2 listing, April 2026)"
)
_PRICE_G5 = (
    f"{_AWS_ON_DEMAND}; {_PRICE_TABLE_2026_09}, and the same figure in an Apache-2.0 AWS sample price table"
)
_PRICE_C5N = (
    f"{_SKYPILOT_AWS}: us-east-1 on-demand c5n.metal (72 vCPU, 192 GiB, the c5n.18xlarge shape) = 3.888, "
    "c5n.xlarge = 0.216; AWS prices sizes within a family per vCPU, so c5n.9xlarge = 9 x 0.216 = 1.944 "
    "and c5n.18xlarge = 18 x 0.216 = 3.888"
)
_PRICE_M5 = f"{_AWS_ON_DEMAND}; {_PRICE_TABLE_2026_09} (also 48 x the m5.large rate of 0.096)"
_PRICE_M5_LARGE = (
    f"{_AWS_ON_DEMAND}; {_PRICE_TABLE_2026_09}; m5.24xlarge's 4.608 above is 48 x this rate, as AWS prices the "
    "sizes of a family per vCPU"
)


def _p4_p5_source(pre_cut: str) -> str:
    return f"{_PRICE_CUT_2025}; post-cut figure from {_DATARECEIPTS}, {_PRICE_TABLE_2026_09}; {pre_cut}"


# --- The entries ---------------------------------------------------------------------------------

_NVLINK2, _NVLINK3, _NVLINK4 = 300.0, 600.0, 900.0  # GB/s per GPU, bidirectional (NVIDIA data sheets)
_PCIE3_X16, _PCIE4_X16 = 32.0, 64.0  # GB/s per GPU, bidirectional


def _gpu_type(*, name: str, gpu_model: str, **facts: object) -> InstanceType:
    throughput = _RESNET50[gpu_model]
    return InstanceType(
        name=name,
        family=name.split(".", 1)[0],
        gpu_model=gpu_model,
        resnet50_img_per_sec_per_gpu=throughput.img_per_sec,
        throughput_source=throughput.source,
        **facts,
    )


def _cpu_type(*, name: str, **facts: object) -> InstanceType:
    return InstanceType(
        name=name,
        family=name.split(".", 1)[0],
        gpus=0,
        gpu_model=None,
        gpu_memory_gib=0,
        gpu_interconnect_gbps=0,
        resnet50_img_per_sec_per_gpu=None,
        **facts,
    )


# One entry per line group, kept as a table on purpose.
# fmt: off
_ENTRIES: tuple[InstanceType, ...] = (
    _gpu_type(
        name="p3.2xlarge", gpu_model="V100", gpus=1, gpu_memory_gib=16, vcpus=8, memory_gib=61,
        network_gbps=10, efa_cards=0, local_nvme_gb=0, gpu_interconnect_gbps=_PCIE3_X16,
        price_usd_per_hour=3.06, price_date=dt.date(2026, 9, 24), price_source=_PRICE_P3,
    ),
    _gpu_type(
        name="p3.8xlarge", gpu_model="V100", gpus=4, gpu_memory_gib=16, vcpus=32, memory_gib=244,
        network_gbps=10, efa_cards=0, local_nvme_gb=0, gpu_interconnect_gbps=_NVLINK2,
        price_usd_per_hour=12.24, price_date=dt.date(2026, 9, 24), price_source=_PRICE_P3,
    ),
    _gpu_type(
        name="p3.16xlarge", gpu_model="V100", gpus=8, gpu_memory_gib=16, vcpus=64, memory_gib=488,
        network_gbps=25, efa_cards=0, local_nvme_gb=0, gpu_interconnect_gbps=_NVLINK2,
        price_usd_per_hour=24.48, price_date=dt.date(2026, 9, 24), price_source=_PRICE_P3,
    ),
    _gpu_type(
        name="p3dn.24xlarge", gpu_model="V100-32GB", gpus=8, gpu_memory_gib=32, vcpus=96, memory_gib=768,
        network_gbps=100, efa_cards=1, local_nvme_gb=1800, gpu_interconnect_gbps=_NVLINK2,
        price_usd_per_hour=31.212, price_date=dt.date(2026, 4, 1), price_source=_PRICE_P3DN,
    ),
    _gpu_type(
        name="p4d.24xlarge", gpu_model="A100-40GB", gpus=8, gpu_memory_gib=40, vcpus=96, memory_gib=1152,
        network_gbps=400, efa_cards=4, local_nvme_gb=8000, gpu_interconnect_gbps=_NVLINK3,
        price_usd_per_hour=21.957642, price_date=dt.date(2026, 11, 9),
        price_source=_p4_p5_source("pre-cut on-demand was 32.7726"),
    ),
    _gpu_type(
        name="p4de.24xlarge", gpu_model="A100-80GB", gpus=8, gpu_memory_gib=80, vcpus=96, memory_gib=1152,
        network_gbps=400, efa_cards=4, local_nvme_gb=8000, gpu_interconnect_gbps=_NVLINK3,
        price_usd_per_hour=27.44705, price_date=dt.date(2026, 11, 9),
        price_source=_p4_p5_source("pre-cut on-demand was 40.9657"),
    ),
    _gpu_type(
        name="p5.48xlarge", gpu_model="H100", gpus=8, gpu_memory_gib=80, vcpus=192, memory_gib=2048,
        network_gbps=3200, efa_cards=32, local_nvme_gb=30400, gpu_interconnect_gbps=_NVLINK4,
        price_usd_per_hour=55.04, price_date=dt.date(2026, 11, 9),
        price_source=_p4_p5_source("pre-cut on-demand was 98.32"),
    ),
    _gpu_type(
        name="p5en.48xlarge", gpu_model="H200", gpus=8, gpu_memory_gib=141, vcpus=192, memory_gib=2048,
        network_gbps=3200, efa_cards=16, local_nvme_gb=30400, gpu_interconnect_gbps=_NVLINK4,
        price_usd_per_hour=63.296, price_date=dt.date(2026, 8, 6),
        price_source=(
            f"{_PRICE_CUT_2025}; post-cut figure from `dstack offer` output in "
            f"https://github.com/dstackai/dstack/pull/4110 (2026-08-06: aws us-east-1 on-demand 63.296), "
            f"{_PRICE_TABLE_2026_09}; pre-cut figure not confirmed"
        ),
    ),
    _gpu_type(
        name="g5.48xlarge", gpu_model="A10G", gpus=8, gpu_memory_gib=22.35, vcpus=192, memory_gib=768,
        network_gbps=100, efa_cards=1, local_nvme_gb=7600, gpu_interconnect_gbps=_PCIE4_X16,
        price_usd_per_hour=16.288, price_date=dt.date(2026, 9, 24), price_source=_PRICE_G5,
    ),
    _cpu_type(
        name="c5n.9xlarge", vcpus=36, memory_gib=96, network_gbps=50, efa_cards=1, local_nvme_gb=0,
        price_usd_per_hour=1.944, price_date=dt.date(2026, 11, 21), price_source=_PRICE_C5N,
    ),
    _cpu_type(
        name="c5n.18xlarge", vcpus=72, memory_gib=192, network_gbps=100, efa_cards=1, local_nvme_gb=0,
        price_usd_per_hour=3.888, price_date=dt.date(2026, 11, 21), price_source=_PRICE_C5N,
    ),
    # The Slurm head node's type (infra/head.py). "Up to 10 Gigabit": a burst figure; its baseline is lower.
    _cpu_type(
        name="m5.large", vcpus=2, memory_gib=8, network_gbps=10, efa_cards=0, local_nvme_gb=0,
        price_usd_per_hour=0.096, price_date=dt.date(2026, 9, 24), price_source=_PRICE_M5_LARGE,
    ),
    _cpu_type(
        name="m5.24xlarge", vcpus=96, memory_gib=384, network_gbps=25, efa_cards=0, local_nvme_gb=0,
        price_usd_per_hour=4.608, price_date=dt.date(2026, 9, 24), price_source=_PRICE_M5,
    ),
)
# fmt: on

_CATALOG: dict[str, InstanceType] = {entry.name: entry for entry in _ENTRIES}


def names() -> list[str]:
    """Every instance type the catalog holds, in catalog order."""
    return list(_CATALOG)


def gpu_types() -> list[InstanceType]:
    """The entries with at least one GPU, in catalog order."""
    return [entry for entry in _ENTRIES if entry.gpus > 0]


def get(name: str) -> InstanceType:
    """The catalog entry for ``name``; :class:`UnknownInstanceType` (one line, with the choices) if none."""
    entry = _CATALOG.get(name.strip().lower()) if isinstance(name, str) else None
    if entry is None:
        raise UnknownInstanceType(f"unknown instance type {name!r}; choose one of: {', '.join(names())}")
    return entry
