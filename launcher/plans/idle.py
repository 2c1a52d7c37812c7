"""What `launch status` says about idle autostop (``-c idle_minutes``): pure, from the seconds the stack's idle check
would count now (``infra.idle_function.idle_seconds`` over the nodes' CloudWatch CPU, read by
``launcher.cluster.aws.idle``)."""

from __future__ import annotations

__all__ = ["idle_line"]


def _minutes(seconds: float) -> str:
    m = int(seconds // 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m"


def idle_line(idle_s: float | None, idle_minutes: int | None) -> str:
    """One line: how long every node has been idle against the stack's ``idle_minutes``."""
    if idle_minutes is None:
        return "idle stop: off (deploy with -c idle_minutes=M to delete the stack after M idle minutes)"
    limit = _minutes(idle_minutes * 60)
    if idle_s is None:
        return (f"idle stop after {limit}: no CPU data from CloudWatch in the last 15 minutes (nodes launching or "
                f"gone); nothing is deleted for idleness without it")
    if idle_s <= 0:
        return f"idle stop after {limit}: a node is busy now (CPU above half a vCPU)"
    if idle_s >= idle_minutes * 60:
        return f"idle for {_minutes(idle_s)} of {limit}: the stack deletes itself at the next check (every 5 minutes)"
    return (f"idle for {_minutes(idle_s)} of {limit} (no node's CPU above half a vCPU); deletes itself in "
            f"{_minutes(idle_minutes * 60 - idle_s)} if nothing runs")
