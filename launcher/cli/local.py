"""`launch local up|down|replace`: a local cluster of real sshd nodes on 127.0.0.1."""

from __future__ import annotations

import typer

from launcher import cluster as clusters
from launcher.cli.common import check_cluster_name, console, usage_error
from launcher.errors import LaunchError
from launcher.local import backend as local

app = typer.Typer(no_args_is_help=True, help="A local cluster: rehearsal nodes built by the image recipe, each its "
                                              "own machine (default), or sshd processes on 127.0.0.1 (--loopback).")


@app.command("up")
def local_up(nodes: int = typer.Option(2, "--nodes", help="Worker nodes."),
             reducers: int = typer.Option(0, "--reducers", help="Reducer nodes (CPU-only role)."),
             name: str = typer.Option(local.LOCAL, "--name", help="Cluster name."),
             subnet: str = typer.Option(None, "--subnet",
                                        help="Rehearsal nodes' network; default: the first free 10.213.N.0/24."),
             loopback: bool = typer.Option(False, "--loopback",
                                           help="sshd processes on 127.0.0.1 sharing this machine's files, "
                                                "instead of rehearsal nodes (no root needed; no isolation)."),
             base_port: int = typer.Option(None, "--base-port", help="--loopback: first port; default: free ports."),
             slurm: bool = typer.Option(None, "--slurm/--no-slurm",
                                        help="A head node running Slurm's controller, slurmd on every node, and a "
                                             "keeper on this machine that replaces a lost node as an Auto Scaling "
                                             "group does: `launch train` then submits a Slurm job that the cluster "
                                             "owns (it outlives the launcher), as on AWS. Default: with rehearsal "
                                             "nodes; --no-slurm runs mpirun from the launcher instead.")):
    """Bring up a local cluster. By default each node is a rehearsal node: its own network namespace, address and
    hostname, sshd on port 22, and a copy-on-write root built by the image recipe (ami/components, built once and
    cached); only the shared directory, at /fsx, is common to the nodes. Needs root."""
    try:
        c = local.up(nodes, reducers, base_port, name, loopback=loopback, subnet=subnet,
                     with_slurm=(not loopback) if slurm is None else slurm)
    except LaunchError as e:
        if str(e).startswith("--"):  # the backend's checks of the options, made before anything starts
            raise usage_error(str(e)) from None
        raise
    kind = "loopback sshd" if c.rehearsal is None else "rehearsal"
    console.print(f"cluster '{c.name}' is up ({kind} nodes): {len(c.workers)} worker(s), {len(c.reducers)} reducer(s)")
    for n in c.nodes:
        console.print(f"  {n.name:<10} {n.role:<8} {n.address}:{n.port}  pid {c.processes[n.name]}  {n.workdir}")
    if c.head is not None:
        console.print(f"  {c.head.name:<10} {'head':<8} {c.head.address}:22  pid {c.processes[c.head.name]}  "
                      f"slurmctld (jobs: `launch jobs`; on the node: squeue, sbatch, scancel)")
    if c.rehearsal is not None:
        console.print(f"shared storage: {c.rehearsal.shared_host} on this machine, {c.rehearsal.shared_mount} on "
                      f"every node")
    console.print(f"ssh_config: {c.ssh_config}   (try: ssh -F {c.ssh_config} {c.nodes[0].name})")


@app.command("build")
def local_build():
    """Build the rehearsal nodes' root with the image recipe (ami/components, hardware layers skipped), or find it
    in the cache (keyed by the recipe and the project's source). `launch local up` does this first."""
    from launcher.local import rehearsal_root as rehearsal

    layers = rehearsal.ensure_root()
    console.print(f"rehearsal root: {layers.system} + {layers.project}", markup=False, highlight=False)


@app.command("down")
def local_down(cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Stop the local cluster's nodes and remove what `up` made (namespaces, bridge, state)."""
    from launcher.local import rehearsal_cluster as local_rehearsal

    check_cluster_name("--cluster", cluster)  # '' is no cluster (the other commands say the same)
    d = clusters.cluster_dir(cluster)
    if not (d / "cluster.json").exists() and local_rehearsal.leftovers(d):  # a crash mid-`up`
        stopped = local_rehearsal.remove(d)
        console.print(f"cluster '{cluster}' was half made; removed what was recorded ({stopped} node(s) running)")
        return
    c = clusters.load(cluster)
    if c.backend != "local":
        raise LaunchError(f"cluster '{c.name}' is an AWS cluster; bring it down with `launch down`")
    stopped = local.down(c)
    console.print(f"cluster '{c.name}' is down ({stopped} node(s) were running)")


@app.command("kill")
def local_kill(node: str = typer.Argument(..., help="The node to stop, e.g. node1."),
               cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Stop a node as a reclaimed spot instance stops: all its processes at once, no clean shutdown (for tests and
    for rehearsing recovery; `launch local replace` boots it again)."""
    check_cluster_name("--cluster", cluster)
    c = clusters.load(cluster)
    if c.backend != "local":
        raise LaunchError(f"cluster '{c.name}' is an AWS cluster; `launch local kill` stops local nodes only")
    try:
        c.machine(node)
    except LaunchError as e:  # a name the cluster has not: the argument, as `launch local reboot` says it
        raise usage_error(str(e)) from None
    local.kill(c, node)
    console.print(f"{node} of cluster '{c.name}' killed (every process at once)")


@app.command("reboot")
def local_reboot(node: str = typer.Argument(..., help="The node to reboot, e.g. head or node1."),
                 cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Reboot a rehearsal node as EC2 reboots an instance: its processes end, its disk stays, systemd boots it
    again; cloud-init does not run the user data again, and the units it enabled (munge, Slurm) come back."""
    from launcher.local import rehearsal_cluster

    check_cluster_name("--cluster", cluster)
    c = clusters.load(cluster)
    if c.backend != "local" or c.rehearsal is None:
        raise LaunchError(f"cluster '{c.name}' has no rehearsal nodes; `launch local reboot` reboots those only")
    names = [*c.names(), *([c.head.name] if c.head else [])]
    if node not in names:
        raise usage_error(f"no node {node!r} in cluster '{c.name}'; its nodes: {', '.join(names)}")
    rehearsal_cluster.reboot(c, node)
    console.print(f"{node} of cluster '{c.name}' rebooted")


@app.command("replace")
def local_replace(nodes: list[str] = typer.Argument(None, metavar="[NODE]...",
                                                     help="Nodes to replace; default: every node whose sshd died."),
                  cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Start dead nodes afresh with a new host key (pinned, the old one removed), as an Auto Scaling group replaces
    an instance; a rehearsal node keeps its address and port 22, a --loopback node gets a new port."""
    check_cluster_name("--cluster", cluster)
    c = clusters.load(cluster)
    if c.backend != "local":
        raise LaunchError(f"cluster '{c.name}' is an AWS cluster; its Auto Scaling groups replace instances and "
                          f"the next `launch train` discovers them")
    for node in nodes or []:
        try:
            c.node(node)
        except LaunchError as e:  # a name the cluster has not: the argument, as `launch local reboot` says it
            raise usage_error(str(e)) from None
    c, replaced = local.replace(c, nodes or [])
    if not replaced:
        console.print(f"nothing to replace: every node of cluster '{c.name}' is running")
    for r in replaced:
        console.print(f"{r.node} replaced: {c.node(r.node).address}:{r.port} (was port {r.old_port}), pid {r.pid}, "
                      f"host key {r.fingerprint} pinned, the old one removed")


@app.command("fault")
def local_fault(node: str = typer.Argument(..., help="The node, e.g. node1 (not the head node)."),
                cpu: float = typer.Option(None, "--cpu", metavar="FRACTION",
                                          help="Keep the node to this share of its vCPUs (0.3: 30%), as a slow "
                                               "instance would run."),
                net: str = typer.Option(None, "--net", metavar="RATE",
                                        help="Shape the node's link to RATE each way (tc units: 5mbit, 500kbit)."),
                freeze: bool = typer.Option(False, "--freeze", help="Freeze every process of the node, as a hung "
                                                                    "instance: it answers nothing."),
                clear: bool = typer.Option(False, "--clear", help="Undo every drill on the node."),
                cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Fault drills on a rehearsal node, for rehearsing what the cluster does about a slow, badly linked or hung
    node: one of --cpu, --net, --freeze or --clear. `launch local down` undoes them all."""
    from launcher.local import faults
    from launcher.plans import faultdrill

    check_cluster_name("--cluster", cluster)
    c = clusters.load(cluster)
    if c.backend != "local":
        raise usage_error(f"cluster '{c.name}' is an AWS cluster; fault drills are for local clusters")
    try:
        d = faultdrill.drill(node, cpu=cpu, net=net, freeze=freeze, clear=clear, workers=c.names(),
                             head=c.head.name if c.head else None, rehearsal=c.rehearsal is not None)
    except ValueError as e:
        raise usage_error(str(e)) from None
    console.print(f"{faults.apply(c, d)} (cluster '{c.name}')", markup=False, highlight=False)
