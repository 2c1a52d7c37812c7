"""The fault drills' decisions (launcher/plans/faultdrill.py), at their boundaries: which drill the options ask for
and on which node, the CPU quota the kernel is given, the rate tc is given and the bucket that lets a packet through.
The drills themselves, on rehearsal nodes: tests/test_rehearsal_cluster.py."""

from __future__ import annotations

import math

import pytest

from launcher.plans import faultdrill as fd

NODES = ["node0", "node1", "node2"]


def drill(node="node1", *, cpu=None, net=None, freeze=False, clear=False, head="head", rehearsal=True):
    return fd.drill(node, cpu=cpu, net=net, freeze=freeze, clear=clear, workers=NODES, head=head,
                    rehearsal=rehearsal)


@pytest.mark.parametrize("cpu", [0.001, 0.3, 0.999])
def test_a_share_of_the_vcpus_strictly_between_0_and_1_is_a_cpu_drill(cpu):
    assert drill(cpu=cpu) == fd.Drill("node1", "cpu", cpu_fraction=cpu)


@pytest.mark.parametrize("cpu", [0.0, -0.1, 1.0, 2.0, math.nan, math.inf])
def test_no_share_at_or_outside_0_and_1(cpu):
    with pytest.raises(ValueError, match=r"--cpu is the share of its vCPUs the node keeps, above 0 and below 1"):
        drill(cpu=cpu)


def test_exactly_one_drill_and_only_on_a_node_that_trains_of_a_rehearsal_cluster():
    with pytest.raises(ValueError, match=r"exactly one of --cpu FRACTION, --net RATE, --freeze or --clear$"):
        drill()
    with pytest.raises(ValueError, match=r", got --net and --clear$"):
        drill(net="5mbit", clear=True)
    with pytest.raises(ValueError, match=r"^head is the head node; drills are for the nodes that train: node0, "):
        drill("head", freeze=True)
    with pytest.raises(ValueError, match=r"^no node 'node3' in this cluster"):
        drill("node3", freeze=True)
    with pytest.raises(ValueError, match=r"need rehearsal nodes"):
        drill(freeze=True, rehearsal=False)
    assert drill("node2", freeze=True, head=None).kind == "freeze"
    assert drill(clear=True).kind == "clear"


@pytest.mark.parametrize(("text", "bps"), [
    ("8kbit", 8_000), ("5mbit", 5_000_000), ("5MBit", 5_000_000), (" 2.5mbit ", 2_500_000), ("1gbit", 10**9),
    ("100gbit", 100 * 10**9), ("8000bit", 8_000),
])  # fmt: skip
def test_rates_in_tcs_decimal_bit_units(text, bps):
    assert fd.parse_rate(text) == bps


@pytest.mark.parametrize(("text", "said"), [
    ("7999bit", "between 8kbit and 100gbit"), ("100.001gbit", "between"), ("5mbps", "such as 5mbit"),
    ("5", "such as 5mbit"), ("", "such as 5mbit"), ("-5mbit", "such as 5mbit"), ("fast", "such as 5mbit"),
])  # fmt: skip
def test_other_rates_are_refused(text, said):
    with pytest.raises(ValueError, match=said):
        fd.parse_rate(text)


def test_the_cpu_quota_is_the_share_of_every_vcpu_of_the_node_per_10_ms():
    assert fd.cpu_bandwidth(0.3, 1) == (3_000, 10_000)
    assert fd.cpu_bandwidth(0.3, 4) == (12_000, 10_000)
    assert fd.cpu_bandwidth(0.5, 0) == (5_000, 10_000)           # a node that says 0 vCPUs has at least one
    assert fd.cpu_bandwidth(0.1, 1) == (1_000, 10_000)           # the kernel's least quota, 1 ms, in 10 ms ...
    assert fd.cpu_bandwidth(0.099, 1) == (1_000, 10_102)         # ... and below it a longer period keeps the share
    assert fd.cpu_bandwidth(0.001, 1) == (1_000, 1_000_000)      # 0.1% of one vCPU: 1 ms in the longest period, 1 s
    assert fd.cpu_bandwidth(0.0001, 1) == (1_000, 1_000_000)     # the least share the kernel can hold


def test_the_bucket_holds_two_packets_at_low_rates_and_a_ticks_worth_at_high_ones():
    assert fd.tbf_burst_bytes(8_000) == 2 * fd.MTU_BYTES
    # a tick's worth reaches two packets at 2.4 Mbit/s: 3,000 bytes per 10 ms
    assert fd.tbf_burst_bytes(2_400_000) == 3_000
    assert fd.tbf_burst_bytes(2_400_800) == 3_001
    assert fd.tbf_burst_bytes(10**9) == 1_250_000
    assert fd.tbf_args("veth-a", 5_000_000) == ["tc", "qdisc", "replace", "dev", "veth-a", "root", "tbf", "rate",
                                                "5000000bit", "burst", "6250", "latency", "100ms"]
    assert fd.tbf_clear_args("eth0") == ["tc", "qdisc", "del", "dev", "eth0", "root"]


def test_each_drill_says_what_it_did():
    assert drill(cpu=0.3).describe() == "node1's CPU throttled to 30% of its vCPUs"
    assert drill(net="2.5mbit").describe() == "node1's link shaped to 2.5mbit each way"
    assert drill(freeze=True).describe() == "node1's processes frozen"
    assert drill(clear=True).describe() == "node1's faults cleared"
