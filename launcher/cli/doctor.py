"""`launch doctor`: every check on every node, as a table; exit 1 when one fails."""

from __future__ import annotations

import typer
from rich.table import Table

from launcher.cli.common import ClusterOpt, ProfileOpt, RegionOpt, check_aws_options, console, resolve, usage_error
from launcher.errors import LaunchError

app = typer.Typer()


@app.command("doctor")
def doctor_cmd(cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt,
               storage: str = typer.Option("auto", "--storage", help="Shared storage to expect on AWS nodes: "
                                                                     "auto (Lustre or BeeGFS), fsx, beegfs, none.")):
    """Prove every node is ready: GPUs, driver, EFA, NCCL, Horovod, storage, clocks, then a test across nodes."""
    from launcher.doctor import checks as doctor
    from launcher.doctor import runner as doctor_run

    if storage not in doctor.STORAGE_CHOICES:  # before any cluster is sought
        raise usage_error(f"--storage must be one of: {', '.join(doctor.STORAGE_CHOICES)}; got '{storage}'")
    check_aws_options(region, profile)  # '' would quietly mean the default region or profile
    c = resolve(cluster, region, profile, reach=True)
    checks = doctor_run.diagnose(c, storage=storage)
    table = Table(title=f"launch doctor: cluster '{c.name}' ({c.backend})")
    for col in ("node", "check", "status", "detail"):
        table.add_column(col, no_wrap=col != "detail")
    style = {"ok": "green", "fail": "bold red", "skip": "yellow"}
    for chk in checks:
        table.add_row(chk.node, chk.name, f"[{style[chk.status]}]{chk.status}[/]", chk.detail.replace("[", r"\["))
    console.print(table)
    skipped = sum(1 for chk in checks if chk.status == "skip")
    console.print(f"{sum(1 for chk in checks if chk.status == 'ok')} ok, {skipped} skipped "
                  f"(not applicable on this cluster, reasons above), {sum(1 for chk in checks if chk.failed)} failed")
    problem = doctor.verdict(checks)
    if problem:
        raise LaunchError(problem)
