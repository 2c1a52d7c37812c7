"""The `launch` command line: one typer app per command group, each module thin (parse, call, print); errors are one
line. `main` is what the console script runs (pyproject.toml: launch = "launcher.__main__:run")."""

from __future__ import annotations

import sys

import click
import typer

from launcher.cli import cluster, data, doctor, jobs, local, plan, train
from launcher.cli import exec as exec_
from launcher.cli import run as run_
from launcher.errors import Detached, LaunchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="scaletrain: provision a GPU cluster, shard ImageNet, train ResNet-50 with Horovod over "
                       "MPI, and report what it cost. The same commands drive a local cluster of SSH nodes.")
# Command modules without a name add their commands at the top level (typer's "One File Per Command"); the order
# here is the order `launch --help` lists them in.
for group in (exec_, doctor, cluster, train, run_, jobs, plan):
    app.add_typer(group.app)
app.add_typer(local.app, name="local")
app.add_typer(data.app, name="data")


def main(argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, prog_name="launch", standalone_mode=False)
    except click.UsageError as e:
        hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx else ""
        print(f"error: {e.format_message()}{hint}", file=sys.stderr)
        return 2
    except Detached:
        return 130
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        return 130
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if rv == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into a silent Exit(130) outside standalone mode
        print("error: interrupted", file=sys.stderr)
    return rv if isinstance(rv, int) else 0
