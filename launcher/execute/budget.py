"""The budget, carried out (`--max-cost`; launcher/plans/budget.py decides): when a cluster came up, as the launcher
finds it, and the job's step's guard that reckons the spend every few seconds while the run goes on.

At the cap the guard asks a trainer's run to stop by writing training/stopping.STOP_FILE in the run directory:
rank 0 reads it at its next logged step and the ranks agree on it over the logged loss's allreduce, write a checkpoint
after that step and end (a signal would reach the ranks at different steps; see training/stopping.py). A user's
command (`launch run`) is ended at once as a cancel ends it, SIGTERM to mpirun (userrank.py passes it to the command,
which may checkpoint on it). A trainer that has not ended STOP_GRACE_S after the ask is ended that way too.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.cluster import Cluster
from launcher.files import write_atomic
from launcher.plans import budget
from training import stopping

EVERY_S = 2.0
STOP_GRACE_S = 120.0


def _process_started(pid: int) -> float | None:
    """When a process of this machine started (seconds since the epoch), from proc(5): /proc/PID/stat's starttime
    (field 22, clock ticks after boot) and /proc/stat's btime."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        btime = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines()
                     if ln.startswith("btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def came_up(c: Cluster) -> float:
    """When the cluster came up, in seconds since the epoch: on AWS its earliest instance's launch time (EC2
    LaunchTime, the nodes' and the head node's, as discovery recorded them); on a local cluster the start of its
    oldest machine's process (the head node's, or the first node's). Now, when neither can be read."""
    from launcher.cluster.aws import lifecycle

    found = [lifecycle.parse_time(n.launched_at).timestamp() for n in c.machines if n.launched_at]
    if c.backend == "local":
        found += [t for t in map(_process_started, c.processes.values()) if t is not None]
    return min(found, default=time.time())


class Guard:
    """The job's step's reckoning: every ``every_s`` the spend since the cluster came up; once at WARN_FRACTION of the
    cap a warning; at the cap, a trainer's run is asked to stop (training/stopping.STOP_FILE, which its rank 0 reads
    at its next logged step), and :meth:`halt` says to end the run now: at once for a user's command, ``grace_s``
    later for a trainer that has not stopped. Its last reckoning is kept in the run directory (plans/budget
    .STATE_FILE) for `launch status`."""

    def __init__(self, output: Path, say: Callable[[str], None], *, cap: float, usd_per_hour: float,
                 since: float, job: str, trainer: bool, every_s: float | None = None,
                 grace_s: float | None = None) -> None:
        self.output, self.record = output, output / budget.STATE_FILE
        self.say, self.cap, self.rate, self.since, self.job = say, cap, usd_per_hour, since, job
        self.trainer = trainer
        self.every_s = EVERY_S if every_s is None else every_s
        self.grace_s = STOP_GRACE_S if grace_s is None else grace_s
        self.warned = False
        self.stopped_at: float | None = None     # time.monotonic() when the cap was reached
        self.spent = 0.0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="budget-guard")

    def reckon(self) -> budget.Verdict:
        """The spend now, its verdict, and what follows from it (a warning once; at the cap, the ask to stop)."""
        self.spent = budget.spent(self.rate, time.time() - self.since)
        said = budget.verdict(self.spent, self.cap)
        if said != "under" and not self.warned:
            self.warned = True
            self.say(budget.warn_line(self.spent, self.cap, self.rate))
        if said == "cap" and self.stopped_at is None:
            self.stopped_at = time.monotonic()
            why = f"the cluster has cost ${self.spent:,.2f}, --max-cost ${self.cap:,.2f}"
            if self.trainer:
                self.say(f"budget: {why}; asking the run to write a checkpoint and stop")
                write_atomic(self.output / stopping.STOP_FILE, f"budget reached: {why}\n")
            else:
                self.say(f"budget: {why}; ending the command (SIGTERM)")
        with contextlib.suppress(OSError):
            write_atomic(self.record, json.dumps({
                "job": self.job, "cap_usd": self.cap, "spent_usd": round(self.spent, 4), "usd_per_hour": self.rate,
                "since": self.since, "as_of": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "state": "stopped" if self.stopped_at is not None else said}) + "\n")
        return said

    def halt(self) -> str | None:
        """Why the step should end the run now, or None: a user's command at the cap; a trainer ``grace_s`` after it
        was asked and has not stopped."""
        if self.stopped_at is None:
            return None
        if self.trainer and time.monotonic() - self.stopped_at < self.grace_s:
            return None
        return (f"budget: --max-cost ${self.cap:,.2f} reached" if not self.trainer else
                f"budget: the run did not stop within {self.grace_s:g} s of being asked")

    @property
    def reached(self) -> bool:
        return self.stopped_at is not None

    def start(self) -> Guard:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join(timeout=self.every_s + 5)

    def _run(self) -> None:
        while not self._halt.wait(self.every_s):
            with contextlib.suppress(OSError):  # the run's storage hiccuped: reckon again next time
                self.reckon()


def add_options(p: argparse.ArgumentParser) -> None:
    """The job's step's budget options (plans/budget.step_args writes them)."""
    p.add_argument("--max-cost", type=float, default=None, help="stop the run when the cluster has cost this (USD)")
    p.add_argument("--cost-per-hour", type=float, default=0.0, help="the cluster's price per hour (USD)")
    p.add_argument("--cost-since", type=float, default=None, help="when the cluster came up (s since the epoch)")


def begin(a: argparse.Namespace, job_id: str, say: Callable[[str], None]) -> Guard | int | None:
    """Before the run starts: None without --max-cost; the step's exit status when the cap is spent already (the run
    does not start, one line); else the started Guard. A stop asked of an earlier attempt is cleared."""
    output = Path(a.output)
    with contextlib.suppress(OSError):
        (output / stopping.STOP_FILE).unlink(missing_ok=True)
    if a.max_cost is None:
        return None
    guard = Guard(output, say, cap=a.max_cost, usd_per_hour=a.cost_per_hour,
                  since=time.time() if a.cost_since is None else a.cost_since, job=job_id, trainer=not a.no_resume)
    if guard.reckon() == "cap":
        print(budget.not_started_line(guard.spent, guard.cap, guard.rate), flush=True)
        return 1
    return guard.start()


def finish(guard: Guard, output: Path, job_id: str) -> int:
    """The run stopped at its cap: the one line (with the checkpoint --resume continues from), and the step's exit
    status, 1, a failure that is not requeued: the step requeues only what it decides to (`scontrol requeue`), and
    Slurm only a job whose node failed (slurm.conf JobRequeue=1, https://slurm.schedmd.com/slurm.conf.html)."""
    guard.stop()
    teardown = teardown_asked(_job_fields(job_id))
    print(budget.stop_line(guard.spent, guard.cap, guard.rate, newest_checkpoint(output) if guard.trainer else None,
                           teardown), flush=True)
    return 1


def _job_fields(job_id: str) -> dict[str, str]:
    from launcher.plans import slurm

    out = subprocess.run(["scontrol", "--oneliner", "show", "job", job_id], capture_output=True, text=True)
    return slurm.fields(out.stdout.strip().splitlines()[0]) if out.returncode == 0 and out.stdout.strip() else {}


def newest_checkpoint(output: Path) -> str | None:
    """The newest complete checkpoint in the run directory (what --resume continues from), by name, or None."""
    from launcher.execute import results

    try:
        files = [results.RemoteFile(p.name, p.stat().st_size) for p in output.iterdir() if p.is_file()]
    except OSError:
        return None
    index = results.checkpoint_index(files)
    return index[-1]["name"] if index else None


def teardown_asked(fields: dict[str, str]) -> bool:
    """Did the job's submitter ask for --teardown (its comment, plans/slurm.TEARDOWN_COMMENT), from `scontrol show
    job`'s fields?"""
    from launcher.plans import slurm

    return fields.get("Comment") == slurm.TEARDOWN_COMMENT
