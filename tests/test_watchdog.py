"""When the launcher gives up on a running job: the watchdog's decisions, on an injected clock."""

from __future__ import annotations

from launcher.plans.watchdog import Probe, Watch, unanswered, verdict

POLICY = Watch(interval_s=15, misses=3, stall_s=1800)


def rounds(*answers: dict[str, bool], every: float = 15.0) -> list[Probe]:
    """One round of probes per mapping, `every` seconds apart from t=0."""
    return [Probe(node, i * every, ok) for i, a in enumerate(answers) for node, ok in a.items()]


def test_healthy_nodes_and_steady_output_let_the_job_go_on():
    history = rounds(*[{"node0": True, "node1": True}] * 10)
    assert verdict(history, last_output_at=140, now=150, policy=POLICY) is None
    assert verdict([], last_output_at=0, now=5, policy=POLICY) is None


def test_a_node_that_misses_every_probe_allowed_is_named_as_hung():
    history = rounds({"node0": True, "node1": True}, *[{"node0": True, "node1": False}] * 3)
    assert verdict(history, last_output_at=40, now=45, policy=POLICY) == (
        "node node1 stopped answering (no reply to 3 probes over 30 s; it may be hung)")


def test_one_miss_fewer_than_allowed_is_not_enough():
    history = rounds({"node0": True, "node1": True}, *[{"node0": True, "node1": False}] * 2)
    assert verdict(history, last_output_at=30, now=30, policy=POLICY) is None


def test_a_node_that_answers_again_starts_its_count_from_zero():
    flaky = [{"node0": True, "node1": False}] * 2
    history = rounds(*flaky, {"node0": True, "node1": True}, *flaky)
    assert unanswered(history) == {"node0": [], "node1": [Probe("node1", 45, False), Probe("node1", 60, False)]}
    assert verdict(history, last_output_at=60, now=60, policy=POLICY) is None
    history += [Probe("node1", 75, False)]
    assert "node node1 stopped answering (no reply to 3 probes" in verdict(history, 75, 75, POLICY)


def test_every_hung_node_is_named_in_probe_order():
    history = rounds(*[{"node0": True, "node2": False, "reducer0": False}] * 4)
    assert verdict(history, last_output_at=0, now=60, policy=POLICY) == (
        "nodes node2, reducer0 stopped answering (no reply to 4 probes over 60 s; they may be hung)")


def test_no_output_for_the_stall_limit_stops_the_job_though_every_node_answers():
    history = rounds(*[{"node0": True, "node1": True}] * 3)
    assert verdict(history, last_output_at=100, now=1899, policy=POLICY) is None
    assert verdict(history, last_output_at=100, now=1900, policy=POLICY) == (
        "no output from the job for 1800 s; a rank may be stuck in a collective")


def test_a_stall_limit_of_zero_turns_the_silence_check_off():
    assert verdict([], last_output_at=0, now=10**6, policy=Watch(stall_s=0)) is None


def test_a_hung_node_is_the_reason_given_when_output_has_stopped_too():
    history = rounds(*[{"node0": True, "node1": False}] * 3)
    assert verdict(history, last_output_at=0, now=5000, policy=POLICY).startswith("node node1 stopped answering")
