"""`launch local up|down|replace`: a local cluster of real sshd nodes on 127.0.0.1."""

from __future__ import annotations

import typer

from launcher import cluster as clusters
from launcher.cli.common import console
from launcher.cluster import local
from launcher.errors import LaunchError

app = typer.Typer(no_args_is_help=True, help="A local cluster of real sshd nodes on 127.0.0.1.")


@app.command("up")
def local_up(nodes: int = typer.Option(2, "--nodes", help="Worker nodes."),
             reducers: int = typer.Option(0, "--reducers", help="Reducer nodes (CPU-only role)."),
             base_port: int = typer.Option(None, "--base-port", help="First port; default: free ports.")):
    """Start one sshd per node on 127.0.0.1 and write the cluster's keys, ssh_config and known_hosts."""
    c = local.up(nodes, reducers, base_port)
    console.print(f"cluster '{c.name}' is up: {len(c.workers)} worker(s), {len(c.reducers)} reducer(s)")
    for n in c.nodes:
        console.print(f"  {n.name:<10} {n.role:<8} {n.address}:{n.port}  pid {c.processes[n.name]}  {n.workdir}")
    console.print(f"ssh_config: {c.ssh_config}   (try: ssh -F {c.ssh_config} {c.nodes[0].name})")


@app.command("down")
def local_down(cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Stop the local cluster's sshd processes and remove its state."""
    c = clusters.load(cluster)
    if c.backend != "local":
        raise LaunchError(f"cluster '{c.name}' is an AWS cluster; bring it down with `launch down`")
    stopped = local.down(c)
    console.print(f"cluster '{c.name}' is down ({stopped} sshd process(es) stopped)")


@app.command("replace")
def local_replace(nodes: list[str] = typer.Argument(None, metavar="[NODE]...",
                                                     help="Nodes to replace; default: every node whose sshd died."),
                  cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Start dead nodes afresh (new port, new host key), as an Auto Scaling group replaces an instance."""
    c = clusters.load(cluster)
    if c.backend != "local":
        raise LaunchError(f"cluster '{c.name}' is an AWS cluster; its Auto Scaling groups replace instances and "
                          f"the next `launch train` discovers them")
    c, replaced = local.replace(c, nodes or [])
    if not replaced:
        console.print(f"nothing to replace: every node of cluster '{c.name}' is running")
    for r in replaced:
        console.print(f"{r.node} replaced: 127.0.0.1:{r.port} (was {r.old_port}), pid {r.pid}, "
                      f"host key {r.fingerprint} pinned, the old one removed")
