"""Pure arithmetic and verdicts for a cluster's life on AWS: uptime, cost so far, TTL left, TTL extension,
whether a teardown left anything running; whether a run is a Slurm job the cluster owns, and then who ends the stack
after `launch train --teardown`."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from infra import catalog
from launcher.cluster import Cluster
from launcher.errors import LaunchError

__all__ = ["NodeStatus", "RunPath", "check_extension", "cost_so_far", "extended_start", "format_duration",
           "leftovers_verdict", "new_job", "node_status", "parse_time", "run_path", "teardown_left_to_job",
           "teardown_unknown", "ttl_left"]


def parse_time(text: str) -> dt.datetime:
    """``YYYY-MM-DDTHH:MM:SSZ`` (or any ISO 8601 with an offset) -> aware UTC datetime."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.timezone.utc)
    return value.astimezone(dt.timezone.utc)


def format_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    return f"{h}h{rem // 60:02d}m" if h else f"{rem // 60}m{rem % 60:02d}s"


@dataclass(frozen=True)
class NodeStatus:
    node: str
    instance_type: str
    state: str
    uptime_s: float
    cost_usd: float


def node_status(node: str, instance_type: str, state: str, launched_at: str, now: dt.datetime) -> NodeStatus:
    """Uptime and on-demand cost so far of one node (catalog price; Spot nodes cost less)."""
    up = max((now - parse_time(launched_at)).total_seconds(), 0.0) if state == "running" else 0.0
    price = catalog.get(instance_type).price_usd_per_hour
    return NodeStatus(node, instance_type, state, up, price * up / 3600)


def cost_so_far(nodes: list[NodeStatus]) -> float:
    return sum(n.cost_usd for n in nodes)


def ttl_left(expires_at: str | None, now: dt.datetime) -> float | None:
    """Seconds until the cost guard starts deleting the stack; negative once due; None without a TTL."""
    return None if not expires_at else (parse_time(expires_at) - now).total_seconds()


def check_extension(hours: float, *, max_hours: float = 720) -> None:
    """A LaunchError unless ``--extend-ttl HOURS`` is within (0, max_hours]; checked before anything is asked of AWS."""
    if not 0 < hours <= max_hours:
        raise LaunchError(f"--extend-ttl must be more than 0 and at most {max_hours:g} hours, got {hours:g}")


def extended_start(current_start: dt.datetime, hours: float, now: dt.datetime, *,
                   max_hours: float = 720) -> dt.datetime:
    """The cost guard's new expiry after ``--extend-ttl HOURS``: from the later of the current expiry and now."""
    check_extension(hours, max_hours=max_hours)
    base = max(current_start.astimezone(dt.timezone.utc), now.astimezone(dt.timezone.utc))
    return (base + dt.timedelta(hours=hours)).replace(microsecond=0)


def leftovers_verdict(stack: str, region: str, leftovers: list[tuple[str, str]]) -> str | None:
    """None when nothing tagged with the cluster is left; else the one-line problem naming each instance."""
    if not leftovers:
        return None
    listed = ", ".join(f"{iid} ({state})" for iid, state in leftovers)
    return (f"stack '{stack}' is deleted but {len(leftovers)} instance(s) tagged scaletrain:cluster={stack} remain in "
            f"{region}: {listed}; terminate them with `aws ec2 terminate-instances --region {region} --instance-ids "
            f"{' '.join(iid for iid, _ in leftovers)}`")


def undiscovered(known_ids: set[str], live: list[tuple[str, str, str]]) -> str | None:
    """A line about instances of the cluster's tag that the saved cluster does not list, e.g. an Auto Scaling
    group's replacement for a reclaimed spot node; ``live`` is (instance id, role, state). None when there are none.
    The head node is no node (discovery records it apart, as the Cluster's head), so it is never one of them."""
    new = sorted((iid, role, state) for iid, role, state in live if iid not in known_ids and role != "head")
    if not new:
        return None
    listed = ", ".join(f"{iid} ({role}, {state})" for iid, role, state in new)
    return (f"{len(new)} instance(s) of this cluster not discovered yet: {listed}; `launch discover` (or any "
            f"`launch train`) adds them")


@dataclass(frozen=True)
class RunPath:
    slurm: bool                  # a Slurm job submitted on the head node, which the cluster owns
    note: str | None = None      # why a stack with a head node runs mpirun from the launcher instead, said once


def run_path(c: Cluster, *, engine: str, reducers: int) -> RunPath:
    """How `launch train` runs on this stack: a Slurm job when it has a head node and shared storage, else mpirun from
    the launcher as before the head node (a stack deployed before it had one says nothing)."""
    if c.head is None or c.aws is None:
        return RunPath(slurm=False)
    # Storage 'none' (the stack's default) falls back rather than being refused: a Slurm job keeps its batch script
    # and output in the run directory, which the head node (where `launch train` and `launch logs` read the output)
    # and the job's nodes must all see, and without shared storage no directory is; the launcher's mpirun path trains
    # there today, with the run directory on node0's disk, so refusing would take training away from the default
    # stack.
    if c.aws.storage.get("type", "none") == "none":
        return RunPath(slurm=False, note=(
            f"note: stack '{c.name}' has no shared storage, so this run is not a Slurm job the cluster owns: mpirun "
            f"runs from here and the run ends with this launcher; deploy with `-c storage=fsx` or `-c storage=beegfs` "
            f"for runs that outlive it"))
    return RunPath(slurm=True)


def new_job(before: set[str], jobs: list[tuple[str, str | None]], output: str) -> str | None:
    """The id of a job for run directory ``output`` among ``jobs`` (id, run directory) that was not in ``before`` (the
    ids the head node listed before the run was submitted), or None: was this run's job submitted? A `--resume` of
    the same directory finds its earlier jobs in ``before``."""
    def same(a: str | None) -> bool:
        return a is not None and a.rstrip("/") == output.rstrip("/")

    found = sorted((int(i) for i, out in jobs if i not in before and i.isdigit() and same(out)), reverse=True)
    return str(found[0]) if found else None


def teardown_left_to_job(stack: str, job_id: str) -> str:
    """Said instead of deleting the stack when `launch train --teardown` stopped after its job was submitted: the job's
    epilog on the head node moves the stack's TTL to now when the job ends, and the TTL guard deletes the stack."""
    return (f"--teardown: job {job_id} takes stack '{stack}' down when it ends (its epilog moves the TTL to now; the "
            f"TTL guard deletes the stack); not deleting it from here while the job may run. "
            f"`launch down --cluster {stack}` deletes it now")


def teardown_unknown(stack: str, why: str) -> str:
    """Said when the head node could not say whether the run's job was submitted: the launcher leaves the stack,
    since deleting it could end a job the cluster owns; the job's epilog or the TTL guard ends it."""
    return (f"warning: --teardown: could not tell whether this run's job was submitted ({why}); not deleting stack "
            f"'{stack}': a submitted job takes it down when it ends, else the TTL guard at its expiry; "
            f"`launch down --cluster {stack}` deletes it now")
