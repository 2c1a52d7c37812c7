"""Fault drills on a local cluster (`launch local fault NODE --cpu F | --net RATE | --freeze | --clear`): what each
drill does to a rehearsal node, decided here; launcher/local/faults.py only writes the cgroup files and runs tc.

- ``--cpu F``: the node's processes get F of the CPU time its vCPUs would give them, by CFS bandwidth control: a
  quota of F x cpus x period per period (the kernel's scheduler/sched-bwc.rst: "cpu.cfs_quota_us: the total
  available run-time within a period"; "The minimum quota allowed for the quota or period is 1ms. There is also an
  upper bound on the period length of 1s"). The period is 10 ms, not the default 100 ms: a quota is a burst the node
  may spend at once, and at 100 ms a node held to 30% of one vCPU ran 30 ms unthrottled in every 100, so a step of
  tens of milliseconds (the tests' tiny models) mostly fit in it and the node was barely slower (the straggler test
  at 4 images a rank: 1.3x to 2x where 3.3x was asked). A share too small for 1 ms a period lengthens the period.
- ``--net RATE``: both directions of the node's link shaped by a token bucket filter (tc-tbf(8)) on each end of its
  veth: the bucket must hold at least one packet at the interface's MTU, or nothing passes, and at least a rate's
  worth of one timer tick ("burst ... must be at least rate / HZ"; 10 ms covers HZ >= 100).
- ``--freeze``: every process of the node stopped where it is by the cgroup v2 freezer (the kernel's
  admin-guide/cgroup-v2.rst, "cgroup.freeze": writing 1 freezes the cgroup and all its descendants), as a hung
  instance would be: it answers nothing, and its memory and sockets stay.
- ``--clear``: all of that undone.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

CPU_PERIOD_US = 10_000       # see --cpu above: the burst a throttled node may spend at once
CPU_QUOTA_MIN_US = 1_000     # sched-bwc.rst: "The minimum quota allowed for the quota or period is 1ms"
CPU_PERIOD_MAX_US = 1_000_000  # sched-bwc.rst: "an upper bound on the period length of 1s"
MTU_BYTES = 1500             # the rehearsal veths' MTU (iproute2's default for a veth pair)
TICK_S = 0.01                # a timer tick at HZ=100, the lowest the kernel's config offers
TBF_LATENCY_MS = 100         # how long a packet may wait in the bucket before it is dropped
RATE_MIN_BPS = 8_000         # below 1 kB/s not even SSH's banner crosses within a probe's timeout
RATE_MAX_BPS = 100_000_000_000
_UNITS = {"bit": 1, "kbit": 1_000, "mbit": 1_000_000, "gbit": 1_000_000_000}   # tc(8)'s decimal rate units
KINDS = ("cpu", "net", "freeze")


@dataclass(frozen=True)
class Drill:
    node: str
    kind: str                # cpu, net, freeze, or clear
    cpu_fraction: float | None = None
    rate_bps: int | None = None

    def describe(self) -> str:
        if self.kind == "cpu":
            return f"{self.node}'s CPU throttled to {self.cpu_fraction:.0%} of its vCPUs"
        if self.kind == "net":
            return f"{self.node}'s link shaped to {rate_text(self.rate_bps or 0)} each way"
        if self.kind == "freeze":
            return f"{self.node}'s processes frozen"
        return f"{self.node}'s faults cleared"


def rate_text(bps: int) -> str:
    for unit, size in (("gbit", 10**9), ("mbit", 10**6), ("kbit", 10**3)):
        if bps >= size:
            return f"{bps / size:g}{unit}"
    return f"{bps}bit"


def parse_rate(text: str) -> int:
    """A tc rate in bits per second: NUMBER followed by bit, kbit, mbit or gbit (tc(8)'s units)."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(bit|kbit|mbit|gbit)\s*", text.lower())
    if not m:
        raise ValueError(f"--net takes a rate such as 5mbit (NUMBER then bit, kbit, mbit or gbit), got {text!r}")
    bps = int(float(m.group(1)) * _UNITS[m.group(2)])
    if not RATE_MIN_BPS <= bps <= RATE_MAX_BPS:
        raise ValueError(f"--net must be between {rate_text(RATE_MIN_BPS)} and {rate_text(RATE_MAX_BPS)}, "
                         f"got {text.strip()}")
    return bps


def drill(node: str, *, cpu: float | None, net: str | None, freeze: bool, clear: bool, workers: list[str],
          head: str | None, rehearsal: bool) -> Drill:
    """The one drill the options ask for, on a node that can take it; ValueError with the one line otherwise."""
    chosen = [name for name, on in (("--cpu", cpu is not None), ("--net", net is not None), ("--freeze", freeze),
                                    ("--clear", clear)) if on]
    if len(chosen) != 1:
        raise ValueError("launch local fault takes exactly one of --cpu FRACTION, --net RATE, --freeze or --clear"
                         + (f", got {' and '.join(chosen)}" if chosen else ""))
    if not rehearsal:
        raise ValueError("fault drills need rehearsal nodes (their own cgroups and links); this cluster's nodes are "
                         "sshd processes on 127.0.0.1 (--loopback)")
    if head is not None and node == head:
        raise ValueError(f"{node} is the head node; drills are for the nodes that train: {', '.join(workers)}")
    if node not in workers:
        raise ValueError(f"no node {node!r} in this cluster; its nodes that train are {', '.join(workers)}")
    if cpu is not None:
        if not (math.isfinite(cpu) and 0 < cpu < 1):
            raise ValueError(f"--cpu is the share of its vCPUs the node keeps, above 0 and below 1 (0.3: 30%), "
                             f"got {cpu:g}")
        return Drill(node, "cpu", cpu_fraction=cpu)
    if net is not None:
        return Drill(node, "net", rate_bps=parse_rate(net))
    return Drill(node, "freeze" if freeze else "clear")


def cpu_bandwidth(fraction: float, cpus: int) -> tuple[int, int]:
    """(cpu.cfs_quota_us, cpu.cfs_period_us) for a node of `cpus` vCPUs kept to `fraction` of them: CPU_PERIOD_US,
    lengthened (up to the kernel's 1 s) where the share of it would be under the kernel's least quota of 1 ms."""
    share = fraction * max(cpus, 1)
    period = min(CPU_PERIOD_MAX_US, max(CPU_PERIOD_US, math.ceil(CPU_QUOTA_MIN_US / share)))
    return max(CPU_QUOTA_MIN_US, round(share * period)), period


def tbf_burst_bytes(rate_bps: int) -> int:
    """The bucket: a tick's worth at the rate, and never less than two packets at the MTU."""
    return max(2 * MTU_BYTES, math.ceil(rate_bps / 8 * TICK_S))


def tbf_args(device: str, rate_bps: int) -> list[str]:
    """`tc qdisc replace dev DEVICE root tbf ...`: the same on the host's end and on the node's eth0."""
    return ["tc", "qdisc", "replace", "dev", device, "root", "tbf", "rate", f"{rate_bps}bit",
            "burst", str(tbf_burst_bytes(rate_bps)), "latency", f"{TBF_LATENCY_MS}ms"]


def tbf_clear_args(device: str) -> list[str]:
    return ["tc", "qdisc", "del", "dev", device, "root"]
