"""Bad nodes refused before they cost anything: which node of a job's allocation falls short of the bandwidth its
type should have, decided here from what launcher/execute/nodecheck.py measured before the job's first step.

The test is a ring of pairs run at once: node i sends to node i+1 (the last to the first) for up to PAIR_SECONDS or
PAIR_BYTES, over one TCP connection, and the receiver says how many bytes arrived. A node's link carries two pairs,
the one it sends and the one it receives; a node whose own link is slow makes both of its pairs slow, while each of
its neighbours keeps one fast pair. So a node's figure is the FASTER of its two pairs, and a node is named only when
both fall short. One allreduce over the allocation would give one figure for the group and could not name the node.
With two nodes both pairs join the same two nodes: the test says the pair is slow and names neither.

What a pair should reach, one place for it (the doctor's threshold, launcher/doctor/checks.BUSBW_FLOOR_FRACTION, of
what the node's link allows):
- AWS: one TCP flow, which AWS limits below the instance's line rate: "Single-flow (5-tuple) traffic is limited to
  5 Gbps when instances are not in the same cluster placement group" (Amazon EC2 User Guide, "Amazon EC2 instance
  network bandwidth", https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-network-bandwidth.html; 10
  Gbps inside one). The expected figure is the smaller of that and the catalog's network_gbps for the type.
- the local rehearsal nodes: a veth pair has no line rate of its own (the kernel moves the bytes in memory), so the
  figure is this project's: LOCAL_EXPECTED_BPS, one gigabit per second. One Python TCP flow between two rehearsal
  nodes moved 6.8-15.2 Gbit/s (64 MiB in 0.04-0.08 s) on this project's 2-core machine, shared with other users'
  tests, with the three pairs of a 3-node ring at once; a node shaped by a fault drill (launch local fault NODE --net
  5mbit) gave its pairs 4.4-4.7 Mbit/s (tests/test_slurm_cluster.py, ..._shaped_link_...). Half of a gigabit, 500
  Mbit/s, sits 13x below the slowest healthy figure seen and 100x above a shaped node.

Time added to a job's start (the job step's "node check: N s", srun's start on every node included): 0.5-0.6 s on
three healthy rehearsal nodes, 3.2-3.5 s with one shaped (its pairs run the whole PAIR_SECONDS, then drain the send
buffer). On 8 p4d.24xlarge (an estimate, not measured): the eight pairs run at once, each 64 MiB at the 5 Gbps
single-flow limit, 0.11 s, so the time is srun's start on 8 nodes and an interpreter's on each, about 1-2 s; a slow
node bounds it at PAIR_SECONDS plus that, under 5 s.

A node that falls short is drained with REASON_PREFIX and its figures (scontrol(1): "State=DRAIN ... Reason=<reason>"
"Identify the reason the node is in a DOWN, DRAINED, DRAINING, FAILING or FAIL state", SchedMD,
https://slurm.schedmd.com/scontrol.html#OPT_Reason); the prefix is not the health check's (plans/slurm.DRAIN_PREFIX),
so a node that passes its health check does not return itself to service: only a replacement instance does
(plans/slurm.rejoin_commands). When every node falls short the fault is not any one node's (the fabric, the
expectation): nothing is drained and the job goes on, saying so.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from launcher.doctor.checks import BUSBW_FLOOR_FRACTION

PAIR_SECONDS = 2.0                    # each pair sends for at most this long ...
PAIR_BYTES = 64 * 2**20               # ... or this much: 0.1 s at AWS's 5 Gbps single flow
SINGLE_FLOW_BPS = 5e9                 # AWS's single-flow limit outside a cluster placement group (above)
LOCAL_EXPECTED_BPS = 1e9              # the rehearsal nodes' veth: this project's figure (above)
REASON_PREFIX = "scaletrain nodecheck: "
REASON_LIMIT = 200                    # as plans/slurm.REASON_LIMIT: short enough for sinfo -R


@dataclass(frozen=True)
class Pair:
    sender: str
    receiver: str
    bytes: int             # what the receiver counted
    seconds: float         # from the sender's connect to the receiver's count coming back

    @property
    def bps(self) -> float:
        return 8 * self.bytes / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class Expectation:
    expected_bps: float
    what: str              # where the figure comes from, for the reason text

    @property
    def floor_bps(self) -> float:
        return BUSBW_FLOOR_FRACTION * self.expected_bps


@dataclass(frozen=True)
class Short:
    node: str
    measured_bps: float
    expected: Expectation

    def reason(self) -> str:
        text = (f"{REASON_PREFIX}{mbit(self.measured_bps)} to and from its neighbours, below "
                f"{mbit(self.expected.floor_bps)} ({BUSBW_FLOOR_FRACTION:g} of the {mbit(self.expected.expected_bps)} "
                f"{self.expected.what})")
        return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT - 3] + "..."


@dataclass(frozen=True)
class Verdict:
    short: list[Short]     # the nodes to drain
    lines: list[str]       # what the job's step says


def mbit(bps: float) -> str:
    return f"{bps / 1e6:,.1f} Mbit/s" if bps < 1e9 else f"{bps / 1e9:,.2f} Gbit/s"


def ring(hosts: list[str]) -> list[tuple[str, str]]:
    """(sender, receiver) of every pair: each node to the next, the last to the first."""
    if len(hosts) < 2:
        return []
    return [(h, hosts[(i + 1) % len(hosts)]) for i, h in enumerate(hosts)]


def node_kind(health_check_script: str) -> tuple[str | None, str | None]:
    """(backend, instance type) as the node's health check script names them (plans/slurm.health_check_argv writes
    it at boot from the stack's spec): what the node is, known on the node with no launcher attached."""
    try:
        words = shlex.split(health_check_script, comments=True)
    except ValueError:
        return None, None

    def after(flag: str) -> str | None:
        return words[words.index(flag) + 1] if flag in words[:-1] else None
    return after("--backend"), after("--instance-type")


def expectation(backend: str | None, network_gbps: float | None, instance_type: str | None = None
                ) -> Expectation | None:
    """What one pair should reach on this kind of node; None when the node's kind is not known (no check)."""
    if backend == "local":
        return Expectation(LOCAL_EXPECTED_BPS, "a rehearsal node's veth is expected to carry (plans/nodecheck.py)")
    if backend == "aws" and network_gbps:
        line = network_gbps * 1e9
        if line <= SINGLE_FLOW_BPS:
            return Expectation(line, f"{instance_type}'s network allows")
        return Expectation(SINGLE_FLOW_BPS, f"one TCP flow between {instance_type} instances is allowed (AWS)")
    return None


def decide(hosts: list[str], pairs: list[Pair], expected: Expectation) -> Verdict:
    """Which nodes to drain: those whose faster pair (above) falls below the floor. A pair that reported nothing
    (its sender or receiver did not answer) counts as zero."""
    got = {(p.sender, p.receiver): p for p in pairs}
    lines = []
    for s, r in ring(hosts):
        p = got.get((s, r))
        lines.append(f"node check: {s} -> {r}: " + (f"{mbit(p.bps)} ({p.bytes / 2**20:,.1f} MiB in {p.seconds:.2f} s)"
                                                    if p else "no figure"))
        if len(hosts) == 2:
            break  # the second pair joins the same two nodes
    figure = {h: 0.0 for h in hosts}
    for s, r in ring(hosts):
        bps = got[(s, r)].bps if (s, r) in got else 0.0
        for h in (s, r):
            figure[h] = max(figure[h], bps)
    floor = expected.floor_bps
    short = [Short(h, figure[h], expected) for h in hosts if figure[h] < floor]
    if len(hosts) < 3:
        if short:
            lines.append(f"node check: {' and '.join(hosts)} reach {mbit(max(figure.values()))}, below "
                         f"{mbit(floor)}; with two nodes the test cannot say which is slow: neither is drained")
        return Verdict([], lines)
    if len(short) == len(hosts):
        lines.append(f"node check: every node is below {mbit(floor)} (the fastest {mbit(max(figure.values()))}): "
                     f"not one node's fault; none is drained")
        return Verdict([], lines)
    for s in short:
        lines.append(f"node check: {s.node} refused: measured {mbit(s.measured_bps)}, expected "
                     f"{mbit(expected.expected_bps)} (at least {mbit(floor)})")
    if not short:
        lines.append(f"node check: every node at least {mbit(floor)} ({BUSBW_FLOOR_FRACTION:g} of "
                     f"{mbit(expected.expected_bps)})")
    return Verdict(short, lines)
