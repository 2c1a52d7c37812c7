"""When to give up on a running job: pure decisions over probe results and the time of the job's last output.

mpirun notices a node that dies (its daemon's connection drops) but not one that hangs: a frozen kernel or
sshd, or ranks stuck in a collective, leave every other rank waiting in allreduce for ever. The launcher
probes each node while the job runs and calls `verdict`; the probing, the clock and the stopping live in
launcher/run.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Watch:
    interval_s: float = 15.0    # between rounds of probes (a slow round delays the next)
    misses: int = 4             # probes in a row a node may leave unanswered before the job is stopped
    stall_s: float = 1800.0     # no output from the job for this long stops it; 0: never
    answer_s: float = 10.0      # a probe with no reply within this long is a miss (a frozen sshd never replies)


@dataclass(frozen=True)
class Probe:
    node: str
    at: float           # when it was sent, on the watchdog's clock (s)
    answered: bool


def unanswered(history: Sequence[Probe]) -> dict[str, list[Probe]]:
    """Each node's misses since its last answer, nodes in the order they were first probed."""
    misses: dict[str, list[Probe]] = {}
    for p in history:
        if p.answered:
            misses[p.node] = []
        else:
            misses.setdefault(p.node, []).append(p)
    return misses


def verdict(history: Sequence[Probe], last_output_at: float, now: float, policy: Watch) -> str | None:
    """None to let the job go on, or one line saying why it should be stopped, naming the node(s).

    `history`: every probe so far, oldest first. `last_output_at`: when the job last printed a line (its
    start, before the first one). A node that answers again starts counting its misses from zero.
    """
    hung = {node: ps for node, ps in unanswered(history).items() if len(ps) >= policy.misses}
    if hung:
        names = ", ".join(hung)
        count = min(len(ps) for ps in hung.values())
        since = max(now - min(ps[0].at for ps in hung.values()), 0.0)
        who, may = ("node", "it may") if len(hung) == 1 else ("nodes", "they may")
        return f"{who} {names} stopped answering (no reply to {count} probes over {since:.0f} s; {may} be hung)"
    if policy.stall_s > 0 and now - last_output_at >= policy.stall_s:
        return f"no output from the job for {now - last_output_at:.0f} s; a rank may be stuck in a collective"
    return None
