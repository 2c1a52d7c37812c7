"""The run's record of restarts (restarts.json in the run directory, launcher/plans/restarts.record's shape) as the
job's step reads and extends it, and the requeue that goes with a new entry: one place for the lost node, the
refused node, the drained straggler and the restart whose step died with its node."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from launcher.files import write_atomic
from launcher.plans import restarts


def history(output: Path) -> list[dict]:
    """The restarts recorded so far; none when the record is missing or unreadable."""
    try:
        return json.loads((output / restarts.RECORD_FILE).read_text()).get("history", [])
    except (OSError, ValueError):
        return []


def append(output: Path, earlier: list[dict], step: restarts.Restart) -> None:
    """The record with `step` after `earlier` (what history() gave), written whole (temporary file, rename)."""
    write_atomic(output / restarts.RECORD_FILE, restarts.record([restarts.Restart(**h) for h in earlier] + [step]))


def requeue(job_id: str, *, pending_ok: bool) -> str | None:
    """Slurm's requeue of the job: scontrol(1) "requeue <job_list>": "Requeue a running, suspended or finished Slurm
    batch job into pending state" (https://slurm.schedmd.com/scontrol.html#OPT_requeue). Why Slurm refused, or
    None; with `pending_ok`, "Job is pending execution" (Slurm requeued it first, for a node it saw fail) is no
    refusal."""
    done = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True)
    if done.returncode == 0 or (pending_ok and "pending" in done.stderr.lower()):
        return None
    return done.stderr.strip()
