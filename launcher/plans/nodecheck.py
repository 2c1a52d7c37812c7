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

GPU nodes also run nccl-tests' all_reduce_perf across their own GPUs, each node alone and all at once, before the
ring (gpu_command, decide_gpus): one process drives every GPU of the node (nccl-tests README, "-g,--ngpus <GPUs per
thread>"), one 512 MiB message, its out-of-place bus bandwidth at the largest size as `launch doctor` reads it, and
"-c 1" checks the results. "The bus bandwidth should reflect the speed of the hardware bottleneck: NVLink, PCI,
QPI, or network" (NVIDIA nccl-tests, doc/PERFORMANCE.md): NVLink inside a node. The catalog's per-GPU NVLink figure
is bidirectional, so the most a node's bus bandwidth can be is half of it, one direction's (8 x A100 NVLink3: 300
GB/s), and a node falls short below BUSBW_FLOOR_FRACTION of that, as the doctor judges the network: a GPU whose
NVLink trained down, a GPU off the bus, or NCCL falling back to PCIe through the host (32 GB/s a direction at Gen4)
land far below. What healthy nodes of each type reach is not measured in this project yet; record it when a GPU
cluster runs the check (the job's output says each node's figure). Only NVLink types are judged
(NVLINK_MIN_GBPS): between PCIe GPUs the figure depends on the host's PCIe topology, which the catalog does not
hold (g5.48xlarge), and a one-GPU node has nothing to reduce. It adds an all_reduce_perf start (CUDA contexts on
every GPU, NCCL's init: a few seconds) and 25 messages of 512 MiB (0.1 s at 230 GB/s) to a GPU job's start; not
measured on a GPU cluster yet.

A node that falls short is drained with REASON_PREFIX and its figures (scontrol(1): "State=DRAIN ... Reason=<reason>"
"Identify the reason the node is in a DOWN, DRAINED, DRAINING, FAILING or FAIL state", SchedMD,
https://slurm.schedmd.com/scontrol.html#OPT_Reason); the prefix is not the health check's (plans/slurm.DRAIN_PREFIX),
so a node that passes its health check does not return itself to service: only a replacement instance does
(plans/slurm_rejoin.rejoin_commands). When every node falls short the fault is not any one node's (the fabric, the
expectation): nothing is drained and the job goes on, saying so.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from launcher.doctor.checks import BUSBW_FLOOR_FRACTION
from launcher.plans.slurm import fit_reason

PAIR_SECONDS = 2.0                    # each pair sends for at most this long ...
PAIR_BYTES = 64 * 2**20               # ... or this much: 0.1 s at AWS's 5 Gbps single flow
SINGLE_FLOW_BPS = 5e9                 # AWS's single-flow limit outside a cluster placement group (above)
LOCAL_EXPECTED_BPS = 1e9              # the rehearsal nodes' veth: this project's figure (above)
GPU_BYTES = 512 * 2**20               # all_reduce_perf's one message on GPU nodes (above)
GPU_ITERS, GPU_WARMUP = 20, 5
NVLINK_MIN_GBPS = 300.0               # catalog gpu_interconnect_gbps from which a type's GPUs are NVLink-connected
REASON_PREFIX = "scaletrain nodecheck: "


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
        return fit_reason(f"{REASON_PREFIX}{mbit(self.measured_bps)} to and from its neighbours, below "
                          f"{mbit(self.expected.floor_bps)} ({BUSBW_FLOOR_FRACTION:g} of the "
                          f"{mbit(self.expected.expected_bps)} {self.expected.what})")


@dataclass(frozen=True)
class Verdict:
    short: list         # the nodes to drain (Short, GpuShort)
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


# --- GPU nodes: all_reduce_perf across each node's own GPUs -------------------------------------------------------

@dataclass(frozen=True)
class GpuExpectation:
    expected_gbs: float    # bus bandwidth, GB/s
    gpus: int
    instance_type: str

    @property
    def floor_gbs(self) -> float:
        return BUSBW_FLOOR_FRACTION * self.expected_gbs


@dataclass(frozen=True)
class GpuShort:
    node: str
    measured_gbs: float | None   # None: all_reduce_perf failed or gave no figure
    expected: GpuExpectation
    why: str = ""

    def reason(self) -> str:
        e = self.expected
        got = (f"{self.measured_gbs:.1f} GB/s" if self.measured_gbs is not None
               else f"no figure ({self.why})" if self.why else "no figure")
        return fit_reason(f"{REASON_PREFIX}all_reduce_perf across its {e.gpus} GPUs {got}, below "
                          f"{e.floor_gbs:.0f} GB/s ({BUSBW_FLOOR_FRACTION:g} of {e.instance_type}'s "
                          f"{e.expected_gbs:.0f} GB/s NVLink)")


def gpu_expectation(instance_type: str | None, gpus: int, interconnect_gbps: float) -> GpuExpectation | None:
    """What all_reduce_perf across one node's GPUs should reach (one direction of the catalog's bidirectional
    per-GPU NVLink figure); None for a node with one GPU, or PCIe-connected GPUs (not judged: above)."""
    if not instance_type or gpus < 2 or interconnect_gbps < NVLINK_MIN_GBPS:
        return None
    return GpuExpectation(interconnect_gbps / 2, gpus, instance_type)


def gpu_command(all_reduce_perf: str, gpus: int) -> list[str]:
    """One node's all_reduce_perf over all its GPUs, one process (nccl-tests README: -b/-e sizes, -g GPUs per
    thread, -n iterations, -w warm-up iterations, -c check the results)."""
    return [all_reduce_perf, "-b", str(GPU_BYTES), "-e", str(GPU_BYTES), "-g", str(gpus), "-n", str(GPU_ITERS),
            "-w", str(GPU_WARMUP), "-c", "1"]


def gpu_figure(rc: int, output: str) -> tuple[float | None, str]:
    """(bus bandwidth GB/s at the largest size, why there is none) from one node's all_reduce_perf."""
    import re

    from launcher.doctor.busbw import parse_largest_busbw

    wrong = re.search(r"Out of bounds values\s*:\s*(\d+)", output)
    if wrong and int(wrong.group(1)) != 0:
        return None, f"{wrong.group(1)} wrong values in its results"
    largest = parse_largest_busbw(output)
    if rc != 0 or largest is None:
        last = [ln.strip() for ln in output.splitlines() if ln.strip()][-1:] or [f"exit {rc}"]
        return None, f"all_reduce_perf exit {rc}: {last[0][:80]}"
    return largest[1], ""


def decide_gpus(hosts: list[str], figures: dict[str, tuple[float | None, str]], expected: GpuExpectation
                ) -> Verdict:
    """Which GPU nodes to drain: those below the floor or with no figure. Every node short is not one node's fault
    (the image's NCCL, the expectation): none is drained then, as with the ring. A node that said nothing (its task
    never ran) is not drained either: the ring and the health check judge a node that does not answer."""
    lines, short = [], []
    for h in hosts:
        if h not in figures:
            lines.append(f"node check: {h}: all_reduce_perf across its GPUs said nothing")
            continue
        gbs, why = figures[h]
        lines.append(f"node check: {h}: all_reduce_perf across its {expected.gpus} GPUs "
                     + (f"{gbs:.1f} GB/s" if gbs is not None else f"failed: {why}"))
        if gbs is None or gbs < expected.floor_gbs:
            short.append(GpuShort(h, gbs, expected, why))
    answered = [h for h in hosts if h in figures]
    if answered and all(figures[h][0] is None for h in answered):
        # Not a measurement: the test ran nowhere (the image's build, its launch), which no node's GPUs say.
        lines.append(f"node check: the GPU check could not measure on any node ({figures[answered[0]][1]}): "
                     "nothing measured, none is drained")
        return Verdict([], lines)
    if short and len(short) == len(answered):
        lines.append(f"node check: every node's GPUs are below {expected.floor_gbs:.0f} GB/s: not one node's "
                     "fault; none is drained")
        return Verdict([], lines)
    for s in short:
        lines.append(f"node check: {s.node} refused: {s.reason().removeprefix(REASON_PREFIX)}")
    return Verdict(short, lines)
