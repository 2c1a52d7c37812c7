"""The cost model against published results: the points its constants were fitted to, and the points they were not.

One list, :data:`POINTS`, feeds docs/model-validation.md
(``python -m launcher.cost.validation > docs/model-validation.md``) and tests/test_model_validation.py, which holds
every reachable row within its tolerance (12% for throughput and bus bandwidth, 4 points for scaling efficiency) and
every unreachable row outside it, with the reason stated. A change to the model that breaks agreement with published
data fails CI; a change that reaches an unreachable point says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from infra.catalog import get
from launcher.cost import workloads
from launcher.cost.inputs import DEFAULT_CONSTANTS, imagenet
from launcher.cost.model import estimate

__all__ = ["POINTS", "Point", "loader_rows", "render", "render_loader"]

DLE = ("https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/Classification/ConvNets/resnet50v1.5/"
       "README.md#training-performance-results")
SEED_000 = "seed 000: AWS ML blog, 2018-07-20, 'Scalable multi-node deep learning training using GPUs in the AWS Cloud'"
SEED_003 = "seed 003: MXNet + Horovod vs parameter servers on 64 V100"
SEED_002 = "seed 002: SageMaker distributed data parallel vs Horovod, EfficientNet on p4d.24xlarge"
SEED_004 = "seed 004: AWS ML blog, 'fastest training times for BERT and Mask R-CNN' (p3dn.24xlarge, EFA)"
DLE_BERT = "https://github.com/NVIDIA/DeepLearningExamples/blob/master/PyTorch/LanguageModeling/BERT/README.md"
DLE_BERT_A100 = DLE_BERT + "#pre-training-nvidia-dgx-a100-8x-a100-80gb"
DLE_BERT_MULTI = DLE_BERT + "#pre-training-nvidia-dgx-a100-8x-a100-80gb-multi-node-scaling"
DLE_BERT_V100 = DLE_BERT + "#pre-training-nvidia-dgx-1-with-32g"
DLE_BERT_1907 = ("https://github.com/NVIDIA/DeepLearningExamples/blob/23a6382cbe8f77c22b0a7b7d263191ee6b947dfa/PyTorch/"
                 "LanguageModeling/BERT/README.md#pre-training-nvidia-dgx-1-with-32g")
NCCL_527 = "https://github.com/NVIDIA/nccl/issues/527"
NCCL_235 = "https://github.com/NVIDIA/nccl/issues/235"
NCCL_TESTS_22 = "https://github.com/NVIDIA/nccl-tests/issues/22"
IMAGENET = imagenet(90)
BERT = workloads.preset("bert-large")  # phase 1: sequence length 128, global batch 65,536
BERT_PHASE2 = BERT.model_copy(update={"global_batch": 32_768})  # sequence length 512: NVIDIA's per-GPU figure below
THROUGHPUT, SEQUENCES, EFFICIENCY, BUSBW = "img/s", "seq/s", "scaling", "busbw GB/s"
TOLERANCE = {THROUGHPUT: 0.12, SEQUENCES: 0.12, BUSBW: 0.12, EFFICIENCY: 0.04}  # relative x3, absolute (points)


@dataclass(frozen=True)
class Point:
    name: str
    source: str
    conditions: str
    kind: str  # THROUGHPUT, EFFICIENCY or BUSBW
    published: float
    model: Callable[[], float]
    fitted: str | None = None  # the constant fitted to this point; None: held out
    unreachable: str | None = None  # why the model's structure cannot reach it; None: it must

    def modelled(self) -> float:
        return self.model()

    def error(self) -> float:
        """Relative for throughput (img/s, seq/s) and bus bandwidth, in points (absolute) for scaling efficiency."""
        got = self.modelled()
        return got - self.published if self.kind == EFFICIENCY else got / self.published - 1

    def within(self) -> bool:
        return abs(self.error()) <= TOLERANCE[self.kind]


def _node(instance: str, per_gpu: float) -> float:
    """One node, its 8 GPUs at ``per_gpu`` each alone: the model's single-node images/s (compute, input, comm)."""
    return estimate(get(instance), 1, IMAGENET, gpu_throughput=per_gpu).images_per_sec


def _node_scaling(instance: str, per_gpu: float) -> float:
    """8 GPUs in one node against 8 x one GPU, as NVIDIA's 'strong scaling' column."""
    return _node(instance, per_gpu) / (8 * per_gpu)


def _efa_busbw(instance: str) -> float:
    """The model's inter-node allreduce bandwidth on EFA (nccl-tests' busbw sense), GB/s."""
    return get(instance).network_bytes_per_sec * DEFAULT_CONSTANTS.network_efficiency_efa / 1e9


def _p3(nodes: int = 8, **kw) -> object:
    return estimate(get("p3.16xlarge"), nodes, IMAGENET, **kw)


def _bert(instance: str, nodes: int, phase2: tuple[float, int] | None = None, **kw) -> float:
    """BERT-large's modelled sequences/s; ``phase2``: NVIDIA's (per-GPU seq/s, batch) at sequence length 512."""
    if phase2:
        kw |= {"gpu_throughput": phase2[0], "batch_per_gpu": phase2[1]}
    return estimate(get(instance), nodes, BERT_PHASE2 if phase2 else BERT, **kw).images_per_sec


def _bert_strong(nodes: int, phase2: tuple[float, int] | None = None) -> float:
    """NVIDIA's 'strong scaling': n nodes' sequences/s over n x one node's (DGX A100 modelled as p4de.24xlarge)."""
    return _bert("p4de.24xlarge", nodes, phase2) / (nodes * _bert("p4de.24xlarge", 1, phase2))


_A100_NETWORK = "model on p4de.24xlarge (A100 80GB; 400 Gbps EFA where the DGX has 8 x 200 Gb InfiniBand)"


POINTS: tuple[Point, ...] = (
    # --- fitted -----------------------------------------------------------------------------------------------
    Point("DGX-1 16GB, 8 x V100, AMP", DLE, "PyTorch ResNet-50 v1.5, batch 256, pytorch-21.03; 1 GPU 1,200 img/s",
          THROUGHPUT, 8322, lambda: _node("p3.16xlarge", 1200), fitted="node_efficiency_8gpu"),
    Point("8 x p3.16xlarge, TensorFlow + Horovod", SEED_000, "64 V100, 25 Gbps TCP, AMP, batch 256", THROUGHPUT,
          41_000, lambda: _p3().images_per_sec, fitted="overlap_fraction, network_efficiency_tcp, V100 figure"),
    Point("8 x p3.16xlarge, TensorFlow + Horovod", SEED_000, "scaling against one node", EFFICIENCY, 0.90,
          lambda: _p3().scaling_efficiency, fitted="overlap_fraction, network_efficiency_tcp"),
    Point("8 x p3.16xlarge + 16 parameter servers, MXNet", SEED_000, "2 servers per worker, 747 img/s per GPU in a "
          "node (the row's own)", THROUGHPUT, 44_000,
          lambda: _p3(strategy="ps", tier_nodes=16, gpu_throughput=747 / 0.867).images_per_sec,
          fitted="ps_server_bytes_per_sec (with seed 003)"),
    Point("8 x p3.16xlarge + 1 parameter server", SEED_003, "one server for 64 V100", EFFICIENCY, 0.38,
          lambda: _p3(strategy="ps", tier_nodes=1).scaling_efficiency, fitted="ps_server_bytes_per_sec"),
    Point("4 x p4d.24xlarge, all_reduce_perf 1 GiB", NCCL_527, "4 EFA (400 Gbps) per node, 32 ranks", BUSBW, 29.6,
          lambda: _efa_busbw("p4d.24xlarge"), fitted="network_efficiency_efa"),
    Point("8 x p4d.24xlarge, TensorFlow + Horovod", SEED_002, "EfficientNet (the model: ResNet-50); SMDDP 97%; the "
          "allreduce hides on 4 EFA, so the 6% is stragglers and negotiation", EFFICIENCY, 0.94,
          lambda: estimate(get("p4d.24xlarge"), 8, IMAGENET).scaling_efficiency, fitted="straggler_cv"),
    Point("DGX-1 32G, 8 x V100 32GB, BERT-large phase 1, AMP", DLE_BERT_V100, "pytorch:21.11, batch 64, 1 GPU 224 "
          "seq/s; model on p3dn.24xlarge", SEQUENCES, 1746, lambda: _bert("p3dn.24xlarge", 1),
          fitted="node_efficiency_8gpu (bert-large's own, launcher.cost.workloads)"),
    # --- held out ---------------------------------------------------------------------------------------------
    Point("DGX A100, 8 x A100 80GB, AMP", DLE, "as above; 1 GPU 2,470 img/s; model on p4d.24xlarge (A100, NVSwitch)",
          THROUGHPUT, 16_621, lambda: _node("p4d.24xlarge", 2470)),
    Point("DGX A100, 8 x A100 80GB, AMP", DLE, "strong scaling 6.72x", EFFICIENCY, 6.72 / 8,
          lambda: _node_scaling("p4d.24xlarge", 2470)),
    Point("DGX-1 32GB, 8 x V100 32GB, AMP", DLE, "1 GPU 1,156 img/s; model on p3dn.24xlarge (V100 32GB)", THROUGHPUT,
          8056, lambda: _node("p3dn.24xlarge", 1156)),
    Point("DGX-1 32GB, 8 x V100 32GB, AMP", DLE, "strong scaling 6.96x", EFFICIENCY, 6.96 / 8,
          lambda: _node_scaling("p3dn.24xlarge", 1156)),
    Point("DGX A100, 8 x A100 80GB, TF32", DLE, "1 GPU 938 img/s", THROUGHPUT, 7248,
          lambda: _node("p4d.24xlarge", 938)),
    Point("DGX-1 16GB, 8 x V100, FP32", DLE, "1 GPU 367 img/s", THROUGHPUT, 2855, lambda: _node("p3.16xlarge", 367)),
    Point("3 x p4d.24xlarge, all_reduce_perf 1 GiB", NCCL_527, "24 ranks", BUSBW, 31.8,
          lambda: _efa_busbw("p4d.24xlarge")),
    Point("8-32 x p3dn.24xlarge, NCCL over 1 EFA", NCCL_235, "100 Gbps; '6-8 GB/s' at 8 to 32 nodes (midpoint)",
          BUSBW, 7.0, lambda: _efa_busbw("p3dn.24xlarge")),
    Point("8 x p3.16xlarge, MXNet + Horovod", SEED_003, "ResNet-50 v1, 45,000 img/s; per GPU the 747 img/s in a node "
          "of seed 000's MXNet row", THROUGHPUT, 45_000,
          lambda: _p3(gpu_throughput=747 / DEFAULT_CONSTANTS.node_efficiency_8gpu).images_per_sec),
    # BERT-large, one node: NVIDIA's 8-GPU figure from its 1-GPU one (node efficiency fitted to DGX-1 32G phase 1)
    Point("DGX A100, 8 x A100 80GB, BERT-large phase 1, AMP", DLE_BERT_A100, "pytorch:21.11, batch 256, 1 GPU 580 "
          "seq/s; model on p4de.24xlarge", SEQUENCES, 4591, lambda: _bert("p4de.24xlarge", 1)),
    Point("DGX A100, 8 x A100 80GB, BERT-large phase 1, AMP", DLE_BERT_A100, "weak scaling 7.91x", EFFICIENCY,
          7.91 / 8, lambda: _bert("p4de.24xlarge", 1) / (8 * 580)),
    Point("DGX A100, 8 x A100 80GB, BERT-large phase 2, AMP", DLE_BERT_A100, "sequence length 512, batch 32, 1 GPU "
          "210 seq/s", SEQUENCES, 1657, lambda: _bert("p4de.24xlarge", 1, (210, 32))),
    Point("DGX-1 32G, 8 x V100 32GB, BERT-large phase 2, AMP", DLE_BERT_V100, "sequence length 512, batch 8, 1 GPU "
          "75 seq/s; model on p3dn.24xlarge", SEQUENCES, 586, lambda: _bert("p3dn.24xlarge", 1, (75, 8))),
    Point("DGX-1 32G, 8 x V100 32GB, BERT-large phase 1, AMP", DLE_BERT_1907, "pytorch:19.07, batch 64, 1 GPU 171.52 "
          "seq/s", SEQUENCES, 1305.6, lambda: _bert("p3dn.24xlarge", 1, gpu_throughput=171.52)),
    # BERT-large across nodes: NVIDIA's multi-node table (accumulation halving as nodes double) and seed 004
    Point("8 x DGX A100, BERT-large phase 1", DLE_BERT_MULTI, f"strong scaling 7.86x, 4 accumulation steps; "
          f"{_A100_NETWORK}", EFFICIENCY, 7.86 / 8, lambda: _bert_strong(8)),
    Point("16 x DGX A100, BERT-large phase 1", DLE_BERT_MULTI, "strong scaling 15.50x, 2 accumulation steps",
          EFFICIENCY, 15.50 / 16, lambda: _bert_strong(16)),
    Point("32 x DGX A100, BERT-large phase 1", DLE_BERT_MULTI, "strong scaling 30.37x, no accumulation", EFFICIENCY,
          30.37 / 32, lambda: _bert_strong(32)),
    Point("32 x DGX A100, BERT-large phase 1", DLE_BERT_MULTI, "256 A100s, batch 256 per GPU", SEQUENCES, 138_294,
          lambda: _bert("p4de.24xlarge", 32)),
    Point("32 x DGX A100, BERT-large phase 2", DLE_BERT_MULTI, "strong scaling 30.13x, sequence length 512",
          EFFICIENCY, 30.13 / 32, lambda: _bert_strong(32, (210, 32))),
    Point("256 x p3dn.24xlarge + C5n, BERT-large", SEED_004, "2,048 V100, TensorFlow, AWS's allreduce through C5 "
          "instances; model: the reducer tier, one c5n.18xlarge per worker", EFFICIENCY, 0.85,
          lambda: estimate(get("p3dn.24xlarge"), 256, BERT, strategy="reducers", tier_nodes=256).scaling_efficiency),
    # --- out of the structure's reach -------------------------------------------------------------------------
    Point("DGX A100, 8 x A100 80GB, TF32", DLE, "strong scaling 7.72x", EFFICIENCY, 7.72 / 8,
          lambda: _node_scaling("p4d.24xlarge", 938),
          unreachable="one node efficiency for every precision: NVIDIA's longer TF32/FP32 steps lose 3-4% where AMP's "
                      "short ones lose 13-16%; the fixed per-step costs are not itemised"),
    Point("DGX-1 16GB, 8 x V100, FP32", DLE, "strong scaling 7.76x", EFFICIENCY, 7.76 / 8,
          lambda: _node_scaling("p3.16xlarge", 367), unreachable="as the TF32 row: one node efficiency for every "
                                                                "precision"),
    Point("2 x p4d.24xlarge, all_reduce_perf 1 GiB", NCCL_527, "16 ranks", BUSBW, 57.2,
          lambda: _efa_busbw("p4d.24xlarge"),
          unreachable=f"NCCL's tree algorithm on 2 nodes reports busbw above the links' rate ({NCCL_TESTS_22}); the "
                      "model is a ring"),
)


def _fmt(kind: str, value: float) -> str:
    if kind == EFFICIENCY:
        return f"{value:.1%}"
    return f"{value:,.1f}" if kind == BUSBW else f"{value:,.0f}"


def render() -> str:
    """docs/model-validation.md."""
    lines = [
        "# The cost model against published results",
        "",
        "Generated by `.venv/bin/python -m launcher.cost.validation > docs/model-validation.md` from",
        "`launcher/cost/validation.py`; `tests/test_model_validation.py` holds every reachable row within its",
        "tolerance (12% for images/s, sequences/s and bus bandwidth, 4 points for scaling efficiency) and checks",
        "this file is current. Errors: relative for img/s, seq/s and busbw, in points for scaling.",
        "",
    ]
    sections = (("Points the constants were fitted to", lambda p: p.fitted is not None),
                ("Held-out points (no constant was fitted to them)", lambda p: p.fitted is None and not p.unreachable),
                ("Points the model's structure cannot reach", lambda p: p.unreachable is not None))
    for title, keep in sections:
        lines += [f"## {title}", "", "| point | source | conditions | measure | published | model | error | note |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for p in filter(keep, POINTS):
            err = p.error()
            error = f"{err * 100:+.1f} pts" if p.kind == EFFICIENCY else f"{err:+.1%}"
            note = f"fitted: {p.fitted}" if p.fitted else (f"why: {p.unreachable}" if p.unreachable else
                                                          ("within" if p.within() else "OUTSIDE") + " tolerance")
            lines.append(f"| {p.name} | {p.source} | {p.conditions} | {p.kind} | {_fmt(p.kind, p.published)} | "
                         f"{_fmt(p.kind, p.modelled())} | {error} | {note} |")
        lines.append("")
    return "\n".join(lines)


def loader_rows(old_workers: int = 2) -> list[tuple[str, int, int, float, float, float, float, str, str]]:
    """Per GPU type of the catalog, one node: (type, vCPUs, loader processes per GPU, input capacity on full-size and
    on --resize 256 shards, the GPUs' modelled demand, the capacity the old 2 workers per GPU had on full-size, and
    where each decodes: cpu or gpu, launcher.plans.loading.decode_path)."""
    from infra.catalog import gpu_types
    from launcher.plans import loading

    c = DEFAULT_CONSTANTS
    rows = []
    for t in gpu_types():
        full = estimate(t, 1, IMAGENET)
        resized = estimate(t, 1, IMAGENET, resized_shards=True)
        old = loading.decode_capacity(t.vcpus, old_workers * t.gpus, c.loader_img_per_sec_per_core, c.smt_gain)
        rows.append((t.name, t.vcpus, full.loader_workers_per_rank, full.loader_images_per_sec,
                     resized.loader_images_per_sec, full.gpu_demand_images_per_sec, old, full.decode, resized.decode))
    return rows


def render_loader() -> str:
    """The loader-capacity table of docs/benchmarks.md."""
    from launcher.plans import loading

    c = DEFAULT_CONSTANTS
    lines = ["| type | vCPUs | loader processes per GPU | capacity, full-size (img/s) | capacity, --resize 256 | "
             "GPU demand (img/s) | full-size / demand | resized / demand | decode (full-size, resized) | "
             "before: 2 per GPU / demand |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, vcpus, workers, full, resized, demand, old, full_decode, resized_decode in loader_rows():
        lines.append(f"| {name} | {vcpus} | {workers} | {full:,.0f} | {resized:,.0f} | {demand:,.0f} | "
                     f"{full / demand:.2f}x | {resized / demand:.2f}x | {full_decode}, {resized_decode} | "
                     f"{old / demand:.2f}x |")
    lines.append(f"\nPer-core rates: {c.loader_img_per_sec_per_core:g} img/s full-size, "
                 f"{c.loader_img_per_sec_per_core_resized:g} resized (bench/loader.py); one loader process per "
                 f"physical core of a GPU's share (the old 2 per GPU: a second on a core's other hyperthread adds "
                 f"{c.smt_gain:.0%} of a core). GPU decode (nvJPEG) where the CPUs give less than "
                 f"{loading.GPU_DECODE_SHARE:.0%} of the demand and the GPU's decoder was measured (H100, H200).")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    import sys

    print(render_loader() if sys.argv[1:] == ["--loader"] else render(), end="")
