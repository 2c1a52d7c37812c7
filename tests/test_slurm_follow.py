"""Following a Slurm job's output (`launch logs ID [-f]`, `launch train`) when the head node cannot be reached: a head
node never reached this time is gone, and says so in one line as `launch jobs` does (before, the follower took it for
a dropped connection and retried for 10 minutes); a connection that drops after it was open is retried, the job runs
on. Stand-ins for the SSH connection only: what they answer is what the head node's shell prints."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.execute import slurmjobs

HEAD = Node(name="head", address="10.0.0.9", port=22, role="head", slots=1, cpus=1, workdir="/w")
SCONTROL = ("JobId=7 JobName=r1 JobState={state} ExitCode=0:0 RunTime=00:00:05 StartTime=2026-11-26T10:00:00 "
            "NumNodes=2 Restarts=0 StdOut=/fsx/r1/slurm-7.out WorkDir=/fsx/r1\n@@jobcomp@@\n")


def cluster() -> Cluster:
    node = Node(name="node0", address="10.0.0.10", port=22, role="worker", slots=1, cpus=1, workdir="/w")
    return Cluster(name="c", backend="local", nodes=[node], user="me", ssh_config="/s/ssh_config",
                   known_hosts="/s/known_hosts", python="python", mpirun="/usr/bin/mpirun", head=HEAD)


class Conn:
    """A connection whose commands answer in turn: scontrol's record, then the output file's next bytes."""

    def __init__(self, states: list[str], output: str = "epoch 0\n", drop_after: int | None = None):
        self.states, self.output, self.calls, self.drop_after = states, output, 0, drop_after

    def run(self, command: str, **_):
        self.calls += 1
        if self.drop_after is not None and self.calls > self.drop_after:
            raise OSError("Socket is closed")
        if command.startswith("scontrol"):
            return SimpleNamespace(stdout=SCONTROL.format(state=self.states.pop(0) if len(self.states) > 1
                                                          else self.states[0]))
        out, self.output = self.output, ""
        return SimpleNamespace(stdout=out)

    def close(self):
        pass


def test_a_head_node_not_reached_is_the_lost_head_line_at_once(monkeypatch):
    def refused(c, node):
        raise TimeoutError("timed out")

    monkeypatch.setattr(slurmjobs, "_open", refused)
    monkeypatch.setattr(slurmjobs.time, "sleep", lambda s: pytest.fail("retried a head node it never reached"))
    with pytest.raises(LaunchError) as e:
        slurmjobs.follow(cluster(), "7", write=lambda s: None, until_end=False)
    line = str(e.value)
    assert line.startswith("the head node 'head' does not answer (TimeoutError: timed out)") and "\n" not in line
    assert "`launch train --resume --out DIR`" in line


def test_a_connection_that_drops_after_it_was_open_is_opened_again(monkeypatch):
    opened = [Conn(["RUNNING"], drop_after=2), Conn(["RUNNING", "COMPLETED"], output="epoch 1\n")]
    monkeypatch.setattr(slurmjobs, "_open", lambda c, node: opened.pop(0))
    monkeypatch.setattr(slurmjobs.time, "sleep", lambda s: None)
    said: list[str] = []
    job = slurmjobs.follow(cluster(), "7", write=said.append)
    assert job.state == "succeeded"
    text = "".join(said)
    assert "epoch 0\n" in text and "epoch 1\n" in text
    assert "[launch] lost the connection to head (OSError: Socket is closed); reconnecting" in text
    assert "[launch] reconnected to head" in text
