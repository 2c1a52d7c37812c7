"""`--max-cost USD` of `launch train` and `launch run`: the option, checked before anything starts, and what the job's
step is given at submission (launcher/plans/budget.py decides; launcher/execute/budget.py reckons on the cluster)."""

from __future__ import annotations

import time

import typer

from launcher import cluster as clusters
from launcher.cli.common import console, usage_error
from launcher.errors import LaunchError
from launcher.plans import budget

MaxCostOpt = typer.Option(None, "--max-cost", metavar="USD",
                          help="Stop the run when the cluster has cost this much since it came up (every node, the "
                               "head node and the shared storage, at the catalog's on-demand prices; a local "
                               "cluster as the same shape on AWS): a warning at 80%, then the run stops with one "
                               "line (launch train: after a checkpoint, which --resume continues from; launch run: "
                               "SIGTERM to the command); with --teardown the cluster goes too.")


def checked(text: str | None) -> float | None:
    """``--max-cost`` as a number of dollars, or None when not given; a usage error (exit 2, one line) otherwise."""
    if text is None:
        return None
    if problem := budget.cap_problem(text):
        raise usage_error(problem)
    return float(text)


def needs_slurm(cap: float | None, why: str) -> None:
    """--max-cost is the job's step's: a run without one (mpirun from this machine) is refused, with ``why``."""
    if cap is not None:
        raise LaunchError(f"--max-cost is kept by the job's step of a Slurm job, and {why}; leave --max-cost out "
                          f"or use a cluster with a head node (`launch local up --slurm`, or a stack with shared "
                          f"storage)")


def step_args(c: clusters.Cluster, cap: float | None) -> tuple[str, ...]:
    """The job's step's budget options for cluster ``c`` (none without a cap): its price per hour and when it came
    up. A cap the cluster has spent already is refused here, before the job is submitted."""
    if cap is None:
        return ()
    from launcher.execute import budget as spend

    parts = budget.hourly(c)
    since = spend.came_up(c)
    rate = budget.total(parts)
    spent = budget.spent(rate, time.time() - since)
    if budget.verdict(spent, cap) == "cap":
        raise LaunchError(f"--max-cost ${cap:,.2f} is spent already: cluster '{c.name}' has cost ${spent:,.2f} since "
                          f"it came up (${rate:,.2f}/h); give a larger cap")
    console.print(f"budget: ${spent:,.2f} of --max-cost ${cap:,.2f} spent since cluster '{c.name}' came up; "
                  f"${rate:,.2f}/h ({'; '.join(p.what for p in parts)}"
                  + (", priced as the same shape on AWS" if c.backend == "local" else "") + "); the cap is reached "
                  f"in {budget.seconds_to_cap(rate, spent, cap) / 60:,.1f} min", markup=False, highlight=False)
    return budget.step_args(cap, parts, since)


def plan_budget(cost_usd: float, time_to_train_s: float, cap: float) -> tuple[dict, str | None]:
    """`launch plan --max-cost`: the estimate against the cap (the nodes' cost, as the model prices it, plus the head
    node's over the same time), as the JSON document's ``budget`` and the line said when it exceeds the cap."""
    from infra import catalog
    from infra.spec import HEAD_INSTANCE_TYPE
    from launcher.cost.prices import catalog_quote

    head = budget.spent(catalog_quote(catalog.get(HEAD_INSTANCE_TYPE)).usd_per_hour, time_to_train_s)
    line = budget.plan_line(cost_usd, head, cap)
    return {"max_cost_usd": cap, "estimate_usd": round(cost_usd + head, 2), "head_node_usd": round(head, 2),
            "exceeds": line is not None}, line


BUDGET_JOBS = 20  # the newest jobs whose budget record `launch status` and `launch jobs` read


def recorded(c: clusters.Cluster, found: list) -> dict[str, dict]:
    """Run directory -> its budget record (plans/budget.parse_records), for the newest of ``found`` (slurm.Job) that
    started, read in one command on the head node; none when the head node does not answer."""
    from launcher.execute import remote, slurmjobs

    outputs = list(dict.fromkeys(j.output for j in found[:BUDGET_JOBS] if j.output and j.state != "queued"))
    if not outputs:
        return {}
    try:
        _, text = remote.check(c, slurmjobs.head_of(c), budget.records_query(outputs), timeout_s=30)
    except LaunchError:
        return {}  # the table without them: the queue itself was read
    return budget.parse_records(text)


def status_lines(c: clusters.Cluster) -> list[str]:
    """`launch status`: what the cluster has cost since it came up as the budget counts it (a local cluster as the
    same shape on AWS), and the newest jobs' spend against their --max-cost."""
    from launcher.execute import budget as spend
    from launcher.execute import slurmjobs

    parts = budget.hourly(c)
    rate, now = budget.total(parts), time.time()
    lines = [f"cost so far as --max-cost counts it: ${budget.spent(rate, now - spend.came_up(c)):,.2f} at "
             f"${rate:,.2f}/h ({'; '.join(p.what for p in parts)}"
             + (", priced as the same shape on AWS)" if c.backend == "local" else ")")]
    if c.head is None:
        return lines
    try:
        found = slurmjobs.jobs(c)
    except LaunchError:
        return lines  # the nodes' table was the answer asked for
    records = recorded(c, found)
    return lines + [budget.state_line(j.id, j.state, records[j.output], now) for j in found[:BUDGET_JOBS]
                    if j.output in records]
