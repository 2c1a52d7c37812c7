"""The node check's decision (launcher/plans/nodecheck.py): which node of a ring of pairs falls short, at the floor's
boundary on both sides; what a node of each kind is expected to reach; the node's kind from its health check."""

from __future__ import annotations

import pytest

from launcher.doctor.checks import BUSBW_FLOOR_FRACTION
from launcher.plans import nodecheck
from launcher.plans.nodecheck import Expectation, Pair

HOSTS = ["node0", "node1", "node2"]
LOCAL = nodecheck.expectation("local", None)
FLOOR = LOCAL.floor_bps


def pair(s: str, r: str, bps: float) -> Pair:
    return Pair(s, r, int(bps), 8.0)   # bytes such that 8 x bytes / 8 s = bps


def ring_with(slow: str | None, slow_bps: float, fast_bps: float = 4e9) -> list[Pair]:
    return [pair(s, r, slow_bps if slow in (s, r) else fast_bps) for s, r in nodecheck.ring(HOSTS)]


def test_the_ring_pairs_each_node_with_the_next_and_the_last_with_the_first():
    assert nodecheck.ring(HOSTS) == [("node0", "node1"), ("node1", "node2"), ("node2", "node0")]
    assert nodecheck.ring(["a"]) == []


def test_the_floor_is_the_doctors_fraction_of_the_expected_figure():
    assert FLOOR == BUSBW_FLOOR_FRACTION * nodecheck.LOCAL_EXPECTED_BPS


def test_a_node_just_below_the_floor_is_refused_with_its_figure_and_the_expected_one():
    v = nodecheck.decide(HOSTS, ring_with("node2", FLOOR - 8), LOCAL)
    assert [s.node for s in v.short] == ["node2"]
    assert v.short[0].measured_bps == pytest.approx(FLOOR - 8)
    assert "node check: node2 refused: measured 500.0 Mbit/s, expected 1.00 Gbit/s (at least 500.0 Mbit/s)" \
        in v.lines
    reason = v.short[0].reason()
    assert reason.startswith(nodecheck.REASON_PREFIX) and "500.0 Mbit/s" in reason and "1.00 Gbit/s" in reason
    assert len(reason) <= nodecheck.REASON_LIMIT


def test_a_node_at_the_floor_passes():
    v = nodecheck.decide(HOSTS, ring_with("node2", FLOOR), LOCAL)
    assert v.short == [] and v.lines[-1].startswith("node check: every node at least")


def test_a_slow_nodes_neighbours_pass_on_their_other_pair():
    v = nodecheck.decide(HOSTS, ring_with("node1", 5e6), LOCAL)
    assert [s.node for s in v.short] == ["node1"]


def test_a_pair_that_reported_nothing_counts_as_zero():
    pairs = [p for p in ring_with(None, 0) if p.sender != "node2"]   # node2's task said nothing
    pairs = [p for p in pairs if p.receiver != "node2"]             # nor did its receiver
    v = nodecheck.decide(HOSTS, pairs, LOCAL)
    assert [s.node for s in v.short] == ["node2"] and "node check: node2 -> node0: no figure" in v.lines


def test_every_node_short_drains_none():
    v = nodecheck.decide(HOSTS, ring_with(None, 0, fast_bps=1e6), LOCAL)
    assert v.short == [] and "not one node's fault" in v.lines[-1]


def test_two_nodes_name_neither():
    v = nodecheck.decide(["a", "b"], [pair("a", "b", 1e6), pair("b", "a", 1e6)], LOCAL)
    assert v.short == [] and "cannot say which" in v.lines[-1]
    assert not nodecheck.decide(["a", "b"], [pair("a", "b", 4e9), pair("b", "a", 4e9)], LOCAL).lines[-1].endswith(
        "drained")


def test_aws_expects_one_flows_limit_or_the_line_rate_when_lower():
    p4d = nodecheck.expectation("aws", 400, "p4d.24xlarge")
    assert p4d.expected_bps == nodecheck.SINGLE_FLOW_BPS and "p4d.24xlarge" in p4d.what
    small = nodecheck.expectation("aws", 2.5, "x.large")
    assert small.expected_bps == 2.5e9
    assert nodecheck.expectation("aws", None) is None and nodecheck.expectation(None, None) is None


def test_the_nodes_kind_from_its_health_check_script():
    script = ("#!/bin/bash\n# Rendered by launcher/plans/slurm.py (health_check_script).\n"
              "exec /opt/scaletrain/venv/bin/python -m launcher.doctor.health --backend aws --python /p "
              "--mpirun /m --instance-type p4d.24xlarge --storage fsx\n")
    assert nodecheck.node_kind(script) == ("aws", "p4d.24xlarge")
    assert nodecheck.node_kind("exec python -m launcher.doctor.health --backend local\n") == ("local", None)
    assert nodecheck.node_kind("exec 'unterminated\n") == (None, None)


def test_pair_figure_in_bits_per_second():
    assert Pair("a", "b", 1_000_000, 2.0).bps == 4e6 and Pair("a", "b", 5, 0).bps == 0.0
    assert Expectation(1e9, "x").floor_bps == BUSBW_FLOOR_FRACTION * 1e9
