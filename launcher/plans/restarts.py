"""`launch train --max-restarts N` as pure decisions: is a failed run worth restarting, and what did it lose.

A run is restarted only when a node was lost (it stopped answering, or mpirun lost its daemon there): what a
replacement fixes, as when a spot instance is reclaimed or a GPU dies and the Auto Scaling group launches a new
instance. A failure the trainer named itself (bad data, a bug, out of memory on every rank) happens again on any
node, so it is never retried; nor is a node that fails again at the same point after replacement, as the same
verdict twice in a row says the node is not the cause.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass

_PREFIX = re.compile(r"^\[[^\]]+\] ?")
_STEP = re.compile(r"^epoch (\d+) step (\d+) ")
_STEPS_PER_EPOCH = re.compile(r" (\d+) steps/epoch")
_LOST_DAEMON = re.compile(r"Remote daemon: \[\[\d+,\d+\],\d+\] on node (\S+)")

RECORD_FILE = "restarts.json"  # in the run directory, beside metrics.jsonl: fetched with the record


@dataclass(frozen=True)
class Verdict:
    retry: bool
    lost: tuple[str, ...]       # nodes to replace before the restart
    why: str                    # the run's failure, one line


def strip_prefix(line: str) -> str:
    """A line without the ``[node]`` prefix the launcher's stream gives it."""
    return _PREFIX.sub("", line)


def trainer_error(lines: list[str]) -> bool:
    """Did the trainer (or the reducer tier) name the failure itself (its one `error: ...` line)?"""
    return any(strip_prefix(line).startswith("error: ") for line in lines)


def lost_nodes(lines: list[str], unreachable: dict[str, str], names: list[str]) -> tuple[str, ...]:
    """The nodes that went away: those that no longer answer SSH, and a node mpirun says it lost its daemon on."""
    lost = set(unreachable)
    for line in lines:
        if (m := _LOST_DAEMON.search(_PREFIX.sub("", line))) and m[1] in names:
            lost.add(m[1])
    return tuple(n for n in names if n in lost)


def decide(why: str, lost: tuple[str, ...], *, trainer_error: bool, restarts_done: int, max_restarts: int,
           previous_lost: list[str] | None, progressed: bool) -> Verdict:
    """``previous_lost``: the nodes the last restart replaced (None before the first); ``progressed``: whether this
    attempt printed a training step."""
    if not lost or trainer_error:
        return Verdict(False, lost, f"{why} (not retried: no node was lost, so a new node would fail the same way)")
    if restarts_done >= max_restarts:
        tail = f"after {restarts_done} restart(s), the limit (--max-restarts {max_restarts})" if max_restarts \
            else "--max-restarts is 0"
        return Verdict(False, lost, f"{why} (not retried: {tail})")
    if previous_lost == list(lost) and not progressed:
        return Verdict(False, lost, f"{why} (not retried: {', '.join(lost)} failed again before the run "
                                    f"made progress on the replacement)")
    return Verdict(True, lost, why)


def progress(lines: list[str]) -> tuple[int, int, int] | None:
    """(epoch, step within it, steps per epoch) of the last step the run printed, or None before the first."""
    steps_per_epoch, last = 0, None
    for raw in lines:
        line = _PREFIX.sub("", raw)
        if m := _STEPS_PER_EPOCH.search(line):
            steps_per_epoch = int(m[1])
        if m := _STEP.match(line):
            last = (int(m[1]), int(m[2]))
    if last is None or not steps_per_epoch:
        return None
    return last[0], last[1], steps_per_epoch


def work_lost(at: tuple[int, int, int] | None, newest_checkpoint_epoch: int | None) -> float:
    """Epochs of training a restart repeats: from the end of the newest complete checkpoint's epoch (the resume
    point) to the last step printed. Steps are global within the run (the trainer numbers them across epochs)."""
    if at is None:
        return 0.0
    _, step, per_epoch = at
    done = step / per_epoch
    resumed_from = (newest_checkpoint_epoch + 1) if newest_checkpoint_epoch is not None else 0
    return max(0.0, round(done - resumed_from, 3))


@dataclass(frozen=True)
class Restart:
    attempt: int                # 1 for the first restart
    why: str
    lost: list[str]
    resumed_from_epoch: int     # the epoch the restarted run begins with
    epochs_lost: float
    progress: list[int] | None  # (epoch, step, steps/epoch) when the node was lost


def record(restarts: list[Restart]) -> str:
    return json.dumps({"restarts": len(restarts), "history": [asdict(r) for r in restarts],
                       "epochs_lost": round(sum(r.epochs_lost for r in restarts), 3)}, indent=1) + "\n"


BATCH_HOST_FILE = ".batch-host"  # in the run directory: the node each attempt's step ran on, and its attempt


def unrecorded_loss(history: list[dict], restart: int, batch_host: str | None, newest_checkpoint_epoch: int | None,
                    ) -> Restart | None:
    """The restart an attempt finds missing from the record: its predecessor's step was on the node that was lost,
    so nothing decided or wrote it (Slurm requeued the job itself: JobRequeue=1 and the node's failure). The lost
    node is that step's own batch host; how much work was repeated is unknown (nothing saw the last step)."""
    if restart < 1 or len(history) >= restart:
        return None
    lost = [batch_host] if batch_host else []
    return Restart(attempt=restart, why=f"the job's batch node{' ' + batch_host if batch_host else ''} was lost; "
                                        "Slurm requeued the job",
                   lost=lost, resumed_from_epoch=newest_checkpoint_epoch + 1 if newest_checkpoint_epoch is not None
                   else 0, epochs_lost=0.0, progress=None)
