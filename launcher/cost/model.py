"""A pure performance and cost model for data-parallel training (ResNet-50, BERT-large, Mask R-CNN, a custom model;
launcher.cost.workloads) on catalog instances.

One step on every GPU: compute ``batch_per_gpu`` samples (``accumulation_steps`` times where the recipe accumulates
gradients), then reduce the gradients across the cluster. Only the communication that backward cannot hide is added
to the step, and across nodes what a synchronous step costs beyond it (:func:`sync_overhead`: the slowest node, one
negotiation). Three ways to reduce (``strategy``):

- ``horovod``: hierarchical ring allreduce, what NCCL and Horovod do on multi-GPU nodes. A ring inside each node
  over the GPU interconnect, then a ring across nodes over the instance network (EFA or TCP), each costing
  ``2(m-1)/m * bytes / bandwidth + alpha * 2(m-1)`` for a ring of ``m``. Each node sends (and receives)
  ``2(n-1)/n`` times the gradient per step.
- ``reducers``: the C5n reducer tier of seed 004. Each worker node sends the gradient once and receives the sum
  once, split over the reducers; a reducer's link carries ``workers / reducers`` gradients each way and its CPUs
  sum them. Sending and receiving are pipelined, so the slowest of the three (worker link, reducer link, reducer
  CPUs) sets the time, plus two hops. With reducer links as fast as the workers', reducers beyond the worker count
  gain nothing: the workers' own links are then the limit.
- ``ps``: MXNet-style parameter servers (seed 003), CPU instances at a given count. The same bytes per worker as
  the reducer tier, but over ps-lite's TCP and store-and-forward: a key is pulled only after every worker pushed it
  and the server summed it and ran the update, so worker link, server link and server work add up instead of
  overlapping. That is why seed 003 needed two servers per worker to match Horovod.

Around the steps: a CPU ceiling (the data loader's images/s per vCPU times the node's vCPUs), a checkpoint at every
epoch end, a final validation pass, and the run's fixed costs (provisioning the instances, staging the data set
from S3). Everything is a function of catalog entries, counts, a :class:`Workload`, :class:`PriceQuote` s and the
constants in :class:`ModelConstants`, where every assumption and fit is written down.

Calibration and the published points held out from it: docs/model-validation.md (launcher.cost.validation), which
the tests keep current and within tolerance.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field

from infra.catalog import InstanceType, get, nodes_allowed
from launcher.cost.inputs import (
    DEFAULT_CONSTANTS,
    DEFAULT_TIER_TYPE,
    STRATEGIES,
    STRATEGY_LABELS,
    GpuThroughput,
    ModelConstants,
    Precision,
    Strategy,
    Workload,
    resolve_gpu_throughput,
)
from launcher.cost.prices import PriceQuote, catalog_quote
from launcher.cost.shape import BatchTooLarge, OutOfRange, default_tier_nodes, finite, steps_per_epoch, tier_noun
from launcher.plans import loading

__all__ = ["BatchTooLarge", "Estimate", "OutOfRange", "compare", "default_tier_nodes", "estimate", "model_notes",
           "node_efficiency", "steps_per_epoch", "sync_overhead", "tier_noun"]

# A multi-node shape is network-bound when at least this share of each step waits on communication (seed 000's
# 8 x p3.16xlarge on 25 Gbps TCP: 4.8%, the rest of its 10% the slowest node's; 8 x p4d.24xlarge on EFA: none).
NETWORK_BOUND_SHARE = 0.04


class Estimate(BaseModel):
    """The model's answer for one cluster shape."""

    model_config = ConfigDict(frozen=True)

    instance_type: str
    nodes: int
    gpus_per_node: int
    total_gpus: int
    strategy: Strategy
    tier_type: str | None = Field(description="instance type of the reducers or parameter servers; None for horovod")
    tier_nodes: int
    batch_per_gpu: int = Field(description="samples per GPU per micro-batch (one forward and backward)")
    workload: str = Field("resnet50", description="resnet50, bert-large, mask-rcnn or custom")
    rate_unit: str = Field("img/s", description="img/s, seq/s or samples/s: the unit of images_per_sec")
    accumulation_steps: int = Field(1, description="micro-batches per gradient sync (the recipe's global batch)")
    gpu_images_per_sec: float = Field(
        description="per-GPU throughput used: catalog, measured or override, divided by flops_ratio"
    )
    node_efficiency: float = Field(description="one node's GPUs together, against gpus x the single-GPU figure")
    throughput_source: str
    compute_time_s: float
    intra_node_comm_s: float
    inter_node_comm_s: float
    comm_time_s: float = Field(description="whole gradient reduction per step, before overlap")
    exposed_comm_time_s: float = Field(description="the part of comm_time_s backward could not hide")
    sync_overhead_s: float = Field(0.0, description="per step across nodes: stragglers (the slowest node sets the "
                                                    "pace) and negotiation; 0 on one node")
    comm_limited_by: str = Field(description="the link or processor that sets inter_node_comm_s")
    network_bytes_per_node: float = Field(description="bytes each worker node sends (and receives) per step")
    step_time_s: float = Field(description="one optimizer step: its micro-batches, exposed communication, sync")
    images_per_sec: float = Field(description="samples/s in rate_unit (images, or sequences for bert-large)")
    scaling_efficiency: float
    bottleneck: str = Field(description="GPU compute, communication, or data loading (CPU or GPU decode)")
    bound: str = Field(description="input-bound, network-bound or compute-bound, for people")
    advice: str = Field(description="one sentence: why the shape is bound where it is, and what would change it")
    loader_workers_per_rank: int = Field(description="loader processes per GPU rank (launcher.plans.loading)")
    decode: str = Field("cpu", description="where training JPEGs are decoded: cpu (loader processes) or gpu (nvJPEG)")
    loader_images_per_sec: float = Field(description="what the whole cluster's loader processes decode")
    gpu_demand_images_per_sec: float = Field(description="what the GPUs and network would take with no input limit")
    resized_shards: bool
    epoch_time_s: float = Field(description="one epoch's steps plus its checkpoint")
    checkpoint_s: float = Field(description="per epoch")
    validation_s: float
    training_s: float = Field(description="all epochs with their checkpoints, and the final validation")
    provisioning_s: float
    staging_s: float
    time_to_train_s: float = Field(description="provisioning + staging + training: the billed wall time")
    market: str
    price_usd_per_hour: float = Field(description="one worker node")
    price_date: dt.date
    price_source: str
    tier_price_usd_per_hour: float | None
    tier_price_date: dt.date | None
    cluster_usd_per_hour: float
    cost_usd: float
    cost_per_epoch_usd: float
    assumptions: list[str]

    @property
    def shape(self) -> str:
        """'8 x p3.16xlarge' or '8 x p3.16xlarge + 16 x m5.24xlarge parameter servers'."""
        base = f"{self.nodes} x {self.instance_type}"
        if self.tier_type:
            base += f" + {self.tier_nodes} x {self.tier_type} {tier_noun(self.strategy)}s"
        return base

    @property
    def limited_by(self) -> str:
        """What a step waits on, for a table: 'GPU compute', or how much of it waits on which link."""
        if self.bottleneck.startswith("data loading") or self.exposed_comm_time_s <= 0:
            return self.bottleneck
        return f"{self.exposed_comm_time_s / self.step_time_s:.0%} of each step waits on {self.comm_limited_by}"

    def summary(self) -> str:
        """One line: '8 x p3.16xlarge (Horovod ring allreduce, on-demand): 41,417 img/s (91% scaling), ...'."""
        return (
            f"{self.shape} ({STRATEGY_LABELS[self.strategy]}, {self.market}): "
            f"{self.images_per_sec:,.0f} {self.rate_unit} ({self.scaling_efficiency:.0%} scaling), "
            f"{self.time_to_train_s / 60:,.0f} min, ${self.cost_usd:,.0f} "
            f"(${self.cluster_usd_per_hour:,.2f}/h, prices as of {self.price_date})"
        )


def model_notes(c: ModelConstants = DEFAULT_CONSTANTS) -> list[str]:
    """The model's assumptions as sentences, for a report that covers many shapes."""
    return [
        "per-GPU ResNet-50 throughput: the catalog's published mixed-precision figure per GPU model (with its "
        "source), replaced by this project's measurement when one is recorded, or by --gpu-throughput",
        f"Horovod: hierarchical ring allreduce; intra-node at {c.interconnect_efficiency:.0%} of one direction of "
        f"the GPU interconnect; inter-node at {c.network_efficiency_tcp:.0%} of line rate over TCP "
        f"({c.network_latency_tcp_s * 1e6:g} us per hop) or {c.network_efficiency_efa:.0%} over EFA "
        f"({c.network_latency_efa_s * 1e6:g} us per hop)",
        f"reducer tier: each worker node sends and receives the gradient once; the slowest of worker link, reducer "
        f"link, reducer CPUs ({c.reducer_sum_bytes_per_sec_per_vcpu / 1e9:g} GB/s per vCPU) and the staging through "
        f"host memory sets the time; gloo over TCP, as the reducer engine runs, EFA or not",
        f"parameter servers: store-and-forward over TCP, so worker link + server link + server work "
        f"({c.ps_server_bytes_per_sec / 1e9:g} GB/s per server, fitted to seed 003's 38% with one server)",
        f"backward is {c.backward_share:.2f} of a step's compute; communication hides behind at most "
        f"{c.overlap_fraction:.0%} of it (fitted to seed 000's 90%)",
        f"one node of 8 GPUs at {c.node_efficiency_8gpu:.1%} of 8 x one GPU (NVIDIA DeepLearningExamples, DGX-1)",
        f"across nodes each step also waits for the slowest node ({c.straggler_cv:.1%} variation per micro-batch, "
        f"sigma x sqrt(2 ln nodes), fitted to seed 002's 94%) and one negotiation ({c.negotiation_s * 1e3:g} ms)",
        f"data loading: all but one vCPU of each GPU rank's share decode, {c.loader_img_per_sec_per_core:g} images/s "
        f"per core on full-size shards, {c.loader_img_per_sec_per_core_resized:g} on --resize 256 shards "
        f"(bench/loader.py)",
        f"fixed costs: {c.provisioning_s:g} s provisioning; the data set staged from S3 at {c.s3_efficiency:.0%} of "
        f"min(line rate, {c.s3_max_gbps:g} Gbps) per node; a checkpoint (weights + momentum) every epoch at "
        f"{c.checkpoint_write_bytes_per_sec / 2**20:g} MiB/s; one validation pass at 1/(1 - backward share) of the "
        f"training rate",
    ]


def _ring_time(nbytes: float, members: int, bytes_per_sec: float, alpha_s: float) -> float:
    """Ring allreduce of ``nbytes`` over ``members``: 2(m-1)/m of the data on the wire, 2(m-1) hops."""
    if members <= 1:
        return 0.0
    return 2 * (members - 1) / members * nbytes / bytes_per_sec + alpha_s * 2 * (members - 1)


def node_efficiency(gpus: int, c: ModelConstants = DEFAULT_CONSTANTS, eight: float | None = None) -> float:
    """One node's GPUs together against gpus x one: NVIDIA's 8-GPU figure (``eight``, the workload's when it has
    one, else ResNet-50's in ``c``), the loss in proportion to gpus - 1."""
    eight = c.node_efficiency_8gpu if eight is None else eight
    return 1 - (1 - eight) * max(0, gpus - 1) / 7


def sync_overhead(nodes: int, micro_s: float, accumulation: int, c: ModelConstants = DEFAULT_CONSTANTS) -> float:
    """What a step across ``nodes`` costs beyond exposed communication (ModelConstants.straggler_cv, negotiation_s).

    Stragglers: each node's time between syncs (``accumulation`` micro-batches of ``micro_s``) varies with
    coefficient of variation ``straggler_cv`` per micro-batch, adding in quadrature over the micro-batches; the step
    waits for the slowest of ``nodes``, about sigma * sqrt(2 ln n) above the mean. Plus one negotiation per sync.
    0 on one node, whose ranks' spread NVIDIA's single-node figure already holds.
    """
    if nodes <= 1:
        return 0.0
    sigma = c.straggler_cv * micro_s * math.sqrt(accumulation)
    return sigma * math.sqrt(2 * math.log(nodes)) + c.negotiation_s


def _verdict(instance: InstanceType, nodes: int, strategy: str, bottleneck: str, exposed_s: float, step_s: float,
             limited_by: str, plan: loading.LoaderPlan, loader_ceiling: float, demand: float, resized: bool,
             c: ModelConstants, *, grad_fp16: bool) -> tuple[str, str]:
    """('input-bound' | 'network-bound' | 'compute-bound', what makes it so and what would change it)."""
    if bottleneck.startswith("data loading"):
        fixes = [f"more loader processes than the {plan.workers_per_rank} per GPU {instance.vcpus} vCPUs allow (a "
                 f"type with more vCPUs per GPU)"]
        if not resized:
            fixes.insert(0, f"shards converted with `launch data convert --resize 256` (the loader decodes "
                            f"{c.loader_img_per_sec_per_core_resized / c.loader_img_per_sec_per_core:.1f}x as many "
                            f"per core)")
        return "input-bound", (f"input-bound: the loader decodes {loader_ceiling:,.0f} img/s of the {demand:,.0f} the "
                               f"GPUs would take; what would change it: {' or '.join(fixes)}")
    share = exposed_s / step_s
    if nodes > 1 and share >= NETWORK_BOUND_SHARE:
        fixes = []
        if "TCP" in limited_by and strategy == "horovod":
            fixes.append("an EFA type (p4d.24xlarge: 4 EFA, 400 Gbps; p5.48xlarge: 32, 3,200 Gbps)")
        elif "EFA" in limited_by:
            fixes.append("a type with more EFA network cards")
        if "reducer" in limited_by or "server" in limited_by:
            fixes.append("more reducer or server nodes")
        if strategy == "horovod":  # seed 004: each node sends the gradient once through the tier, not 2(n-1)/n times
            fixes.append("the reducer tier (--reducers N --reducer-type c5n.18xlarge)")
        if not grad_fp16:
            fixes.append("--fp16-allreduce (half the bytes)")
        return "network-bound", (f"network-bound: {share:.0%} of each step waits on {limited_by}; what would "
                                 f"change it: {' or '.join(fixes) or 'fewer, larger nodes'}")
    return "compute-bound", ("compute-bound: the GPUs set the pace (input and network keep up); what would change "
                             "it: faster GPUs, or more of them")


def _fabric(efa: bool, c: ModelConstants) -> tuple[float, float, str]:
    if efa:
        return c.network_efficiency_efa, c.network_latency_efa_s, "EFA"
    return c.network_efficiency_tcp, c.network_latency_tcp_s, "TCP"


def estimate(
    instance: InstanceType,
    nodes: int,
    workload: Workload,
    *,
    strategy: str = "horovod",
    tier: InstanceType | None = None,
    tier_nodes: int | None = None,
    gpu_throughput: float | None = None,
    precision: Precision = "amp",
    measured: Mapping[str, GpuThroughput] | None = None,
    batch_per_gpu: int | None = None,
    price: PriceQuote | None = None,
    tier_price: PriceQuote | None = None,
    constants: ModelConstants = DEFAULT_CONSTANTS,
    resized_shards: bool = False,
) -> Estimate:
    """Throughput, time and cost of training ``workload`` on ``nodes`` x ``instance`` with ``strategy``.

    ``tier``/``tier_nodes``: the reducers' or parameter servers' type and count (defaults: :data:`DEFAULT_TIER_TYPE`,
    :func:`default_tier_nodes`). ``gpu_throughput`` overrides the single-GPU samples/s of the workload (ResNet-50
    images/s before ``flops_ratio``). ``batch_per_gpu`` None: the published figure's batch (ResNet-50: 256).
    ``price``/``tier_price`` default to the catalog's on-demand quotes. Bad arguments raise ``ValueError`` with a
    one-line message.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy '{strategy}'; choose one of: {', '.join(STRATEGIES)}")
    throughput = resolve_gpu_throughput(instance, precision, override=gpu_throughput, measured=measured,
                                        workload=workload.name)
    if nodes < 1:
        raise ValueError(f"nodes must be at least 1, got {nodes}")
    batch_per_gpu = (throughput.batch_per_gpu or 256) if batch_per_gpu is None else batch_per_gpu
    if batch_per_gpu < 1:
        raise ValueError(f"batch_per_gpu must be at least 1, got {batch_per_gpu}")
    if strategy == "horovod":
        if tier is not None or tier_nodes:
            raise ValueError("the horovod strategy has no reducer or server nodes; use --strategy reducers or ps")
        tier_nodes = 0
    else:
        tier = tier or get(DEFAULT_TIER_TYPE[strategy])
        tier_nodes = default_tier_nodes(strategy, nodes) if tier_nodes is None else tier_nodes
        if tier.gpus:
            raise ValueError(f"{STRATEGY_LABELS[strategy]} run on CPU instance types; {tier.name} has GPUs")
        if tier_nodes < 1:
            raise ValueError(f"the {strategy} strategy needs at least 1 {tier_noun(strategy)} node, got {tier_nodes}")
        if problem := nodes_allowed(tier_nodes, tier_noun(strategy)):  # the commands name their options first
            raise ValueError(f"{tier_nodes:,} {tier_noun(strategy)} nodes: {problem}")
    price = price or catalog_quote(instance)
    if price.instance_type != instance.name:
        raise ValueError(f"price is for {price.instance_type}, not {instance.name}")
    if tier is not None:
        tier_price = tier_price or catalog_quote(tier)
        if tier_price.instance_type != tier.name:
            raise ValueError(f"tier price is for {tier_price.instance_type}, not {tier.name}")
        if tier_price.market != price.market:
            raise ValueError(f"workers are priced {price.market} but the tier {tier_price.market}; price both alike")

    c = constants
    per_gpu = throughput.img_per_sec / workload.flops_ratio
    gpus = instance.gpus
    total_gpus = nodes * gpus
    node_eff = node_efficiency(gpus, c, workload.node_efficiency_8gpu)
    # Gradient accumulation (NVIDIA's BERT and Mask R-CNN recipes): micro-batches until the recipe's global batch,
    # then one gradient sync; communication hides only behind the last micro-batch's backward.
    accumulation = max(1, workload.global_batch // (total_gpus * batch_per_gpu)) if workload.global_batch else 1
    micro_s = batch_per_gpu / (per_gpu * node_eff)
    compute_s = accumulation * micro_s
    backward_s = c.backward_share * micro_s
    grad = workload.grad_bytes

    intra_bytes_per_sec = instance.gpu_interconnect_gbps * 1e9 / 2 * c.interconnect_efficiency
    intra_s = _ring_time(grad, gpus, intra_bytes_per_sec, c.interconnect_latency_s)
    worker_bw = instance.network_bytes_per_sec
    if strategy == "horovod":
        eff, alpha, fabric = _fabric(instance.has_efa, c)
        # After the intra-node reduce-scatter each GPU owns 1/gpus of the gradients and rings it across
        # nodes, so the node's network carries 2(n-1)/n of the whole gradient each step.
        inter_s = _ring_time(grad, nodes, worker_bw * eff, alpha)
        per_node_bytes = 2 * (nodes - 1) / nodes * grad
        limited_by = f"worker network ({fabric})" if nodes > 1 else "nothing (one node)"
        comm_note = (f"hierarchical ring allreduce: inter-node ring over {instance.network_gbps:g} Gbps {fabric} at "
                     f"{eff:.0%} of line rate, {alpha * 1e6:g} us per hop")
    else:
        assert tier is not None
        if strategy == "reducers":
            # What runs: training/reducer.py's gloo over TCP (the stack gives reducers beside P4d/P5 no EFA, and
            # gloo has no EFA transport), buckets staged through host memory on the GPU nodes.
            eff, alpha, fabric = _fabric(False, c)
            stages = {
                f"worker links ({fabric})": grad / (worker_bw * eff),
                f"reducer links ({fabric})": nodes * grad / (tier_nodes * tier.network_bytes_per_sec * eff),
                "reducer CPUs": nodes * grad / (tier_nodes * tier.vcpus * c.reducer_sum_bytes_per_sec_per_vcpu),
                "host staging (PCIe)": grad / c.host_staging_bytes_per_sec,
            }
            limited_by = max(stages, key=stages.__getitem__)
            inter_s = stages[limited_by] + 2 * alpha
            comm_note = (f"reducer tier: {tier_nodes} x {tier.name}; gloo over {fabric} at {eff:.0%} (not EFA), each "
                         f"worker node sends and receives the gradient once through host memory "
                         f"({c.host_staging_bytes_per_sec / 1e9:g} GB/s PCIe), pipelined (slowest of worker link, "
                         f"reducer link, reducer CPUs at {c.reducer_sum_bytes_per_sec_per_vcpu / 1e9:g} GB/s per vCPU, "
                         f"staging), 2 hops")
        else:
            eff, alpha, fabric = _fabric(False, c)  # ps-lite speaks TCP (ZMQ), EFA or not
            stages = {
                "worker links (TCP)": grad / (worker_bw * eff),
                "server links (TCP)": nodes * grad / (tier_nodes * tier.network_bytes_per_sec * eff),
                "server work": nodes * grad / (tier_nodes * c.ps_server_bytes_per_sec),
            }
            limited_by = max(stages, key=stages.__getitem__)
            inter_s = sum(stages.values()) + 2 * alpha
            comm_note = (f"parameter servers: {tier_nodes} x {tier.name} for {nodes} workers; push, sum + update "
                         f"({c.ps_server_bytes_per_sec / 1e9:g} GB/s per server) and pull are store-and-forward over "
                         f"TCP at {eff:.0%}, so worker link, server link and server work add")
        per_node_bytes = float(grad)
    comm_s = intra_s + inter_s
    exposed_s = max(0.0, comm_s - c.overlap_fraction * backward_s)

    sync_s = sync_overhead(nodes, micro_s, accumulation, c)
    step_s = compute_s + exposed_s + sync_s
    samples_per_step = total_gpus * batch_per_gpu * accumulation
    plan = loading.for_instance(instance)
    per_core = c.loader_img_per_sec_per_core_resized if resized_shards else c.loader_img_per_sec_per_core
    images_per_sec = demand = samples_per_step / step_s
    # A workload whose loader reads prepared tensors (BERT's pre-tokenized shards) has no JPEG-decoding ceiling.
    decode, node_input = loading.node_input(instance, plan, per_core, c.smt_gain, demand / nodes, resized_shards)
    loader_ceiling = nodes * node_input if workload.decodes_images else demand
    bottleneck = "communication" if exposed_s > compute_s else "GPU compute"
    if images_per_sec > loader_ceiling:
        images_per_sec, step_s = loader_ceiling, samples_per_step / loader_ceiling
        bottleneck = "data loading (CPU)" if decode == "cpu" else "data loading (GPU decode)"
    # Against one node's GPUs (the seeds' and MLPerf's sense): nodes x gpus x per-GPU x the node's own efficiency.
    efficiency = images_per_sec / (total_gpus * per_gpu * node_eff)
    bound, advice = _verdict(instance, nodes, strategy, bottleneck, exposed_s, step_s, limited_by, plan,
                             loader_ceiling, demand, resized_shards, c, grad_fp16=workload.grad_bytes_per_param == 2)

    checkpoint_s = workload.checkpoint_bytes / c.checkpoint_write_bytes_per_sec if workload.checkpoint_every_epoch \
        else 0.0
    eval_rate = total_gpus * per_gpu * node_eff / (1 - c.backward_share)
    validation_s = workload.val_images / (min(eval_rate, loader_ceiling) if workload.decodes_images else eval_rate)
    epoch_s = workload.images_per_epoch / images_per_sec + checkpoint_s
    training_s = workload.epochs * epoch_s + validation_s
    s3_rate = min(worker_bw, c.s3_max_gbps * 1e9 / 8) * c.s3_efficiency
    staging_s = workload.staged_bytes / (nodes * s3_rate)
    time_to_train_s = c.provisioning_s + staging_s + training_s

    tier_hourly = tier_price.usd_per_hour if tier_price is not None and tier is not None else 0.0
    cluster_hourly = nodes * price.usd_per_hour + tier_nodes * tier_hourly

    unit = workload.rate_unit
    assumptions = [
        f"workload {workload.name}: {workload.images_per_epoch:,} {workload.sample_noun} per epoch x "
        f"{workload.epochs} epoch(s)"
        + (f"; global batch {workload.global_batch:,}: {accumulation} micro-batch(es) of {batch_per_gpu} per GPU "
           f"per gradient sync" if workload.global_batch else ""),
        f"per-GPU throughput {throughput.img_per_sec:,.0f} {unit} ({throughput.source.split(':')[0]}) / flops_ratio "
        f"{workload.flops_ratio:g} = {per_gpu:,.0f} {unit} at batch {batch_per_gpu}",
        f"gradients {grad / 1e6:,.1f} MB per step ({workload.param_count:,} params x "
        f"{workload.grad_bytes_per_param} B{', fp16 compression' if workload.grad_bytes_per_param == 2 else ''})",
        f"intra-node ring over {instance.gpu_interconnect_gbps:g} GB/s per GPU (bidirectional), "
        f"{c.interconnect_efficiency:.0%} of one direction",
        comm_note,
        f"backward = {c.backward_share:.2f} of compute; communication hides behind at most "
        f"{c.overlap_fraction:.0%} of the last micro-batch's backward",
        f"one node's {gpus} GPU(s) at {node_eff:.1%} of {gpus} x the single-GPU figure (NVIDIA's 8-GPU result for "
        f"{'ResNet-50' if workload.node_efficiency_8gpu is None else workload.name}: "
        f"{workload.node_efficiency_8gpu or c.node_efficiency_8gpu:.1%})",
        f"across nodes, {sync_s * 1e3:,.1f} ms per step beyond communication: the slowest of {nodes} node(s) at "
        f"{c.straggler_cv:.1%} variation per micro-batch (sigma x sqrt(2 ln n)) and {c.negotiation_s * 1e3:g} ms of "
        f"negotiation (Horovod's cycle time); none on one node",
        (f"data loading: {plan.workers_per_rank} loader processes per GPU rank ({plan.processes_per_node(gpus)} per "
         f"node on {instance.vcpus} vCPUs) at {per_core:g} img/s per core measured by bench/loader.py on "
         f"{'resized' if resized_shards else 'full-size'} shards" + (f", too few: decoded on the GPUs (--decode gpu, "
         f"{loading.GPU_DECODE_SHARE:.0%} of their demand, measured)" if decode == "gpu" else "")
         + f" = {loader_ceiling / nodes:,.0f} img/s per node; "
         if workload.decodes_images else f"data loading: no JPEG-decoding ceiling for {workload.name}'s loader; ")
        + advice,
        f"fixed costs: provisioning {c.provisioning_s:g} s; staging {workload.staged_bytes / 1e9:,.1f} GB from S3 at "
        f"{c.s3_efficiency:.0%} of min(line rate, {c.s3_max_gbps:g} Gbps) per node; a "
        f"{workload.checkpoint_bytes / 1e6:,.0f} MB checkpoint per epoch at "
        f"{c.checkpoint_write_bytes_per_sec / 2**20:g} MiB/s; one validation pass over {workload.val_images:,} "
        f"{workload.sample_noun}",
        f"{price.region} Linux {price.label()} per {instance.name}"
        + (f"; {tier_price.label()} per {tier.name}" if tier is not None and tier_price is not None else ""),
    ]
    if price.market == "spot":
        assumptions.append("spot: no interruption assumed; a reclaimed node costs the time back to the last epoch "
                           "checkpoint (`launch train --resume`) plus re-provisioning, which this figure leaves out")
    return finite(Estimate(  # no inf or nan: shape.finite says which figure and why
        instance_type=instance.name,
        nodes=nodes,
        gpus_per_node=gpus,
        total_gpus=total_gpus,
        strategy=strategy,  # type: ignore[arg-type]
        tier_type=tier.name if tier is not None else None,
        tier_nodes=tier_nodes,
        batch_per_gpu=batch_per_gpu,
        workload=workload.name,
        rate_unit=unit,
        accumulation_steps=accumulation,
        gpu_images_per_sec=per_gpu,
        node_efficiency=node_eff,
        throughput_source=throughput.source,
        compute_time_s=compute_s,
        intra_node_comm_s=intra_s,
        inter_node_comm_s=inter_s,
        comm_time_s=comm_s,
        exposed_comm_time_s=exposed_s,
        sync_overhead_s=sync_s,
        comm_limited_by=limited_by,
        network_bytes_per_node=per_node_bytes,
        step_time_s=step_s,
        images_per_sec=images_per_sec,
        scaling_efficiency=efficiency,
        bottleneck=bottleneck,
        bound=bound,
        advice=advice,
        loader_workers_per_rank=plan.workers_per_rank,
        decode=decode,
        loader_images_per_sec=loader_ceiling,
        gpu_demand_images_per_sec=demand,
        resized_shards=resized_shards,
        epoch_time_s=epoch_s,
        checkpoint_s=checkpoint_s,
        validation_s=validation_s,
        training_s=training_s,
        provisioning_s=c.provisioning_s,
        staging_s=staging_s,
        time_to_train_s=time_to_train_s,
        market=price.market,
        price_usd_per_hour=price.usd_per_hour,
        price_date=price.date,
        price_source=price.source,
        tier_price_usd_per_hour=tier_price.usd_per_hour if tier is not None and tier_price is not None else None,
        tier_price_date=tier_price.date if tier is not None and tier_price is not None else None,
        cluster_usd_per_hour=cluster_hourly,
        cost_usd=cluster_hourly * time_to_train_s / 3600,
        cost_per_epoch_usd=cluster_hourly * epoch_s / 3600,
        assumptions=assumptions,
    ))


def compare(
    instances: list[str],
    nodes: int,
    workload: Workload,
    *,
    batch_per_gpu: int | None = None,
    constants: ModelConstants = DEFAULT_CONSTANTS,
) -> list[Estimate]:
    """One catalog-throughput, on-demand, Horovod estimate per named instance type, in the order given.

    For the "what would this cost on AWS" table after a local run. Unknown names raise
    :class:`infra.catalog.UnknownInstanceType`; CPU-only types raise ``ValueError``.
    """
    return [estimate(get(name), nodes, workload, batch_per_gpu=batch_per_gpu, constants=constants)
            for name in instances]

