"""What every command module shares: the consoles it prints on, the common options, and which cluster a command
means."""

from __future__ import annotations

import os
import sys

import typer
from rich.console import Console

from launcher import cluster as clusters

# rich sizes tables to a terminal; when stdout is piped or logged it takes 80 columns (or the width of a terminal on
# stdin) and squeezes a wide table into unreadable `i…` columns. A log has no width: it gets one no table of ours
# reaches, so every table is printed at its natural width. An explicit COLUMNS still wins.
LOG_WIDTH = 1000


def _width(stream) -> int | None:
    """None (rich measures the terminal) on a terminal or with COLUMNS set; LOG_WIDTH for a pipe or a file."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return None if terminal or os.environ.get("COLUMNS", "").isdigit() else LOG_WIDTH


console = Console(soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, soft_wrap=True, width=_width(sys.stderr))

ClusterOpt = typer.Option(None, "--cluster", help="Cluster name; defaults to the only cluster there is.")

RegionOpt = typer.Option(None, "--region", help="AWS region; default: the AWS environment's (AWS_REGION, profile).")
ProfileOpt = typer.Option(None, "--profile", help="AWS profile; default: the AWS environment's.")
DEFAULT_STACK = "scaletrain"  # infra's default cluster_name


def target(cluster: str | None) -> tuple[clusters.Cluster | None, str | None]:
    """(the saved cluster, or None; the AWS stack to use, or None for a local cluster).

    A name the launcher does not know is taken as a stack to discover; with no name and no saved cluster, the
    stack is $SCALETRAIN_STACK or infra's default name.
    """
    names = clusters.known_names()
    if cluster in names or (cluster is None and names):
        c = clusters.load(cluster)
        return c, (c.aws.stack if c.aws else c.name) if c.backend == "aws" else None
    return None, cluster or os.environ.get("SCALETRAIN_STACK") or DEFAULT_STACK
