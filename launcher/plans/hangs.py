"""Where the ranks of a stalled run are, one line per group (issue: "rank 3 on node1: in the loader's next(); ranks
0-2 and 4-7: in allreduce of step 1234"), from each rank's Python stack as `py-spy dump` prints it and each rank's
last recorded step (training/progress.py).

py-spy's dump (https://github.com/benfred/py-spy, "dump"): a ``Process PID: CMDLINE`` line, the Python version,
then per thread ``Thread TID (STATE): "NAME"`` and its frames, innermost first, as ``    FUNCTION (FILE:LINE)``.
The main thread is the one that trains; its innermost frame that names a collective, the loader or the project's
own code says where the rank waits.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from launcher.plans.stragglers import ranges

_PROCESS = re.compile(r"^Process (\d+):")
_THREAD = re.compile(r'^Thread (0x[0-9A-Fa-f]+|\d+) \(([^)]*)\)(?:: "(.*)")?\s*$')
_FRAME = re.compile(r"^\s+(.+?) \((.+?):(\d+)\)\s*$")

# What a frame's function and file say the rank is doing, most telling first.
_KINDS = (
    ("allreduce", re.compile(r"allreduce|all_reduce|synchronize|_wait|wait_all|reduce_scatter|allgather|"
                             r"all_gather|broadcast|barrier")),
    ("the loader's next()", re.compile(r"__next__|_next_data|_get_data|_try_get_data")),
    ("backward", re.compile(r"^backward$|run_backward|_engine_run_backward")),
    ("checkpoint write", re.compile(r"save|checkpoint")),
)


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int

    def short(self) -> str:
        return f"{self.function} ({'/'.join(self.file.split('/')[-2:])}:{self.line})"


def main_thread(dump: str) -> list[Frame]:
    """The main thread's frames, innermost first; [] when the dump holds none (py-spy failed, or no Python). The
    main thread is the one named MainThread or, where py-spy has no name for it, the one whose id is the process's."""
    frames: list[Frame] = []
    pid, main = None, False
    for line in dump.splitlines():
        p = _PROCESS.match(line)
        if p:
            pid = p.group(1)
            continue
        t = _THREAD.match(line)
        if t:
            if main:
                break
            main = t.group(3) == "MainThread" or (t.group(3) is None and t.group(1) == pid)
            continue
        f = _FRAME.match(line)
        if f and main:
            frames.append(Frame(f.group(1), f.group(2), int(f.group(3))))
    return frames


def where(frames: list[Frame]) -> str:
    """What the rank is doing, in words, with the frame that says it."""
    if not frames:
        return "no stack (the node or its ranks did not answer)"
    for kind, pattern in _KINDS:
        for f in frames:
            if pattern.search(f.function):
                return f"in {kind}: {f.short()}"
    return f"in {frames[0].short()}"


@dataclass(frozen=True)
class Rank:
    rank: int
    node: str
    dump: str | None              # py-spy's output; None when it could not be taken
    step: int | None              # its last recorded step
    nccl: str | None = None       # its NCCL flight recorder's newest collective (flightrec.summary), GPU ranks


def summary(ranks: Mapping[int, Rank]) -> list[str]:
    """One line per group of ranks in the same place at the same step, the ranks behind first."""
    groups: dict[tuple[int, str], list[Rank]] = {}
    for r in ranks.values():
        at = where(main_thread(r.dump)) if r.dump is not None else "no stack (the node or its ranks did not answer)"
        if r.nccl:  # ranks at different collectives are in different places, whatever their stacks say
            at = f"{at}; {r.nccl}"
        groups.setdefault((-1 if r.step is None else r.step, at), []).append(r)
    lines = []
    for (step, at), members in sorted(groups.items(), key=lambda kv: (kv[0][0], min(m.rank for m in kv[1]))):
        nodes = sorted({m.node for m in members})
        who = f"rank{'s' if len(members) > 1 else ''} {ranges(m.rank for m in members)} on {', '.join(nodes)}"
        when = "before its first step" if step < 0 else f"after step {step}"
        lines.append(f"{who}: {at}, {when}")
    return lines
