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
from launcher.loading import interrupts


class Group(typer.core.TyperGroup):
    """A command group that, given no subcommand, shows its help and then says so in one line, exit 2. Click 8.2's
    own NoArgsIsHelpError reaches `main` with typer's help already printed and an empty message (`error:  (see
    ...)`), and click 8.1 exits 0; this is the same for every group, whatever click is installed."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not args and self.no_args_is_help and not ctx.resilient_parsing:
            text = ctx.get_help()  # typer's rich help prints itself and returns ''; plain click's returns the text
            if text:
                click.echo(text)
            names = ", ".join(self.list_commands(ctx))
            raise click.UsageError(f"missing command; choose one of: {names}", ctx=ctx)
        return super().parse_args(ctx, args)


app = typer.Typer(cls=Group, add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="scaletrain: provision a GPU cluster, shard ImageNet, train ResNet-50 with Horovod over "
                       "MPI, and report what it cost. The same commands drive a local cluster of SSH nodes.")
# Command modules without a name add their commands at the top level (typer's "One File Per Command"); the order
# here is the order `launch --help` lists them in.
for group in (exec_, doctor, cluster, train, run_, jobs, plan):
    app.add_typer(group.app)
app.add_typer(local.app, name="local", cls=Group)
app.add_typer(data.app, name="data", cls=Group)


def main(argv: list[str] | None = None) -> int:
    before = interrupts()
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
    except Exception:
        if interrupts() > before:  # a Ctrl-C a C extension turned into its own error (launcher/loading.py)
            print("error: interrupted", file=sys.stderr)
            return 130
        raise
    if rv == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into a silent Exit(130) outside standalone mode
        print("error: interrupted", file=sys.stderr)
    return rv if isinstance(rv, int) else 0
