"""`launch jobs`, `launch logs ID`, `launch cancel ID`: the cluster's Slurm jobs, read on its head node."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from launcher import cluster as clusters
from launcher.cli.common import ClusterOpt, ProfileOpt, RegionOpt, check_aws_options, console, resolve, usage_error
from launcher.errors import Detached
from launcher.execute import slurmjobs
from launcher.plans import slurm, stragglers

app = typer.Typer()


def submit_and_follow(c: clusters.Cluster, script: str, output: str, intro: str,
                      ) -> tuple[str, slurm.Job, list[str]]:
    """Submit ``script`` on the head node, print ``job ID: intro``, and follow the job's output until it ends: (its
    id, the job as it ended, its last lines). From the submit on, Ctrl-C only detaches (Detached, exit 130): the
    job is the cluster's."""
    seen: list[str] = []

    def write(text: str) -> None:
        seen.extend(text.splitlines())
        del seen[:-500]
        console.file.write(text)
        console.file.flush()

    job_id = slurmjobs.submit(c, script, output)
    try:
        console.print(f"job {job_id}: {intro} (the cluster owns it: Ctrl-C detaches, the job runs on)",
                      markup=False, highlight=False)
        ended = slurmjobs.follow(c, job_id, write=write)
    except KeyboardInterrupt:
        console.print(f"\n{slurmjobs.detached(job_id, c.name)}", markup=False, highlight=False)
        raise Detached from None
    return job_id, ended, seen


def _job_id(job_id: str) -> str:
    """A job id as Slurm gives them and `launch jobs` lists them (a whole number >= 1; slurmjobs.jobs takes digits
    only): anything else is a usage error, said before the cluster is asked."""
    # Slurm's job ids are unsigned 32-bit numbers (slurm.conf(5), MaxJobId: "Job ids are unsigned 32bit integers");
    # a longer one is no job, said before int() meets 4,300 digits (Python's int-from-string limit).
    digits = job_id.lstrip("0") if job_id.isascii() and job_id.isdigit() else ""
    if not (digits and len(digits) <= 10 and int(digits) <= 2**32 - 1):
        raise usage_error(f"ID must be a job id as `launch jobs` lists them, a whole number from 1 to "
                          f"{2**32 - 1:,}; got {job_id!r}")
    return str(int(job_id))  # 007 is job 7


@app.command("jobs")
def jobs_(cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt,
          as_json: bool = typer.Option(False, "--json", help="One JSON array: id, name, state (queued, running, "
                                                               "succeeded, failed, cancelled), started, ended, "
                                                               "nodes, restarts, output, stdout, exit_code, "
                                                               "stragglers, budget (with --max-cost).")):
    """The cluster's jobs (Slurm's queue and its record of finished jobs), newest first."""
    check_aws_options(region, profile)
    c = resolve(cluster, region, profile, reach=True)
    found = slurmjobs.with_stragglers(c, slurmjobs.jobs(c))
    from launcher.cli import budget as budgetcli

    budgets = budgetcli.recorded(c, found)  # --max-cost: each run's spend and cap (launcher/plans/budget.py)
    if as_json:
        print(json.dumps([j.as_json() | ({"budget": budgets[j.output]} if j.output in budgets else {})
                          for j in found], indent=1, allow_nan=False))  # strict JSON (RFC 8259)
        return
    if not found:
        console.print("no jobs")
        return
    table = Table()
    for col in ("id", "name", "state", "started", "nodes", "restarts", "stragglers", "output"):
        table.add_column(col, no_wrap=col not in ("output", "stragglers"))
    for j in found:
        capped = budgets.get(j.output or "", {}).get("state") == "stopped"
        table.add_row(j.id, j.name, j.state + (f" ({j.reason})" if j.reason and j.state == "queued" else "")
                      + (f" (stopped at --max-cost ${budgets[j.output]['cap_usd']:,.2f})" if capped else ""),
                      j.started or "-", j.nodes, str(j.restarts), stragglers.summary(list(j.stragglers)),
                      j.output or "-")
    console.print(table)


@app.command("logs")
def logs(job_id: str = typer.Argument(..., metavar="ID", help="The job, as `launch jobs` lists it."),
         cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt,
         follow: bool = typer.Option(False, "-f", "--follow", help="Go on printing until the job ends; Ctrl-C "
                                                                   "stops printing, never the job.")):
    """Print a job's output (its file on the shared storage, read on the head node)."""
    job_id = _job_id(job_id)
    check_aws_options(region, profile)
    c = resolve(cluster, region, profile, reach=True)
    try:
        job = slurmjobs.follow(c, job_id, until_end=follow)
    except KeyboardInterrupt:
        console.print(f"\n{slurmjobs.detached(job_id, c.name)}", markup=False, highlight=False)
        raise Detached from None
    if follow:
        console.print(f"job {job_id} {job.state} ({job.slurm_state}, exit {job.exit_code})", markup=False,
                      highlight=False)
        if job.state != "succeeded":
            raise typer.Exit(1)


@app.command("cancel")
def cancel(job_id: str = typer.Argument(..., metavar="ID", help="The job, as `launch jobs` lists it."),
           cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt):
    """Stop a queued or running job (Slurm's scancel); its checkpoints stay in its run directory."""
    job_id = _job_id(job_id)
    check_aws_options(region, profile)
    c = resolve(cluster, region, profile, reach=True)
    job = slurmjobs.cancel(c, job_id)
    console.print(f"job {job_id} ({job.name}, {job.state}) cancelled; run directory {job.output}", markup=False,
                  highlight=False)
