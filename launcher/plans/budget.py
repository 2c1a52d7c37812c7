"""A run's budget (`launch train/run --max-cost USD`): what the cluster has cost since it came up, and what that means.

The job's step (launcher/execute/budget.py, on the cluster) adds up, every few seconds, what every instance of the
stack costs per hour, the head node and the shared storage included, times the seconds since the cluster came up;
it warns once at WARN_FRACTION of the cap and, at the cap, has the run write a checkpoint and stop. Everything that
decides is here: the cluster's hourly price (:func:`hourly`, from the one instance catalog's on-demand prices, the
ones the cost model and `launch status` use), the spend (:func:`spent`), the verdict (:func:`verdict`) and the lines
that say them. A local cluster costs what the same shape would on AWS: its workers priced as LOCAL_WORKER_TYPE, its
reducers as the reducer tier's default type, its head node as the stack's, its shared storage as the stack's FSx.
"""

from __future__ import annotations

import json
import math
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from infra import catalog
from infra.spec import FSX_DEFAULT_CAPACITY_GIB, HEAD_INSTANCE_TYPE
from launcher.cluster import Cluster
from launcher.cost.inputs import DEFAULT_TIER_TYPE
from launcher.cost.prices import catalog_quote

WARN_FRACTION = 0.8                 # the "warns at 80%"
# A local cluster's worker nodes are priced as the 8-GPU type the project's runs compare against first (the run
# report's and `launch cost`'s p4d); a test reaches a cap of cents in seconds at its ~$22/h.
LOCAL_WORKER_TYPE = "p4d.24xlarge"
# FSx for Lustre, us-east-1, SCRATCH_2 (the stack's deployment type, infra/storage.py): $0.140 per GB-month
# (https://aws.amazon.com/fsx/lustre/pricing/, "Scratch file systems"); AWS bills storage per GB-month of 730 hours
# (the same page and https://aws.amazon.com/ebs/pricing/: "prorated ... per hour"; 730 = 8,760 h / 12 months).
FSX_SCRATCH_USD_PER_GB_MONTH = 0.140
HOURS_PER_MONTH = 730.0
STATE_FILE = "budget.json"          # the step's last reckoning, in the run directory: `launch status` reads it

__all__ = ["FSX_SCRATCH_USD_PER_GB_MONTH", "HOURS_PER_MONTH", "LOCAL_WORKER_TYPE", "RECORD_MARK", "STATE_FILE",
           "WARN_FRACTION", "Part", "Verdict", "cap_problem", "fsx_usd_per_hour", "hourly", "not_started_line",
           "parse_records", "plan_line", "records_query", "seconds_to_cap", "spent", "state_line", "step_args",
           "stop_line", "total", "verdict", "warn_line"]


@dataclass(frozen=True)
class Part:
    """One line of the cluster's hourly price: what (``2 x p4d.24xlarge``), and its USD per hour."""

    what: str
    usd_per_hour: float


def cap_problem(text: str) -> str | None:
    """None for a ``--max-cost`` a run can have (a finite number of US dollars above 0), else the one line saying
    what is wrong and what is allowed."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        return f"--max-cost must be a number of US dollars above 0, got {text!r}"
    if not math.isfinite(value) or value <= 0:
        return f"--max-cost must be a number of US dollars above 0, got {text}"
    return None


def fsx_usd_per_hour(capacity_gib: float) -> float:
    """An FSx for Lustre SCRATCH_2 file system's price per hour (GB-month price over 730 h; AWS's GB here is the
    file system's GiB of StorageCapacity)."""
    return capacity_gib * FSX_SCRATCH_USD_PER_GB_MONTH / HOURS_PER_MONTH


def _instances(counts: dict[str, int], role: str) -> list[Part]:
    return [Part(f"{n} x {t} ({role})", n * catalog_quote(catalog.get(t)).usd_per_hour)
            for t, n in sorted(counts.items()) if n]


def hourly(c: Cluster) -> list[Part]:
    """What the cluster costs per hour, part by part: every node by its type (a local node priced as the AWS type
    that stands for it), the head node, and the shared storage (FSx at its capacity; BeeGFS is the nodes' own
    disks, 'none' is nothing)."""
    local = c.backend == "local"
    workers: dict[str, int] = {}
    reducers: dict[str, int] = {}
    for n in c.nodes:
        into = reducers if n.role == "reducer" else workers
        kind = (DEFAULT_TIER_TYPE["reducers"] if n.role == "reducer" else LOCAL_WORKER_TYPE) if local \
            else (n.instance_type or c.instance_type or LOCAL_WORKER_TYPE)
        into[kind] = into.get(kind, 0) + 1
    parts = _instances(workers, "workers") + _instances(reducers, "reducers")
    if c.head is not None:
        parts += _instances({(None if local else c.head.instance_type) or HEAD_INSTANCE_TYPE: 1}, "head node")
    if local:  # the rehearsal's shared mount stands where the stack mounts FSx (docs/design.md)
        parts.append(Part(f"FSx for Lustre {FSX_DEFAULT_CAPACITY_GIB} GiB (shared storage)",
                          fsx_usd_per_hour(FSX_DEFAULT_CAPACITY_GIB)))
    elif c.aws is not None and c.aws.storage.get("type") == "fsx":
        gib = int(c.aws.storage.get("capacity_gib") or FSX_DEFAULT_CAPACITY_GIB)
        parts.append(Part(f"FSx for Lustre {gib} GiB (shared storage)", fsx_usd_per_hour(gib)))
    return parts


def total(parts: list[Part]) -> float:
    return sum(p.usd_per_hour for p in parts)


def spent(usd_per_hour: float, seconds: float) -> float:
    """USD spent by a cluster of this hourly price in ``seconds`` since it came up (none before it did)."""
    return usd_per_hour * max(seconds, 0.0) / 3600.0


def seconds_to_cap(usd_per_hour: float, spent_usd: float, cap: float) -> float:
    """Seconds until the spend reaches the cap at this price (0 once it has)."""
    return max(cap - spent_usd, 0.0) * 3600.0 / usd_per_hour if usd_per_hour > 0 else math.inf


Verdict = Literal["under", "warn", "cap"]


def verdict(spent_usd: float, cap: float) -> Verdict:
    """``cap`` once the spend has reached the cap, ``warn`` from WARN_FRACTION of it, else ``under``. Compared to
    the micro-dollar (rounded to 1e-6 USD), so a spend that equals the cap by its arithmetic equals it here."""
    s, c = round(spent_usd, 6), round(cap, 6)
    if s >= c:
        return "cap"
    if s >= round(WARN_FRACTION * cap, 6):
        return "warn"
    return "under"


def step_args(cap: float, parts: list[Part], since_epoch_s: float) -> tuple[str, ...]:
    """The job's step's options for the budget (launcher/execute/budget.add_options): the cap, the cluster's price
    per hour and when it came up (seconds since the epoch)."""
    return ("--max-cost", repr(cap), "--cost-per-hour", f"{total(parts):.6f}", "--cost-since", f"{since_epoch_s:.0f}")


def warn_line(spent_usd: float, cap: float, usd_per_hour: float) -> str:
    left = seconds_to_cap(usd_per_hour, spent_usd, cap)
    return (f"budget: ${spent_usd:,.2f} of --max-cost ${cap:,.2f} spent ({spent_usd / cap:.0%}) since the cluster "
            f"came up; at ${usd_per_hour:,.2f}/h the cap is reached in {left / 60:,.1f} min")


def stop_line(spent_usd: float, cap: float, usd_per_hour: float, checkpoint: str | None, teardown: bool) -> str:
    """The one line a run stopped at its cap ends with (the job's output, `launch logs`, `launch train`)."""
    kept = (f"checkpoint {checkpoint} written; --resume continues from it" if checkpoint else
            "no checkpoint was written")
    return (f"error: stopped at the budget: the cluster has cost ${spent_usd:,.2f} since it came up (at "
            f"${usd_per_hour:,.2f}/h), --max-cost ${cap:,.2f}; {kept}"
            + ("; the cluster takes itself down (--teardown)" if teardown else ""))


def not_started_line(spent_usd: float, cap: float, usd_per_hour: float) -> str:
    """The one line of a job whose cap was spent before its run started (nothing is started)."""
    return (f"error: not started: the cluster has cost ${spent_usd:,.2f} since it came up (at ${usd_per_hour:,.2f}/h), "
            f"--max-cost ${cap:,.2f} is spent; give a larger cap")


RECORD_MARK = "==> budget of "


def records_query(outputs: Iterable[str]) -> str:
    """One shell line printing each run directory's STATE_FILE after a mark naming the directory (read in one round
    trip to the head node, which mounts the shared storage)."""
    return "; ".join(f"echo {shlex.quote(RECORD_MARK + d)}; cat {shlex.quote(d.rstrip('/') + '/' + STATE_FILE)} "
                     f"2>/dev/null" for d in outputs) or "true"


def parse_records(text: str) -> dict[str, dict]:
    """Run directory -> its budget record (cap_usd, spent_usd, usd_per_hour, since, state), from
    :func:`records_query`'s output; a missing or torn record is left out."""
    found: dict[str, dict] = {}
    for chunk in text.split(RECORD_MARK)[1:]:
        directory, _, body = chunk.partition("\n")
        try:
            got = json.loads(body)
            found[directory] = {"cap_usd": float(got["cap_usd"]), "spent_usd": float(got["spent_usd"]),
                                "usd_per_hour": float(got["usd_per_hour"]), "since": float(got["since"]),
                                "state": str(got["state"])}
        except (ValueError, KeyError, TypeError):
            continue
    return found


def state_line(job: str, job_state: str, record: dict, now_epoch_s: float) -> str:
    """`launch status`: a job's spend against its cap; a running job's counted to now, an ended job's as it ended."""
    running = job_state == "running" and record["state"] != "stopped"
    spent_usd = spent(record["usd_per_hour"], now_epoch_s - record["since"]) if running else record["spent_usd"]
    cap = record["cap_usd"]
    return (f"budget of job {job} ({job_state}): ${spent_usd:,.2f} of --max-cost ${cap:,.2f} spent "
            f"({spent_usd / cap:.0%})" + (", stopped at the cap" if record["state"] == "stopped" else ""))


def plan_line(estimate_usd: float, head_usd: float, cap: float) -> str | None:
    """`launch plan --max-cost`: None when the estimate (the nodes' cost to train, plus the head node's over the same
    time) is within the cap, else the line saying by how much it is not."""
    whole = estimate_usd + head_usd
    if round(whole, 6) <= round(cap, 6):
        return None
    return (f"warning: the estimate, ${whole:,.2f} (nodes ${estimate_usd:,.2f} + head node ${head_usd:,.2f}), "
            f"exceeds --max-cost ${cap:,.2f} by ${whole - cap:,.2f}: the run would stop at the cap with a "
            f"checkpoint ({cap / whole:.0%} of the way)")
