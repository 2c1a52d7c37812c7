"""Why a run stopped, read from what `mpirun` and the ranks printed: a pure function over the streamed lines.

OpenMPI ends the whole job when a rank dies or a node's daemon goes away; what it prints names the rank or
the node in its own words. The launcher turns that into one line naming the node, so the user knows where to
look (a spot node reclaimed, an out-of-memory kill, a corrupt shard on one rank).
Formats: OpenMPI 4.1's help messages (tests/data/mpirun/ holds real output from the local cluster).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from launcher.cluster import Node

_PREFIX = re.compile(r"^\[[^\]]+\] ?")
_LOST_DAEMON = re.compile(r"Remote daemon: \[\[\d+,\d+\],\d+\] on node (\S+)")
_SIGNAL = re.compile(r"process rank (\d+) with PID \d+ on node (\S+) exited on signal (\d+)(?: \(([^)]+)\))?")
_EXIT_CODE = re.compile(r"Process name: \[\[\d+,\d+\],(\d+)\]\s*\n\s*Exit code:\s*(\d+)")


def rank_node(rank: int, nodes: list[Node]) -> str:
    """The node that runs `rank` under `--map-by slot` with the plan's hostfile: node0's slots first."""
    first = 0
    for n in nodes:
        if rank < first + n.slots:
            return n.name
        first += n.slots
    return f"rank {rank}'s node"


# A rank killed by SIGKILL on a node that still answers: nothing but the kernel's out-of-memory killer sends it
# unasked ("the OOM killer ... sends a SIGKILL", https://www.kernel.org/doc/gorman/html/understand/understand016.html;
# the node's kernel log says "Out of memory: Killed process PID").
_OOM_HINT = ("; a SIGKILL nobody sent is most likely the kernel's out-of-memory killer (the node's `dmesg` says "
             "\"Out of memory: Killed process\"): fewer loader --workers or a smaller --batch-per-gpu")
_SHARED_MEMORY = ("; every node of the local cluster shares this machine's {gib:.0f} GiB, so N ranks with their "
                  "loader workers need N times one rank's memory (64 ranks with 2 workers each exhaust 24 GiB)")


def diagnose(lines: list[str], nodes: list[Node], unreachable: Mapping[str, str] | None = None, *,
             shared_memory_gib: float | None = None) -> str | None:
    """One line saying why the job stopped, or None when nothing names a cause.

    `unreachable`: node -> why SSH to it failed, probed after the job stopped. `shared_memory_gib`: on the local
    cluster, the memory all its nodes share (said when a rank was killed by SIGKILL). mpirun does not always name a
    node that went away (when it sees the ssh session die first, it only says it could not keep its daemons),
    so a node that no longer answers is the best evidence there is.
    """
    bare = [_PREFIX.sub("", ln) for ln in lines]
    text = "\n".join(bare)
    verdicts = [ln[len("error: "):] for ln in bare if ln.startswith("error: ")]
    if verdicts:  # the trainer (or the reducer tier) said what went wrong itself
        return verdicts[-1]
    if unreachable:
        gone = ", ".join(f"{name} ({why})" for name, why in sorted(unreachable.items()))
        return f"node {gone} stopped answering, so the job was stopped"
    if m := _LOST_DAEMON.search(text):
        return (f"node {m[1]} stopped answering: mpirun lost its daemon there (the node, its network or its "
                f"sshd went away), so the job was stopped")
    if m := _SIGNAL.search(text):
        what = f" ({m[4]})" if m[4] else ""
        node = m[2] if any(n.name == m[2] for n in nodes) else rank_node(int(m[1]), nodes)
        why = f"rank {m[1]} on {node} was killed by signal {m[3]}{what}, so the job was stopped"
        if m[3] == "9":
            why += _OOM_HINT + (_SHARED_MEMORY.format(gib=shared_memory_gib) if shared_memory_gib else "")
        return why
    if m := _EXIT_CODE.search(text):
        return f"rank {m[1]} on {rank_node(int(m[1]), nodes)} exited with code {m[2]}, so the job was stopped"
    return None
