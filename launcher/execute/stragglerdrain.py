"""`--on-straggler drain` on the job's step (launcher/plans/draining.py decides): a node the progress watcher
(launcher/execute/progresswatch.py) names is drained with the reason, the run is stopped at its next checkpoint (or
once waiting costs more than it saves), and the job requeued without it, to resume from its newest checkpoint on the
node's replacement. Slurm drains and requeues; the replacement is the Auto Scaling group's (the node's health check
marks its instance Unhealthy, launcher/doctor/health.py) or, on the local cluster, the keeper's.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.execute import restartlog
from launcher.plans import draining, restarts
from launcher.plans.stragglers import Straggler

PROGRESS = "progress"


def set_aside_progress(output: Path, restart: int) -> None:
    """A restarted attempt starts a fresh progress directory: the ranks append to ``rank-R@node.tsv``, and Slurm may
    lay the ranks out on other nodes this time (a replacement registers anew), so the last attempt's files would
    give a rank two nodes. They are kept beside it as ``progress.attempt-N``."""
    here = output / PROGRESS
    if restart and here.is_dir():
        with contextlib.suppress(OSError):
            here.rename(output / f"{PROGRESS}.attempt-{restart}")


def newest_checkpoint(output: Path) -> tuple[str, float] | None:
    """The run directory's newest complete checkpoint (what --resume starts from): its name and when it was
    written."""
    from launcher.execute import results

    try:
        files = {p.name: p for p in output.iterdir() if p.is_file()}
        index = results.checkpoint_index([results.RemoteFile(n, 0) for n in files])
        return (index[-1]["name"], files[index[-1]["name"]].stat().st_mtime) if index else None
    except OSError:
        return None


def newest_epoch(output: Path) -> int | None:
    """The last epoch the newest checkpoint holds whole (as jobstep.newest_checkpoint_epoch)."""
    from launcher.execute import results

    try:
        return results.resumes_after(results.checkpoint_index([results.RemoteFile(p.name, 0)
                                                               for p in output.iterdir() if p.is_file()]))
    except OSError:
        return None


class Drainer:
    """Called with each look's stragglers (progresswatch.Watcher's ``on_found``, its thread); ``halt`` is polled by
    the step's loop (jobstep.run_step) and says when to stop the run."""

    def __init__(self, *, policy: str, output: Path, job_id: str, restart: int, max_restarts: int,
                 checkpoints: bool, say: Callable[[str], None]) -> None:
        self.policy, self.output, self.job_id = policy, output, job_id
        self.restart, self.max_restarts, self.checkpoints, self.say = restart, max_restarts, checkpoints, say
        self.started = time.time()
        self.drained: Straggler | None = None
        self._baseline: str | None = None
        self._stop_by = 0.0
        self._said: set[str] = set()
        self._lock = threading.Lock()

    def on_found(self, found: list[Straggler], nodes: int) -> None:
        with self._lock:
            d = draining.decide(found, policy=self.policy, drained=self.drained.node if self.drained else None,
                                nodes=nodes, restarts_done=self.restart, max_restarts=self.max_restarts)
            if d.line and d.line not in self._said:
                self._said.add(d.line)
                self.say(d.line)
            if d.drain is None:
                return
            # scontrol(1) "State=DRAIN ... Reason=<reason>" (https://slurm.schedmd.com/scontrol.html#OPT_Reason): the
            # job on it runs on (DRAINING); Slurm starts nothing new there.
            done = subprocess.run(["scontrol", "update", f"NodeName={d.drain.node}", "State=DRAIN",
                                   f"Reason={draining.reason(d.drain)}"], capture_output=True, text=True)
            if done.returncode != 0:
                self.say(f"straggler: Slurm would not drain {d.drain.node}: {done.stderr.strip()}; the run goes on")
                self.drained = d.drain  # one try per attempt, as one drain per attempt
                self._stop_by = float("inf")
                return
            self.drained = d.drain
            newest = newest_checkpoint(self.output) if self.checkpoints else None
            self._baseline = newest[0] if newest else None
            since = time.time() - (newest[1] if newest else self.started)
            wait = draining.wait_for_checkpoint_s(since, d.drain.ratio) if self.checkpoints else 0.0
            self._stop_by = time.monotonic() + wait
            self.say(f"straggler: {d.drain.node} drained; stopping the run at its next checkpoint or in {wait:.0f} s "
                     f"({since:.0f} s of work since the newest, {d.drain.ratio:.1f}x slower)" if wait else
                     f"straggler: {d.drain.node} drained; stopping the run now")

    def halt(self) -> str | None:
        """Why the run is to stop now (None: not yet): a drain decided, and a newer checkpoint written or the wait
        over."""
        with self._lock:
            if self.drained is None or self._stop_by == float("inf"):
                return None
            newest = newest_checkpoint(self.output) if self.checkpoints else None
            if newest is not None and newest[0] != self._baseline:
                return f"{self.drained.node} drained as a straggler; stopped after checkpoint {newest[0]}"
            if time.monotonic() >= self._stop_by:
                return f"{self.drained.node} drained as a straggler; stopped"
            return None

    def requeue(self, lines: list[str]) -> int:
        """After the run stopped: the drain recorded as a restart (restarts.json, as a lost node's), the job
        requeued. The step's exit status."""
        assert self.drained is not None
        history = restartlog.history(self.output)
        newest = newest_checkpoint(self.output)
        epoch = newest_epoch(self.output)
        at = restarts.progress(lines)
        step = restarts.Restart(attempt=self.restart + 1, why=draining.reason(self.drained), lost=[self.drained.node],
                                resumed_from_epoch=epoch + 1 if epoch is not None else 0,
                                epochs_lost=restarts.work_lost(at, epoch), progress=list(at) if at else None)
        restartlog.append(self.output, history, step)
        self.say(f"requeueing job {self.job_id} (restart {self.restart + 1} of {self.max_restarts}) without "
                 f"{self.drained.node}; it resumes from {newest[0] if newest else 'the start'} on its replacement")
        # Pending again, to start when the allocation is whole, the drained node's replacement in it.
        if (refused := restartlog.requeue(self.job_id, pending_ok=True)) is not None:
            print(f"error: Slurm would not requeue job {self.job_id}: {refused}", flush=True)
        return 1
