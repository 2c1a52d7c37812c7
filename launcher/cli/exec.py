"""`launch exec`: one command on every node, in parallel."""

from __future__ import annotations

import typer

from launcher.cli.common import (
    ClusterOpt,
    ProfileOpt,
    RegionOpt,
    check_aws_options,
    console,
    err,
    resolve,
    usage_error,
)
from launcher.errors import LaunchError
from launcher.execute import remote

app = typer.Typer()


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(command: list[str] = typer.Argument(..., help="The command (after --), run by each node's shell."),
          cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt):
    """Run one command on every node in parallel; output is prefixed by node."""
    if not " ".join(command).strip():  # `launch exec -- ''` ran an empty command on every node and said nothing
        raise usage_error(f"launch exec needs a command after --, e.g. `launch exec -- nvidia-smi`; got "
                          f"{' '.join(command)!r}")
    check_aws_options(region, profile)  # '' would quietly mean the default region or profile
    c = resolve(cluster, region, profile, reach=True)
    results = remote.run_all(c, c.nodes, " ".join(command))
    for r in results:
        for line in r.stdout.splitlines():
            console.print(f"[{r.node}] {line}", markup=False, highlight=False)
        for line in r.stderr.splitlines():
            err.print(f"[{r.node}] {line}", markup=False, highlight=False)
        if r.error:
            err.print(f"[{r.node}] {r.error}", markup=False, highlight=False)
    failed = [r for r in results if not r.ok]
    if failed:
        detail = ", ".join(f"{r.node} ({'exit ' + str(r.exit_code) if r.exit_code >= 0 else r.error})"
                           for r in failed)
        raise LaunchError(f"failed on {len(failed)} of {len(results)} node(s): {detail}")
