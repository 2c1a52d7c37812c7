"""The decisions behind reaching AWS nodes, without AWS: which nodes get the launcher's key over SSM and when, what an
SSM invocation's status means, and when EC2's refusal of the latest console output means "read the buffered one"."""

from __future__ import annotations

import pytest

from launcher.cluster.aws import access


def test_keys_go_to_each_instance_once_and_only_once_its_agent_answers():
    nodes = [("node0", "i-0"), ("node1", "i-1"), ("node2", "i-2"), ("node3", "")]
    # node1's agent has not registered yet: SendCommand would answer InvalidInstanceId for the whole command.
    assert access.key_install_targets(nodes, installed=set(), online={"i-0", "i-2"}) == [("node0", "i-0"),
                                                                                         ("node2", "i-2")]
    # Next round: node1 is online; node0 and node2 already have the keys.
    assert access.key_install_targets(nodes, installed={"i-0", "i-2"}, online={"i-0", "i-1", "i-2"}) == [
        ("node1", "i-1")]
    # node1 replaced by its Auto Scaling group: same name, new instance, which has no key yet.
    assert access.key_install_targets([("node0", "i-0"), ("node1", "i-9")], installed={"i-0", "i-1", "i-2"},
                                      online={"i-0", "i-9"}) == [("node1", "i-9")]


def test_send_command_batches_hold_at_most_50_instances():
    targets = [(f"node{i}", f"i-{i}") for i in range(120)]
    batches = access.key_install_batches(targets)
    assert [len(b) for b in batches] == [50, 50, 20] and sum(batches, []) == targets
    assert access.key_install_batches([]) == []


def test_send_retries_back_off_exponentially_up_to_a_cap():
    assert [access.send_retry_delay(a) for a in range(6)] == [2, 4, 8, 16, 30, 30]


@pytest.mark.parametrize(("status", "outcome"), [
    ("Pending", "pending"), ("InProgress", "pending"), ("Delayed", "pending"), ("Success", "success"),
    ("Failed", "failed"), ("TimedOut", "failed"), ("Cancelled", "failed"), ("Cancelling", "failed")])
def test_invocation_statuses(status, outcome):
    assert access.invocation_outcome(status) == outcome


def test_invocation_error_is_a_few_words_naming_the_node():
    assert access.invocation_error("node1", "i-1", "Failed", "Failed",
                                   "+ install -d\nchown: invalid user: 'ubuntu'\n\n") == (
        "node1 (i-1): Failed: chown: invalid user: 'ubuntu'")
    assert access.invocation_error("node2", "i-2", "TimedOut", "Delivery Timed Out") == (
        "node2 (i-2): TimedOut (Delivery Timed Out)")
    assert "\n" not in access.invocation_error("n", "i", "Failed", "", "x" * 500 + "\n")


def test_only_a_refused_latest_console_falls_back_to_the_buffered_output():
    assert access.refuses_latest_console("UnsupportedOperation", "")
    assert access.refuses_latest_console("InvalidParameterValue", "Latest console output is only supported on Nitro")
    assert not access.refuses_latest_console("InvalidInstanceID.NotFound", "The instance ID 'i-1' does not exist")
    assert not access.refuses_latest_console("UnauthorizedOperation", "You are not authorized")
    assert not access.refuses_latest_console("InvalidParameterValue", "Value (x) for parameter instanceId is invalid")
    notice = access.buffered_console_notice("i-1")
    assert "i-1" in notice and "minutes" in notice and "\n" not in notice
