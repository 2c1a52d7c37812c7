"""Why a run stopped, from real OpenMPI output recorded on the local cluster (tests/data/mpirun/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.cluster import Node
from launcher.plans import faults

DATA = Path(__file__).parent / "data" / "mpirun"


def nodes(*slots: int) -> list[Node]:
    return [Node(name=f"node{i}", address="127.0.0.1", port=2200 + i, role="worker", slots=s, cpus=8,
                 workdir=f"/w/node{i}") for i, s in enumerate(slots)]


def recorded(name: str) -> list[str]:
    return (DATA / name).read_text().splitlines()


def test_a_lost_node_is_named():
    # node1's sshd session and everything under it killed mid-run (what a reclaimed spot node looks like)
    assert faults.diagnose(recorded("lost-daemon-node1.txt"), nodes(1, 1)) == (
        "node node1 stopped answering: mpirun lost its daemon there (the node, its network or its sshd went "
        "away), so the job was stopped")


def test_a_killed_rank_is_named_with_its_signal_and_sigkill_as_the_oom_killer():
    why = faults.diagnose(recorded("rank1-killed.txt"), nodes(1, 1))
    assert why.startswith("rank 1 on node1 was killed by signal 9 (Killed), so the job was stopped; ")
    assert "out-of-memory killer" in why and "shares this machine" not in why
    local = faults.diagnose(recorded("rank1-killed.txt"), nodes(1, 1), shared_memory_gib=23.5)
    assert local.startswith(why) and "every node of the local cluster shares this machine's 24 GiB" in local
    # Another signal is not memory: no hint.
    other = [ln.replace("signal 9 (Killed)", "signal 11 (Segmentation fault)") for ln in recorded("rank1-killed.txt")]
    assert faults.diagnose(other, nodes(1, 1), shared_memory_gib=23.5) == (
        "rank 1 on node1 was killed by signal 11 (Segmentation fault), so the job was stopped")


def test_a_rank_that_exits_non_zero_is_placed_on_its_node_by_the_hostfile():
    lines = recorded("rank1-exit-3.txt")  # mpirun names no node here: the slot mapping does
    assert faults.diagnose(lines, nodes(1, 1)) == "rank 1 on node1 exited with code 3, so the job was stopped"
    assert faults.diagnose(lines, nodes(8, 8)) == "rank 1 on node0 exited with code 3, so the job was stopped"


def test_a_node_that_no_longer_answers_is_named_even_when_mpirun_does_not():
    lines = ["[node0] Connection to 127.0.0.1 closed by remote host.",
             "[node0] ORTE was unable to reliably start one or more daemons."]
    assert faults.diagnose(lines, nodes(1, 1), {"node1": "cannot run on node1: connection refused"}) == (
        "node node1 (cannot run on node1: connection refused) stopped answering, so the job was stopped")
    assert faults.diagnose(lines, nodes(1, 1), {}) is None


def test_the_trainers_own_verdict_wins_and_silence_is_none():
    lines = ["[node0] epoch 0 step 2", "[node0] error: rank 1: train-000001.tar: unexpected end of data",
             *recorded("rank1-exit-3.txt")]
    assert faults.diagnose(lines, nodes(1, 1)) == "rank 1: train-000001.tar: unexpected end of data"
    assert faults.diagnose(["[node0] epoch 0 step 2 loss 1.2"], nodes(1, 1)) is None


@pytest.mark.parametrize("rank,expected", [(0, "node0"), (7, "node0"), (8, "node1"), (23, "node2")])
def test_rank_node_follows_map_by_slot(rank, expected):
    assert faults.rank_node(rank, nodes(8, 8, 8)) == expected
