"""The cost model: seed 000 reproduced, sane scaling, one case checked by hand."""

from __future__ import annotations

import pytest

from infra.catalog import UnknownInstanceType, get, gpu_types
from launcher.costmodel import (
    IMAGENET_TRAIN_IMAGES,
    ModelConstants,
    Workload,
    compare,
    estimate,
)

IMAGENET_90 = Workload(images_per_epoch=IMAGENET_TRAIN_IMAGES, epochs=90)


# --- Seed 000: 8 x p3.16xlarge, TensorFlow + Horovod: ~41k img/s, 90% scaling, ~50 min --------------


def test_seed_000_throughput_within_10_percent():
    result = estimate(get("p3.16xlarge"), 8, IMAGENET_90)
    assert result.images_per_sec == pytest.approx(41_000, rel=0.10)


def test_seed_000_scaling_efficiency_within_5_points():
    result = estimate(get("p3.16xlarge"), 8, IMAGENET_90)
    assert abs(result.scaling_efficiency - 0.90) <= 0.05


def test_seed_000_time_to_train_within_15_percent():
    result = estimate(get("p3.16xlarge"), 8, IMAGENET_90)
    assert result.time_to_train_s / 60 == pytest.approx(50, rel=0.15)


def test_seed_000_is_communication_bound_not_special_cased():
    # 25 Gbps without EFA: the exposed allreduce is what costs the ~10%; on one node there is none of it.
    eight = estimate(get("p3.16xlarge"), 8, IMAGENET_90)
    one = estimate(get("p3.16xlarge"), 1, IMAGENET_90)
    assert eight.exposed_comm_time_s > 0.02
    assert one.exposed_comm_time_s == 0
    assert one.scaling_efficiency == pytest.approx(1.0)


# --- Behaviour a user would notice -------------------------------------------------------------------


@pytest.mark.parametrize("instance", gpu_types(), ids=lambda t: t.name)
def test_more_nodes_never_lower_total_throughput(instance):
    previous = 0.0
    for nodes in [*range(1, 33), 48, 64, 128, 256]:
        result = estimate(instance, nodes, IMAGENET_90)
        assert result.images_per_sec >= previous, nodes
        assert 0 < result.scaling_efficiency <= 1 + 1e-12
        previous = result.images_per_sec


def test_p4d_is_faster_per_node_than_p3_16xlarge():
    for nodes in (1, 8):
        p4d = estimate(get("p4d.24xlarge"), nodes, IMAGENET_90)
        p3 = estimate(get("p3.16xlarge"), nodes, IMAGENET_90)
        assert p4d.images_per_sec / nodes > 2 * p3.images_per_sec / nodes
        assert p4d.time_to_train_s < p3.time_to_train_s


def test_efa_scales_better_than_tcp_on_the_same_gpus():
    p3dn = estimate(get("p3dn.24xlarge"), 8, IMAGENET_90)
    p3 = estimate(get("p3.16xlarge"), 8, IMAGENET_90)
    assert p3dn.scaling_efficiency > p3.scaling_efficiency


def test_flops_ratio_scales_per_gpu_throughput():
    light = Workload(images_per_epoch=50_000, epochs=1, flops_ratio=0.5)
    heavy = Workload(images_per_epoch=50_000, epochs=1, flops_ratio=1.0)
    one_gpu = get("p3.2xlarge")
    assert estimate(one_gpu, 1, light).images_per_sec == pytest.approx(2 * 712)
    assert estimate(one_gpu, 1, heavy).images_per_sec == pytest.approx(712)
    # On a multi-node cluster compute halves; total throughput rises, if by less than 2x.
    a, b = estimate(get("p3.16xlarge"), 8, light), estimate(get("p3.16xlarge"), 8, heavy)
    assert a.compute_time_s == pytest.approx(b.compute_time_s / 2)
    assert b.images_per_sec < a.images_per_sec <= 2 * b.images_per_sec


def test_resnet18_at_32px_example_ratio_is_fast():
    cifar = Workload(images_per_epoch=50_000, epochs=1, flops_ratio=0.0099, param_count=11_689_512)
    result = estimate(get("p3.2xlarge"), 1, cifar)
    assert result.gpu_images_per_sec == pytest.approx(712 / 0.0099)
    # The GPU could do 72k img/s; p3.2xlarge's 8 vCPUs cannot decode that many.
    assert result.images_per_sec == pytest.approx(8 * 250)


def test_gpu_throughput_override_replaces_the_catalog_figure():
    result = estimate(get("p3.16xlarge"), 1, IMAGENET_90, gpu_throughput=1200)
    assert result.gpu_images_per_sec == 1200
    assert result.images_per_sec == pytest.approx(8 * 1200)
    assert any("override" in line for line in result.assumptions)


def test_fp16_gradient_compression_halves_the_bytes_on_the_wire():
    fp32 = estimate(get("p3.16xlarge"), 8, IMAGENET_90)
    fp16 = estimate(get("p3.16xlarge"), 8, IMAGENET_90.model_copy(update={"grad_bytes_per_param": 2}))
    assert fp16.inter_node_comm_s < 0.55 * fp32.inter_node_comm_s
    assert fp16.images_per_sec > fp32.images_per_sec


def test_cost_is_nodes_times_price_times_hours():
    result = estimate(get("p5.48xlarge"), 4, IMAGENET_90)
    assert result.cost_usd == pytest.approx(4 * 55.04 * result.time_to_train_s / 3600)
    assert result.price_usd_per_hour == 55.04
    assert result.price_date == get("p5.48xlarge").price_date


def test_fixed_overhead_is_added_once():
    with_overhead = estimate(get("p4d.24xlarge"), 2, IMAGENET_90)
    without = estimate(get("p4d.24xlarge"), 2, IMAGENET_90, fixed_overhead_s=0)
    assert with_overhead.time_to_train_s - without.time_to_train_s == pytest.approx(600)


@pytest.mark.parametrize("name", ["c5n.18xlarge", "c5n.9xlarge", "m5.24xlarge"])
def test_cpu_only_type_raises_naming_the_instance(name):
    with pytest.raises(ValueError, match=rf"^{name} has no GPUs; training needs a GPU instance type$"):
        estimate(get(name), 2, IMAGENET_90)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"nodes": 0}, "nodes must be at least 1"), ({"batch_per_gpu": 0}, "batch_per_gpu"),
     ({"gpu_throughput": 0.0}, "gpu_throughput"), ({"gpu_throughput": -5.0}, "gpu_throughput")],
)
def test_bad_arguments_raise_value_error(kwargs, match):
    args = {"nodes": 2, **kwargs}
    nodes = args.pop("nodes")
    with pytest.raises(ValueError, match=match):
        estimate(get("p3.16xlarge"), nodes, IMAGENET_90, **args)


def test_compare_keeps_order_and_rejects_bad_names():
    names = ["p5.48xlarge", "p3.16xlarge", "p4d.24xlarge"]
    results = compare(names, 8, IMAGENET_90)
    assert [r.instance_type for r in results] == names
    assert all(r.nodes == 8 for r in results)
    with pytest.raises(UnknownInstanceType):
        compare(["p3.16xlarge", "nope.large"], 8, IMAGENET_90)
    with pytest.raises(ValueError, match="has no GPUs"):
        compare(["c5n.18xlarge"], 8, IMAGENET_90)


def test_estimate_serialises_with_the_fields_the_plan_json_needs():
    data = estimate(get("p3.16xlarge"), 8, IMAGENET_90).model_dump(mode="json")
    for key in ("images_per_sec", "scaling_efficiency", "step_time_s", "comm_time_s", "time_to_train_s",
                "cost_usd", "compute_time_s", "instance_type", "nodes", "price_usd_per_hour", "price_date"):
        assert key in data
    assert data["price_date"] == "2026-09-24"
    assert 3 <= len(data["assumptions"]) <= 10


def test_summary_is_one_line():
    line = estimate(get("p3.16xlarge"), 8, IMAGENET_90).summary()
    assert "\n" not in line
    assert line.startswith("8 x p3.16xlarge: ")


# --- One case by hand ---------------------------------------------------------------------------------


def test_hand_checked_small_case():
    """2 x p3.8xlarge (4 V100 on NVLink 300 GB/s, 10 Gbps TCP), 10M params fp32, 1000 img/s, batch 100.

    compute  = 100 / 1000                                   = 0.1 s;  backward = 2/3 of it
    intra    = 2*3/4 * 40e6 B / (300e9/2 * 0.7 B/s) + 5e-6 * 2*3   = 0.000601 s
    inter    = 2*1/2 * 40e6 B / (10e9/8 * 0.7 B/s)  + 30e-6 * 2*1  = 0.045774 s
    exposed  = 0.046376 - 0.2 * 0.066667                           = 0.033042 s
    step     = 0.133042 s;  images/s = 2*4*100 / step = 6013.1;  efficiency = 6013.1 / 8000 = 0.7516
    time     = 3 * 80,000 / 6013.1 = 39.91 s (no overhead);  cost = 2 * 12.24 * 39.91 / 3600 = $0.2714
    """
    work = Workload(images_per_epoch=80_000, epochs=3, param_count=10_000_000)
    result = estimate(get("p3.8xlarge"), 2, work, gpu_throughput=1000, batch_per_gpu=100, fixed_overhead_s=0)
    assert result.compute_time_s == pytest.approx(0.1)
    assert result.intra_node_comm_s == pytest.approx(2 * 3 / 4 * 40e6 / (300e9 / 2 * 0.7) + 5e-6 * 6)
    assert result.intra_node_comm_s == pytest.approx(0.000601, abs=1e-6)
    assert result.inter_node_comm_s == pytest.approx(40e6 / (10e9 / 8 * 0.7) + 30e-6 * 2)
    assert result.inter_node_comm_s == pytest.approx(0.045774, abs=1e-6)
    assert result.exposed_comm_time_s == pytest.approx(0.033042, abs=1e-6)
    assert result.step_time_s == pytest.approx(0.133042, abs=1e-6)
    assert result.images_per_sec == pytest.approx(6013.1, abs=0.1)
    assert result.scaling_efficiency == pytest.approx(0.7516, abs=1e-4)
    assert result.time_to_train_s == pytest.approx(39.91, abs=0.01)
    assert result.cost_usd == pytest.approx(0.2714, abs=1e-4)


def test_hand_check_uses_the_default_constants():
    # The hand check above spells the defaults out; if they move, it must be redone by hand.
    c = ModelConstants()
    assert (c.network_efficiency_tcp, c.network_latency_tcp_s) == (0.70, 30e-6)
    assert (c.interconnect_efficiency, c.interconnect_latency_s) == (0.70, 5e-6)
    assert (c.backward_share, c.overlap_fraction) == (pytest.approx(2 / 3), 0.20)


def test_cpu_loader_ceiling_binds_for_tiny_models():
    """ResNet-18 at 32 px needs ~1% of ResNet-50's compute: the CPUs, not the GPUs, set the pace."""
    from infra.catalog import get
    from launcher.costmodel import DEFAULT_CONSTANTS, Workload, estimate

    tiny = estimate(get("p4d.24xlarge"), 2, Workload(images_per_epoch=1000, epochs=1, flops_ratio=0.01,
                                                   param_count=11_689_512))
    ceiling = 2 * get("p4d.24xlarge").vcpus * DEFAULT_CONSTANTS.loader_img_per_sec_per_vcpu
    assert tiny.images_per_sec == ceiling and tiny.bottleneck == "data loading (CPU)"
    full = estimate(get("p3.16xlarge"), 8, Workload(images_per_epoch=1_281_167, epochs=90))
    assert full.bottleneck != "data loading (CPU)"
