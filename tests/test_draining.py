"""--on-straggler's decisions (launcher/plans/draining.py), at their boundaries, without a cluster."""

from __future__ import annotations

import pytest

from launcher.plans import draining, nodecheck, slurm
from launcher.plans.stragglers import Straggler


def named(node: str = "node2", ratio: float = 2.1, phase: str = "forward", since: int = 40) -> Straggler:
    return Straggler(node, (2,), ratio, since, phase)


def decide(found, **kw):
    args = dict(policy="drain", drained=None, nodes=3, restarts_done=0, max_restarts=1) | kw
    return draining.decide(found, **args)


@pytest.mark.parametrize("value", ["warn", "drain"])
def test_the_two_policies_are_accepted(value):
    assert draining.policy_problem(value) is None


@pytest.mark.parametrize("value", ["", "Drain", "drain ", "kill", "warn,drain"])
def test_anything_else_is_one_line_naming_both(value):
    problem = draining.policy_problem(value)
    assert problem == f"--on-straggler must be warn or drain, got {value!r}"


def test_drain_needs_a_restart_to_spend_warn_does_not():
    assert draining.restarts_problem("drain", 1) is None
    assert draining.restarts_problem("drain", 0) == ("--on-straggler drain requeues the job without the straggler, "
                                                     "a restart: it needs --max-restarts 1 or more, got 0")
    assert draining.restarts_problem("warn", 0) is None


def test_drain_on_a_run_without_slurm_is_one_line_warn_is_not():
    assert draining.slurm_problem("warn", "mpirun would run from here") is None
    assert draining.slurm_problem("drain", "mpirun would run from here") == (
        "--on-straggler drain is the job's step's (Slurm drains the node and requeues the job), and mpirun would run "
        "from here; leave it out or use a cluster with a head node (`launch local up --slurm`, or a stack with shared "
        "storage)")


def test_the_reason_says_node_how_much_phase_and_since_when():
    assert draining.reason(named()) == ("scaletrain straggler: node2 2.1x slower than the other nodes in forward "
                                        "(compute) since step 40")
    assert draining.reason(named(phase="data")).endswith("in waiting for data since step 40")


def test_a_reason_too_long_for_sinfo_is_cut_to_the_limit():
    long = named(node="n" * 300)
    assert len(draining.reason(long)) == slurm.REASON_LIMIT and draining.reason(long).endswith("...")
    fits = named(node="n" * (slurm.REASON_LIMIT - len(draining.reason(named(node="")))))
    assert len(draining.reason(fits)) == slurm.REASON_LIMIT and not draining.reason(fits).endswith("...")


def test_warn_names_and_drains_nothing():
    assert decide([named()], policy="warn") == draining.Decision(None, None)


def test_drain_drains_the_named_node_with_its_reason():
    d = decide([named()])
    assert d.drain == named()
    assert d.line == (f"straggler: draining node2 ({draining.reason(named())}); the job requeues without it "
                      f"(restart 1 of 1)")


def test_nothing_named_is_nothing_to_do():
    assert decide([]) == draining.Decision(None, None)


def test_one_drain_per_attempt():
    assert decide([named()], drained="node1") == draining.Decision(None, None)


def test_the_slowest_of_several_is_the_one_drained():
    d = decide([named("node1", 1.8), named("node3", 2.4), named("node5", 1.6)], nodes=8)
    assert d.drain is not None and d.drain.node == "node3"


def test_max_restarts_bounds_the_drains_at_the_boundary():
    assert decide([named()], restarts_done=1, max_restarts=2).drain is not None   # one restart left
    spent = decide([named()], restarts_done=2, max_restarts=2)                    # none left
    assert spent.drain is None
    assert spent.line == ("straggler: node2 not drained: no restart left (--max-restarts 2, 2 done); the run goes on "
                          "with it")
    assert decide([named()], max_restarts=0).drain is None                        # the default: no requeue at all


def test_half_the_nodes_named_is_still_one_nodes_fault_more_is_not():
    assert decide([named("node1")], nodes=2).drain is not None          # 1 of 2: the rule's smallest cluster
    assert decide([named("node1"), named("node2")], nodes=4).drain is not None   # 2 of 4
    many = decide([named("node1"), named("node2"), named("node3")], nodes=5)     # 3 of 5
    assert many.drain is None
    assert many.line == ("straggler: node1, node2, node3 named, 3 of 5 nodes: more than half, so not one node's "
                         "fault; none drained (--on-straggler drain)")


def test_the_wait_for_a_checkpoint_is_the_work_since_the_last_at_the_healthy_pace():
    assert draining.wait_for_checkpoint_s(60.0, 2.0) == 30.0
    assert draining.wait_for_checkpoint_s(60.0, 1.5) == 40.0
    assert draining.wait_for_checkpoint_s(0.0, 2.0) == 0.0       # a checkpoint just written: stop at once
    assert draining.wait_for_checkpoint_s(-5.0, 2.0) == 0.0      # a clock step back: no wait, never negative
    assert draining.wait_for_checkpoint_s(60.0, 1.0) == 60.0     # no slower: the whole time, never longer


def test_only_nodes_drained_with_a_scaletrain_reason_are_replaced():
    records = {
        "node0": {"State": "IDLE", "Reason": ""},
        "node1": {"State": "IDLE+DRAIN", "Reason": draining.reason(named("node1"))},
        "node2": {"State": "IDLE+DRAIN", "Reason": f"{nodecheck.REASON_PREFIX}4.6 Mbit/s to and from ..."},
        "node3": {"State": "IDLE+DRAIN", "Reason": f"{slurm.DRAIN_PREFIX}shared storage: nothing mounted"},
        "node4": {"State": "DRAIN", "Reason": "maintenance by an administrator"},
        "node5": {"State": "DOWN", "Reason": draining.reason(named("node5"))},   # down: the keeper's own case
        "node6": {"State": "IDLE", "Reason": draining.reason(named("node6"))},   # resumed: the reason lingers
        "node7": {"State": "DOWN+DRAIN", "Reason": draining.reason(named("node7"))},  # and not answering
    }
    assert draining.to_replace(records) == ["node1", "node2", "node7"]


def test_an_instance_replaced_once_is_not_replaced_again_before_its_replacement_registers():
    drained = {"State": "IDLE+DRAIN", "Reason": draining.reason(named("node1")),
               "SlurmdStartTime": "2026-11-28T07:00:00"}
    assert draining.to_replace({"node1": drained}, {"node1": "2026-11-28T07:00:00"}) == []     # the same instance
    assert draining.to_replace({"node1": drained}, {"node1": "2026-11-28T06:00:00"}) == ["node1"]  # drained anew
    assert draining.to_replace({"node1": drained}, {"node2": "2026-11-28T07:00:00"}) == ["node1"]


def test_a_drained_aws_node_marks_its_own_instance_unhealthy_past_the_grace_period():
    assert draining.unhealthy_argv("/usr/local/bin/aws", "i-0abc", "us-east-1") == [
        "/usr/local/bin/aws", "autoscaling", "set-instance-health", "--instance-id", "i-0abc", "--health-status",
        "Unhealthy", "--no-should-respect-grace-period", "--region", "us-east-1"]


@pytest.mark.parametrize("state", ["ALLOCATED+DRAIN", "MIXED+DRAIN", "IDLE+COMPLETING+DRAIN"])
def test_a_node_still_running_the_job_that_drained_it_is_not_replaced_yet(state):
    assert draining.to_replace({"node1": {"State": state, "Reason": draining.reason(named("node1"))}}) == []
