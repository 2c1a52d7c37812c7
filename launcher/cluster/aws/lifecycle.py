"""Pure arithmetic and verdicts for a cluster's life on AWS: uptime, cost so far, TTL left, TTL extension,
and whether a teardown left anything running."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from infra import catalog
from launcher.errors import LaunchError

__all__ = ["NodeStatus", "check_extension", "cost_so_far", "extended_start", "format_duration", "leftovers_verdict",
           "node_status", "parse_time", "ttl_left"]


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
        raise LaunchError(f"--hours must be within 0..{max_hours:g}, got {hours:g}")


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
    group's replacement for a reclaimed spot node; ``live`` is (instance id, role, state). None when there are none."""
    new = sorted((iid, role, state) for iid, role, state in live if iid not in known_ids)
    if not new:
        return None
    listed = ", ".join(f"{iid} ({role}, {state})" for iid, role, state in new)
    return (f"{len(new)} instance(s) of this cluster not discovered yet: {listed}; `launch discover` (or any "
            f"`launch train`) adds them")
