"""Which node slows a synchronous data-parallel run, and in which phase; which ranks stopped moving, and where.

Every rank records, per step, the time it spent waiting for data, in forward, in backward and in the optimizer's
step (training/progress.py writes them; nothing here adds a collective). In synchronous training every rank leaves a
step together: a fast rank waits for the slow one inside the gradient reduction (Horovod's allreduce completes in
``optimizer.step()``, DDP's in ``backward()``: PyTorch's DDP notes, "Backward Pass"), so a step's length names no
one. What a rank does alone does: the data it waits for and its forward pass involve no other rank. A node is a
straggler when that local time, the median over its ranks, stays above FACTOR x the median of the other nodes in
all but TOLERATED of WINDOW steps in a row; the phase named is the local one (data or forward) that exceeds the
others' most.

FACTOR and WINDOW, measured here (2-core machine, CPU ranks, ResNet-18 at 32 px, batch 8): two healthy ranks' local
times differ by up to 1.70x on a single step (median 1.07x, 90th percentile 1.39x, 18 steps; the reference run of
tests/test_trainer_mpi.py), so one step names no one; but the least ratio over any 8 steps in a row was 1.01x (and
the second least stays near the median, 1.07x: one step in ten exceeds 1.39x). A node
held to 30% of its CPU (`launch local fault node1 --cpu 0.3`, tests/test_slurm_cluster.py) stayed 2.0x over its 8
steps. 1.5x over 8 steps lies between both. On a GPU each rank times its phases by CUDA events (training/progress.py),
so forward is the GPU's time for the forward kernels, where the host's clock would give the time to queue them and
put the GPU's in whichever phase waits for it (on an H200, a forward of about 0.3 s of kernels was recorded as the
optimizer's by the host's clock, as forward by events: tests/test_gpu.py); the factor and the window there are the
CPU's, not yet measured across GPUs.
"""

from __future__ import annotations

import json
import shlex
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

FACTOR = 1.5
WINDOW = 8
TOLERATED = 1  # steps of the window that may fall under FACTOR (see find)
FIELDS = ("step", "start", "data", "forward", "backward", "optimizer")
LOCAL_PHASES = ("data", "forward")


@dataclass(frozen=True)
class StepTime:
    """One rank's step: its number, when it began (seconds since the epoch), and each phase's seconds."""

    step: int
    start: float
    data: float
    forward: float
    backward: float
    optimizer: float

    @property
    def local(self) -> float:
        return self.data + self.forward


@dataclass(frozen=True)
class Straggler:
    node: str
    ranks: tuple[int, ...]
    ratio: float            # its local time over the others' median, the least over the window but TOLERATED
    since_step: int
    phase: str              # data or forward

    def line(self) -> str:
        ranks = ",".join(map(str, self.ranks))
        return (f"straggler: {self.node} (rank {ranks}) is {self.ratio:.1f}x slower than the other nodes in "
                f"{'waiting for data' if self.phase == 'data' else 'forward (compute)'} since step {self.since_step}")


def parse(line: str) -> StepTime | None:
    """A line of a rank's progress file (tab-separated FIELDS); None for a torn or foreign line."""
    parts = line.rstrip("\n").split("\t")
    if len(parts) != len(FIELDS):
        return None
    try:
        step = int(parts[0])
        rest = [float(p) for p in parts[1:]]
    except ValueError:
        return None
    if step < 0 or any(not (v >= 0) for v in rest):
        return None
    return StepTime(step, *rest)


def format_line(t: StepTime) -> str:
    return f"{t.step}\t{t.start:.3f}\t{t.data:.6f}\t{t.forward:.6f}\t{t.backward:.6f}\t{t.optimizer:.6f}\n"


def find(times: Mapping[int, Iterable[StepTime]], nodes: Mapping[int, str], *, factor: float = FACTOR,
         window: int = WINDOW) -> list[Straggler]:
    """The stragglers among the nodes, from each rank's recent steps (``nodes``: rank -> node). Only steps every
    rank has recorded count; fewer than two nodes, or fewer than ``window`` such steps, name no one."""
    by_rank = {r: {t.step: t for t in ts} for r, ts in times.items() if r in nodes}
    if len({nodes[r] for r in by_rank}) < 2:
        return []
    common = sorted(set.intersection(*(set(s) for s in by_rank.values())))[-window:]
    if len(common) < window:
        return []
    node_ranks: dict[str, list[int]] = {}
    for r in sorted(by_rank):
        node_ranks.setdefault(nodes[r], []).append(r)

    def node_phase(node: str, step: int, phase: str) -> float:
        return statistics.median(getattr(by_rank[r][step], phase) for r in node_ranks[node])

    found = []
    for node, ranks in node_ranks.items():
        ratios, excess = [], dict.fromkeys(LOCAL_PHASES, 0.0)
        for step in common:
            mine = node_phase(node, step, "data") + node_phase(node, step, "forward")
            others = statistics.median(node_phase(o, step, "data") + node_phase(o, step, "forward")
                                       for o in node_ranks if o != node)
            ratios.append(mine / others if others > 0 else (float("inf") if mine > 0 else 1.0))
            for phase in LOCAL_PHASES:
                excess[phase] += node_phase(node, step, phase) - statistics.median(
                    node_phase(o, step, phase) for o in node_ranks if o != node)
        # All but one of the window's steps: the one left out is the healthy nodes' own slow step, such as rank 0's
        # checkpoint written in the background (training/ckptwriter.py) beside the steps after an epoch's end,
        # which every window holds when an epoch has fewer steps than WINDOW (measured: the test run's 6 steps an
        # epoch, node1 at 30% CPU, went unnamed in 2 of 3 runs on the least ratio alone).
        held = sorted(ratios)[TOLERATED]
        if held > factor:
            found.append(Straggler(node, tuple(ranks), held, common[0], max(excess, key=excess.__getitem__)))
    return found


@dataclass(frozen=True)
class Stall:
    """Ranks that stopped moving: each rank's last recorded step, grouped."""

    behind: dict[int, int]        # rank -> its last step, for the ranks behind the furthest
    ahead: tuple[int, ...]        # the ranks at the furthest step
    step: int                     # the furthest step any rank recorded


def stall(last: Mapping[int, int | None]) -> Stall:
    """Where each rank stopped (its last recorded step; None: none recorded): the ranks behind are the ones the
    others wait for in the next collective."""
    steps = {r: (-1 if s is None else s) for r, s in last.items()}
    top = max(steps.values(), default=-1)
    return Stall(behind={r: s for r, s in sorted(steps.items()) if s < top},
                 ahead=tuple(r for r, s in sorted(steps.items()) if s == top), step=top)


def ranges(ranks: Iterable[int]) -> str:
    """0,1,2,5,7,8 -> "0-2, 5, 7-8"."""
    out: list[str] = []
    for r in sorted(set(ranks)):
        if out and out[-1].split("-")[-1] == str(r - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{r}"
        else:
            out.append(str(r))
    return ", ".join(out)


RECORD = "stragglers.json"  # in the run directory: launcher/execute/progresswatch.py writes it, `launch jobs` reads it
RECORD_MARK = "@@stragglers@@"


def records_query(outputs: Iterable[str]) -> str:
    """One shell line printing each run directory's straggler record after a mark naming the directory (`launch
    jobs` reads them all in one round trip to the head node, which mounts the shared storage)."""
    return "; ".join(f"echo {shlex.quote(RECORD_MARK + d)}; cat {shlex.quote(d.rstrip('/') + '/' + RECORD)} "
                     f"2>/dev/null" for d in outputs) or "true"


def parse_records(text: str) -> dict[str, list[dict]]:
    """Run directory -> the stragglers its record names, from :func:`records_query`'s output. A record that is
    missing, torn or not this shape names none: the table must not fail over a file on shared storage."""
    found: dict[str, list[dict]] = {}
    for chunk in text.split(RECORD_MARK)[1:]:
        directory, _, body = chunk.partition("\n")
        try:
            named = json.loads(body)["stragglers"]
            found[directory] = [{"node": str(s["node"]), "ranks": [int(r) for r in s["ranks"]],
                                 "ratio": float(s["ratio"]), "since_step": int(s["since_step"]),
                                 "phase": str(s["phase"])} for s in named]
        except (ValueError, KeyError, TypeError):
            continue
    return found


def summary(named: list[dict]) -> str:
    """`launch jobs`' cell: "node2 2.1x data from step 40", comma-separated; "-" for none."""
    return ", ".join(f"{s['node']} {s['ratio']:.1f}x {s['phase']} from step {s['since_step']}" for s in named) or "-"
