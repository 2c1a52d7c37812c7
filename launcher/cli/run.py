"""`launch run -- COMMAND`: the user's own command on every node of the cluster, as a Slurm job the cluster owns.

The working directory goes to the shared storage (only what changed), and COMMAND runs from that copy once per GPU
(per slot on CPU nodes) with torchrun's variables set (launcher/plans/userjob.py), the image's Python first on PATH
and the cluster's EFA/NCCL and gloo settings: a script written for torchrun runs unchanged, and so does a Horovod
script. Output, `launch jobs/logs/cancel`, requeue after a lost node and --teardown work as for `launch train`.

Nodes have no internet: `--requirements FILE` resolves FILE here, for the nodes' Python and platform, sends the wheels
to the shared storage, and the job installs them into an environment of its own over the image's
(launcher/plans/requirements.py, execute/wheels.py, execute/userenv.py; docs/your-code.md).
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import typer

from launcher import cluster as clusters
from launcher.cli import budget as budgetcli
from launcher.cli.common import (
    ClusterOpt,
    ProfileOpt,
    RegionOpt,
    check_aws_options,
    check_seconds,
    chosen_engine,
    console,
    stack_session,
    target,
    usage_error,
)
from launcher.errors import LaunchError

app = typer.Typer()


def _say(line: str) -> None:
    console.print(line, markup=False, highlight=False)


@dataclass(frozen=True)
class Resolved:
    """A requirements file resolved for the nodes: the wheels to send (files in ``folder``)."""

    node_py: object                          # launcher.plans.requirements.NodePython
    wheels: list
    folder: Path


def _read_requirements(requirements: str | None, find_links: list[str] | None, no_requirements: bool,
                       workdir: Path) -> tuple | None:
    """The requirements FILE names (checked before any cluster is asked), or None; says when the working directory's
    requirements.txt is left out."""
    from launcher.plans import requirements as reqs

    if requirements is not None and no_requirements:
        raise usage_error("--requirements and --no-requirements say opposite things; give one")
    if find_links and requirements is None:
        raise usage_error("--find-links DIR is where --requirements FILE's wheels may come from; give --requirements")
    for folder in find_links or ():
        if not Path(folder).expanduser().is_dir():
            raise usage_error(f"--find-links must be a directory of wheels; {folder} is not one")
    if notice := reqs.workdir_notice((workdir.expanduser() / "requirements.txt").is_file(), requirements is not None,
                                     no_requirements):
        _say(notice)
    if requirements is None:
        return None
    path = Path(requirements).expanduser()
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise usage_error(f"--requirements must be a readable requirements file; {requirements}: "
                          f"{getattr(e, 'strerror', None) or e}") from None
    try:
        return reqs.parse(text, requirements)
    except reqs.RequirementsError as e:
        raise usage_error(str(e)) from None


def _resolve(parsed: tuple, requirements: str, find_links: list[str] | None, c: clusters.Cluster | None,
             on_aws: bool, folder: Path) -> Resolved:
    """Resolve for the nodes' Python (the image's on AWS, the rehearsal root's locally) into ``folder``; a set that
    would replace the image's torch, Horovod or NumPy ABI is refused before anything is sent."""
    from ami import render
    from launcher.execute import wheels
    from launcher.plans import rehearsal
    from launcher.plans import requirements as reqs

    versions = render.load_versions()
    if on_aws:
        node_py = reqs.node_python(f"ubuntu {versions.ubuntu}", torch=versions.torch, horovod=versions.horovod)
    elif c is not None and c.rehearsal is not None:
        node_py = reqs.node_python(f"debian {rehearsal.SUITE}", torch=rehearsal.REHEARSAL_TORCH,
                                   horovod=versions.horovod)
    else:
        raise LaunchError("--requirements needs rehearsal nodes or an AWS stack (a --loopback cluster runs this "
                          "machine's own Python)")
    if problem := reqs.refused(parsed, node_py):
        raise usage_error(problem)
    found = wheels.download(node_py, Path(requirements).expanduser(), folder, tuple(find_links or ()))
    kept, problem = reqs.resolved(found, node_py)
    if problem:
        raise usage_error(problem)
    return Resolved(node_py, kept, folder)


@app.command("run", context_settings={"allow_interspersed_args": False})
def run_(command: list[str] = typer.Argument(None, metavar="-- COMMAND [ARGS]...",
                                             help="What every process runs, from the synced working directory."),
         cluster: str = ClusterOpt,
         nodes: int = typer.Option(None, "--nodes", help="Worker nodes to use; default all."),
         workdir: str = typer.Option(".", "--workdir", help="Directory copied to the shared storage (only "
                                                                   "what changed since the last run; .git, caches "
                                                                   "and the patterns in .scaletrainignore are left "
                                                                   "out); COMMAND runs from the copy."),
         procs_per_node: int = typer.Option(None, "--procs-per-node", metavar="K",
                                            help="Processes per node; default one per GPU (per slot on CPU nodes)."),
         engine: str = typer.Option("ddp", "--engine", help="What `training.distributed` uses: ddp (the torchrun "
                                                          "variables), horovod (hvd.init() under mpirun), or reducer "
                                                          "(with --reducers)."),
         reducers: int = typer.Option(0, "--reducers", metavar="K",
                                      help="Sum gradients on K of the cluster's reducer nodes (seed 004's tier): "
                                           "`python -m training.reducer` runs there; --engine reducer."),
         max_restarts: int = typer.Option(0, "--max-restarts", metavar="N",
                                          help="Requeue the job when a node is lost, up to N times; the command "
                                               "reads TORCHELASTIC_RESTART_COUNT to resume."),
         stall_timeout: float = typer.Option(1800, "--stall-timeout", metavar="SECONDS",
                                             help="Stop the job when it prints nothing for this long; 0: never."),
         checkpoint_to: str = typer.Option(None, "--checkpoint-to", metavar="s3://BUCKET/PREFIX",
                                           help="Passed to the command as SCALETRAIN_CHECKPOINT_TO."),
         teardown: bool = typer.Option(False, "--teardown", help="Bring the cluster down when the job has ended."),
         requirements: str = typer.Option(None, "--requirements", metavar="FILE",
                                          help="Install FILE's packages for the job (nodes have no internet: the "
                                               "wheels are downloaded here for the nodes' Python and sent to the "
                                               "shared storage; one environment per set, over the image's)."),
         find_links: list[str] = typer.Option(None, "--find-links", metavar="DIR",
                                              help="A directory of wheels of your own for --requirements "
                                                   "(repeatable), as pip's --find-links."),
         no_requirements: bool = typer.Option(False, "--no-requirements",
                                              help="Install nothing, even with a requirements.txt in --workdir."),
         node_check: bool = typer.Option(True, "--node-check/--no-node-check",
                                          help="Before each attempt's first step, test every node's link in a "
                                               "ring and drain one that falls short (requeueing the job); "
                                               "--no-node-check starts at once."),
         on_straggler: str = typer.Option("warn", "--on-straggler", metavar="warn|drain",
                                          help="What the job's step does with a node it names a straggler (your "
                                               "command must use training.distributed): warn names it; drain also "
                                               "has Slurm drain it, stops the command and requeues the job (a "
                                               "restart: needs --max-restarts) on the node's replacement."),
         max_cost: str = budgetcli.MaxCostOpt,
         region: str = RegionOpt, profile: str = ProfileOpt):
    """Run your own command on every node (one process per GPU), as a Slurm job; stream its output."""
    from launcher.plans import draining, userjob

    # Every option is checked here, before a cluster or AWS is asked: a bad one is a usage error (exit 2, one line).
    command = [a for a in (command or [])]
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise usage_error("launch run needs a command after --, e.g. `launch run -- python train.py`")
    if not command[0].strip():
        raise usage_error(f"launch run needs a command after --, e.g. `launch run -- python train.py`; got "
                          f"{command[0]!r}")
    engine = chosen_engine(engine, reducers, userjob.ENGINES, tier_with="ddp")
    if nodes is not None and nodes < 1:
        raise usage_error(f"--nodes must be >= 1, got {nodes}")
    if max_restarts < 0:
        raise usage_error(f"--max-restarts must be >= 0, got {max_restarts}")
    check_seconds("--stall-timeout", stall_timeout, note=" (0: never)")
    if problem := draining.policy_problem(on_straggler) or draining.restarts_problem(on_straggler, max_restarts):
        raise usage_error(problem)
    if procs_per_node is not None and procs_per_node < 1:
        raise usage_error(f"--procs-per-node must be >= 1, got {procs_per_node}")
    if not workdir.strip():  # Path('') is '.': it would quietly mean the current directory
        raise usage_error(f"--workdir needs a directory, got {workdir!r}")
    if not Path(workdir).expanduser().is_dir():
        raise usage_error(f"--workdir must be a directory; {workdir} is not one")
    workdir_path = Path(workdir)
    if checkpoint_to:
        from training import durable

        try:
            durable.parse_target(checkpoint_to)
        except durable.DurableError as e:
            raise usage_error(str(e)) from None
    check_aws_options(region, profile)
    cap = budgetcli.checked(max_cost)  # at the cap the command is ended (SIGTERM) with one line: docs/your-code.md
    parsed = _read_requirements(requirements, find_links, no_requirements, workdir_path)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    resolved: Resolved | None = None

    def on(c: clusters.Cluster) -> None:
        submit_run(c, command, nodes=nodes, workdir=workdir_path, procs=procs_per_node, engine=engine,
                   reducers=reducers, max_restarts=max_restarts, stall_timeout=stall_timeout,
                   checkpoint_to=checkpoint_to, teardown=teardown, stamp=stamp, resolved=resolved,
                   node_check=node_check, on_straggler=on_straggler, max_cost=cap)

    c, stack = target(cluster)
    with contextlib.ExitStack() as cleanup:
        if parsed is not None:
            folder = Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="scaletrain-wheels-")))
            resolved = _resolve(parsed, requirements, find_links, c, stack is not None, folder)
        _run_on(c, stack, on, cluster=cluster, region=region, profile=profile, max_restarts=max_restarts,
                engine=engine, reducers=reducers, stamp=stamp, teardown=teardown)


def _run_on(c: clusters.Cluster | None, stack: str | None, on, *, cluster: str | None, region: str | None,
            profile: str | None, max_restarts: int, engine: str, reducers: int, stamp: str, teardown: bool) -> None:
    if stack is None:
        assert c is not None
        on(c)
        return
    from launcher.cluster.aws import lifecycle
    from launcher.execute import awsrun

    sess = stack_session(c, stack, region, profile, cluster=cluster)  # as train, status and the rest choose it
    if max_restarts:  # as `launch train`: a replacement node must find the storage by its own boot
        from launcher.cluster.aws import api as aws
        from launcher.plans import storage

        if problem := storage.restarts_problem(aws.stack_outputs(sess, stack).storage, max_restarts):
            raise LaunchError(problem)
    handover: dict[str, str | None] = {"line": None}

    def on_aws() -> None:
        found = awsrun.connect_ready(sess, stack, profile=profile)
        awsrun.install_node_access(found)
        awsrun.prepare_storage(found)
        if not lifecycle.run_path(found, engine=engine, reducers=reducers).slurm:
            raise LaunchError(f"stack '{stack}' has no Slurm head node with shared storage; `launch run` needs "
                              f"one (deploy with -c storage=fsx or beegfs)")
        awsrun.as_slurm_job(found, f"{awsrun.shared_root(found)}/runs/{stamp}-run", lambda: on(found), handover)

    awsrun.with_teardown(sess, stack, teardown, on_aws, instead=lambda: handover["line"])


def submit_run(c: clusters.Cluster, command: list[str], *, nodes: int | None, workdir: Path, procs: int | None,
               engine: str, reducers: int, max_restarts: int, stall_timeout: float, checkpoint_to: str | None,
               teardown: bool, stamp: str, resolved: Resolved | None = None, node_check: bool = True,
               on_straggler: str = "warn", max_cost: float | None = None) -> None:
    from launcher.cli import jobs as jobcli
    from launcher.cli.train import _shared_memory_gib
    from launcher.execute import run, slurmjobs, sync
    from launcher.plans import slurm, userjob

    slurmjobs.head_of(c)
    shared = c.shared_root
    if not shared:
        raise LaunchError(f"cluster '{c.name}' has no shared storage for the working directory; `launch run` needs "
                          f"one (locally `launch local up --slurm`; on AWS -c storage=fsx or beegfs)")
    if reducers > len(c.reducers):
        raise LaunchError(f"--reducers {reducers} is more than the {len(c.reducers)} reducer node(s) of cluster "
                          f"'{c.name}'; bring one up with `launch local up --slurm --nodes N --reducers K`")
    chosen = c.select_workers(nodes)
    first = chosen[0]
    try:
        per_node = userjob.procs_per_node(first, procs)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    output = f"{shared}/runs/{stamp}-run"
    document = None
    if resolved is not None and resolved.wheels:
        from launcher.execute import wheels

        pushed = wheels.push(c, first, shared, resolved.wheels, resolved.folder, resolved.node_py)
        document = pushed.document
        _say(f"requirements: {pushed.wheels} wheel(s) for {resolved.node_py.describe()}, {pushed.sent} sent "
             f"({pushed.sent_bytes / 2**20:,.2f} MiB); environment {pushed.env} "
             + ("(made before)" if pushed.ready else "(the job makes it)"))
    elif resolved is not None:
        _say("requirements: the image has every package asked for; nothing to install")
    copied = sync.push(c, first, workdir, shared)
    p = copied.plan
    _say(f"synced {workdir} to {copied.path}: {len(p.send)} file(s) sent ({p.send_bytes / 2**20:,.2f} MiB), "
         f"{p.unchanged} unchanged, {len(p.delete)} removed")
    fabric_env, mca = run.fabric_settings(c, first)
    argv = userjob.run_mpirun(c, chosen, procs=per_node, workdir=copied.path, output=output, command=command,
                              engine=engine, fabric_env=fabric_env, mca=mca, checkpoint_to=checkpoint_to,
                              reducers=c.reducers[:reducers], requirements_set=document)
    script = slurm.batch_script(slurm.BatchJob(
        name=f"run-{Path(command[0]).name}"[:40], nodes=len(chosen), slots=per_node, output=output, python=c.python,
        mpirun=tuple(argv), max_restarts=max_restarts, stall_timeout_s=stall_timeout, teardown=teardown,
        shared_memory_gib=_shared_memory_gib(c), rendezvous_port=userjob.MASTER_PORT, resume_flag=False,
        reducers=reducers, submitted_by="launch run", node_check=node_check, on_straggler=on_straggler,
        budget=budgetcli.step_args(c, max_cost)))
    tier = f" and {reducers} reducer node(s)" if reducers else ""
    job_id, ended, seen = jobcli.submit_and_follow(
        c, script, output, f"{len(chosen)} node(s) x {per_node} process(es){tier}, run directory {output}")
    if teardown:
        _say(f"the cluster takes itself down now that job {job_id} has ended (--teardown)")
    if ended.state != "succeeded":
        said = [ln for ln in seen if ln.startswith("error: ")]
        raise LaunchError(f"job {job_id} {ended.state} ({ended.slurm_state}, exit {ended.exit_code})"
                          + (f": {said[-1][len('error: '):]}" if said else "")
                          + f"; output {output}/slurm-{job_id}.out")
    _say(f"job {job_id} succeeded; output {output}/slurm-{job_id}.out")
