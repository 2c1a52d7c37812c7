"""`launch train`: check the options, run the job on the cluster (local or AWS, torn down when asked), fetch its
record, and report accuracy, measured against predicted throughput, and what the run would cost on AWS."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import typer

from launcher import cluster as clusters
from launcher.cli import budget as budgetcli
from launcher.cli import trainreport
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
from launcher.execute import remote, run
from launcher.local import backend as local
from launcher.plans import draining, job, watchdog

app = typer.Typer()
ON_STRAGGLER_HELP = ("What the job's step does with a node it names a straggler: warn names it; drain also has Slurm "
                     "drain it, stops at the next checkpoint and requeues the job (a restart: needs --max-restarts), "
                     "to resume on the node's replacement.")


@app.command("train", context_settings={"allow_interspersed_args": False})
def train(trainer_args: list[str] = typer.Argument(None, help="Extra trainer options after --, e.g. -- "
                                                             "--label-smoothing 0.1 (see python -m training.train "
                                                             "--help)."),
          cluster: str = ClusterOpt,
          nodes: int = typer.Option(None, "--nodes", help="Worker nodes to use; default all."),
          data: str = typer.Option(None, "--data", help="Shards directory (as the nodes see it); on AWS also "
                                                       "s3://BUCKET/PREFIX of shards, or ImageNet as downloaded "
                                                       "(converted on the nodes once, with fsx/beegfs storage); "
                                                       "default: make sample data and convert it."),
          model: str = typer.Option("resnet50", "--model", help="resnet18, resnet34, resnet50 or resnet101."),
          image_size: int = typer.Option(224, "--image-size", help="Training crop size in px."),
          epochs: int = typer.Option(90, "--epochs"),
          batch_per_gpu: int = typer.Option(256, "--batch-per-gpu", help="Images per rank per step."),
          warmup_epochs: float = typer.Option(None, "--warmup-epochs", help="Linear warmup in epochs, less than "
                                                                           "--epochs; default: 10 of every 90 "
                                                                           "(seed 000), as `launch plan` shows."),
          workers: int = typer.Option(None, "--workers", help="Data loader processes per rank; default: sized "
                                                             "from the nodes' vCPUs per GPU (all but one of a "
                                                             "rank's share on GPU nodes, 2 on CPU ranks)."),
          engine: str = typer.Option("horovod", "--engine", help="horovod, or ddp (torch.distributed: NCCL on "
                                                                 "GPU, gloo on CPU) for an image without Horovod."),
          reducers: int = typer.Option(0, "--reducers", help="Reduce gradients on this many of the cluster's "
                                                             "reducer nodes (seed 004's tier; engine 'reducer')."),
          out: str = typer.Option(None, "--out", help="Run directory; default runs/<time>."),
          output: str = typer.Option(None, "--output", hidden=True, help="The old name of --out."),
          resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in --out."),
          teardown: bool = typer.Option(False, "--teardown", help="Bring the cluster down afterwards, "
                                                                  "also on failure or Ctrl-C."),
          max_cost: str = budgetcli.MaxCostOpt,
          region: str = RegionOpt, profile: str = ProfileOpt,
          ready_timeout: float = typer.Option(1800, "--ready-timeout", help="AWS: seconds to wait for every node "
                                                                           "to be ready."),
          probe_interval: float = typer.Option(15, "--probe-interval", metavar="SECONDS",
                                               help="While training, probe every node over SSH this often."),
          probe_misses: int = typer.Option(4, "--probe-misses", metavar="N",
                                           help="Stop the job when a node misses this many probes in a row "
                                                "(hung, not dead: mpirun would wait for it for ever)."),
          stall_timeout: float = typer.Option(1800, "--stall-timeout", metavar="SECONDS",
                                              help="Stop the job when it prints nothing for this long (a rank stuck "
                                                   "in a collective); 0: never."),
          max_restarts: int = typer.Option(0, "--max-restarts", metavar="N",
                                           help="When a node is lost (reclaimed, dead, hung), replace it and resume "
                                                "from the newest complete checkpoint, up to N times; 0: stop with "
                                                "the error. A failure the trainer names (bad data, a bug) is never "
                                                "retried."),
          checkpoint_to: str = typer.Option(None, "--checkpoint-to", metavar="s3://BUCKET/PREFIX",
                                            help="Also copy each epoch's checkpoint to S3 in the background (with a "
                                                 "completion marker); --resume restores the newest complete one "
                                                 "from there when --out lost it. The bucket must be in the "
                                                 "stack's region."),
          checkpoint_every: int = typer.Option(None, "--checkpoint-every", metavar="STEPS",
                                               help="Also checkpoint every STEPS steps inside an epoch (written in "
                                                    "the background; --resume continues mid-epoch); default: at "
                                                    "each epoch's end only."),
          node_check: bool = typer.Option(True, "--node-check/--no-node-check",
                                          help="Before each attempt's first step, test every node's link in a "
                                               "ring and drain one that falls short (requeueing the job); "
                                               "--no-node-check starts at once."),
          on_straggler: str = typer.Option("warn", "--on-straggler", metavar="warn|drain",
                                           help=ON_STRAGGLER_HELP)):
    """Train on the cluster with Horovod (or DDP) over mpirun; stream rank 0; report accuracy and AWS cost."""
    o = _checked(trainer_args, nodes=nodes, data=data, model=model, image_size=image_size, epochs=epochs,
                 batch_per_gpu=batch_per_gpu, warmup_epochs=warmup_epochs, workers=workers, engine=engine,
                 reducers=reducers, out=out, output=output, resume=resume, teardown=teardown, region=region,
                 profile=profile, ready_timeout=ready_timeout, probe_interval=probe_interval,
                 probe_misses=probe_misses, stall_timeout=stall_timeout, max_restarts=max_restarts,
                 checkpoint_to=checkpoint_to, checkpoint_every=checkpoint_every, node_check=node_check,
                 on_straggler=on_straggler)
    o = dataclasses.replace(o, max_cost=budgetcli.checked(max_cost))  # before anything starts, as the rest
    c, stack = target(cluster)
    if stack is not None:
        _on_aws(c, stack, cluster, o)
    elif c is not None and c.head is not None and _head_answers(c, o.nodes):
        _on_slurm(c, o, output=o.output or f"{c.shared_root}/runs/{o.stamp}", data=o.data)
    else:
        assert c is not None
        _on_local(c, o)


@dataclasses.dataclass(frozen=True)
class _Options:
    """`launch train`'s options once checked: what each path (Slurm's job, mpirun from here, AWS) reads."""

    nodes: int | None
    data: str | None
    output: str | None
    teardown: bool
    max_restarts: int
    stall_timeout: float
    region: str | None
    profile: str | None
    ready_timeout: float
    checkpoint_to: str | None
    reducers: int
    engine: str
    watch: watchdog.Watch
    stamp: str
    trainer: job.TrainSpec  # the trainer's options; each path fills in its data and run directory
    node_check: bool = True  # the job's step tests the nodes' links before the first step (Slurm's paths)
    max_cost: float | None = None  # USD: the job's step stops the run there (Slurm's paths; launcher/cli/budget.py)
    on_straggler: str = "warn"  # what the job's step does with a straggler it names (Slurm's paths)

    def spec(self, data_path: str, out: str = "", *, resume: bool | None = None) -> job.TrainSpec:
        return self.trainer.model_copy(update={"data": data_path, "output": out} |
                                       ({} if resume is None else {"resume": resume}))


def _checked(trainer_args: list[str] | None, *, nodes: int | None, data: str | None, model: str, image_size: int,
             epochs: int, batch_per_gpu: int, warmup_epochs: float | None, workers: int | None, engine: str,
             reducers: int, out: str | None, output: str | None, resume: bool, teardown: bool, region: str | None,
             profile: str | None, ready_timeout: float, probe_interval: float, probe_misses: int,
             stall_timeout: float, max_restarts: int, checkpoint_to: str | None,
             checkpoint_every: int | None = None, node_check: bool = True, on_straggler: str = "warn") -> _Options:
    """Every option checked here, before a cluster or AWS is asked: a bad one is a usage error (exit 2, one line)."""
    from training.model import check_model
    from training.schedule import default_warmup_epochs, epochs_problem, warmup_problem

    try:
        check_model(model)
    except ValueError as e:
        raise usage_error(str(e)) from None
    engine = chosen_engine(engine, reducers, job.ENGINES, tier_with="horovod")
    if problem := epochs_problem(epochs):  # the trainer's own limit, said here before any node is asked
        raise usage_error(problem)
    for name, value in (("--batch-per-gpu", batch_per_gpu), ("--image-size", image_size)):
        if value < 1:
            raise usage_error(f"{name} must be >= 1, got {value}")
    if out is not None and output is not None and out != output:
        raise usage_error(f"--out {out} and --output {output} name two run directories; pass --out only")
    output = out if out is not None else output  # --output: the old name, kept working
    if output is not None and not output.strip():
        raise usage_error(f"--out needs a directory name, got {output!r}")
    if problem := warmup_problem(default_warmup_epochs(epochs) if warmup_epochs is None else warmup_epochs, epochs):
        raise usage_error(problem)
    if resume and output is None:
        raise usage_error("--resume needs --out: the run directory holding the checkpoints")
    check_seconds("--probe-interval", probe_interval, zero=False)
    check_seconds("--ready-timeout", ready_timeout)  # as discover's; 0: the nodes must be ready now
    if nodes is not None and nodes < 1:
        raise usage_error(f"--nodes must be >= 1, got {nodes}")
    if data is not None and not data.strip():  # '' would quietly mean "make sample data"
        raise usage_error(f"--data needs a shards directory or s3://BUCKET/PREFIX (leave it out for sample data), "
                          f"got {data!r}")
    check_aws_options(region, profile)
    if max_restarts < 0:
        raise usage_error(f"--max-restarts must be >= 0, got {max_restarts}")
    if workers is not None and workers < 0:  # the trainer's own bound; said here, before a cluster is sought
        raise usage_error(f"--workers must be >= 0, got {workers}")
    if checkpoint_to:
        from training import durable

        try:
            durable.parse_target(checkpoint_to)
        except durable.DurableError as e:
            raise usage_error(str(e)) from None
    if checkpoint_every is not None and checkpoint_every < 1:  # absent: the trainer's default, each epoch's end
        raise usage_error(f"--checkpoint-every must be a number of steps >= 1 (leave it out for one checkpoint per "
                          f"epoch), got {checkpoint_every}")
    if checkpoint_every is not None:  # passed through to the trainer (training/options.py), ahead of the user's own
        trainer_args = ["--checkpoint-every", str(checkpoint_every), *(trainer_args or ())]
    if probe_misses < 1:
        raise usage_error(f"--probe-misses must be >= 1, got {probe_misses}")
    if problem := draining.policy_problem(on_straggler) or draining.restarts_problem(on_straggler, max_restarts):
        raise usage_error(problem)
    if not stall_timeout >= 0:
        raise usage_error(f"--stall-timeout must be a number of seconds >= 0 (0: no silence check), "
                          f"got {stall_timeout:g}")
    trainer = job.TrainSpec(data="", output="", model=model, image_size=image_size, epochs=epochs,
                            batch_per_gpu=batch_per_gpu, warmup_epochs=warmup_epochs, workers=workers, resume=resume,
                            engine=engine, reducers=reducers, extra_args=tuple(trainer_args or ()))
    return _Options(nodes=nodes, data=data, output=output, teardown=teardown, max_restarts=max_restarts,
                    stall_timeout=stall_timeout, region=region, profile=profile, ready_timeout=ready_timeout,
                    checkpoint_to=checkpoint_to, reducers=reducers, engine=engine,
                    watch=watchdog.Watch(interval_s=probe_interval, misses=probe_misses, stall_s=stall_timeout),
                    stamp=time.strftime("%Y%m%d-%H%M%S"), trainer=trainer, node_check=node_check,
                    on_straggler=on_straggler)


def _on_local(c: clusters.Cluster, o: _Options) -> None:
    """A local cluster without a head node that answers: mpirun runs from here, torn down after when asked."""
    budgetcli.needs_slurm(o.max_cost, f"cluster '{c.name}' has no head node that answers: mpirun would run from here")
    if problem := draining.slurm_problem(o.on_straggler, f"cluster '{c.name}' has no head node that answers"):
        raise LaunchError(problem)
    try:
        if c.shares_launcher_fs:  # loopback nodes see this machine's paths
            _followed(c, o, run.local_output(o.output, o.stamp),
                      str(Path(o.data).expanduser().resolve()) if o.data else "", local.replace_local)
        else:  # rehearsal nodes, like EC2 instances, see their own disks and the shared storage only
            _followed(c, o, o.output or f"{c.shared_root or c.nodes[0].workdir}/runs/{o.stamp}", o.data or "",
                      local.replace_local)
    finally:
        if o.teardown:
            _teardown(c)


def _followed(c: clusters.Cluster, o: _Options, out: str, data_path: str,
              recover: Callable[[clusters.Cluster, list[str]], clusters.Cluster]) -> None:
    """The run as mpirun from this machine, followed to its end: on a lost node, replace it and resume from the
    newest complete checkpoint, up to --max-restarts times; then report."""
    from launcher.execute import recovery
    from launcher.plans import faults, restarts

    history: list[restarts.Restart] = []
    make_data = not o.data
    while True:
        chosen = c.select_workers(o.nodes)
        if o.reducers > len(c.reducers):
            raise LaunchError(f"--reducers {o.reducers} is more than the {len(c.reducers)} reducer node(s) of "
                              f"cluster '{c.name}'; bring one up with `launch local up --nodes N --reducers K`")
        spec = o.spec(data_path, out, resume=o.trainer.resume or bool(history))
        if o.checkpoint_to:
            store_region, aws_cli = job.checkpoint_store(c, o.region)
            spec = spec.model_copy(update={"checkpoint_to": o.checkpoint_to, "aws_region": store_region,
                                           "aws_cli": aws_cli})
        result = run.train(c, chosen, spec, make_data=make_data, reducers=c.reducers[:o.reducers], watch=o.watch)
        if history:
            recovery.write_record(c, chosen[0], out, history)
        # The run directory is on the cluster's storage, which --teardown deletes; a first node the watchdog
        # gave up on would only hold the verdict back by the fetch's timeout.
        if not c.shares_launcher_fs and chosen[0].name not in result.silent:
            trainreport.fetch_record(c, chosen[0], out, newest_checkpoint=o.teardown)
        if result.exit_code == 0 and not result.stopped:
            break
        used = chosen + c.reducers[:o.reducers]
        # Which nodes still answer: a node that went away is the likeliest cause, and mpirun may not name it.
        silent = {r.node: r.error or f"exit {r.exit_code}" for r in remote.run_all(c, used, "true") if not r.ok}
        why = result.stopped or faults.diagnose(result.lines, used, silent,
                                                shared_memory_gib=_shared_memory_gib(c)) \
            or f"mpirun on {chosen[0].name} exited {result.exit_code}"
        at = restarts.progress(result.lines)
        lost = restarts.lost_nodes(result.lines, silent, [n.name for n in used])
        if result.stopped and not lost:  # the watchdog stopped it: the nodes it gave up on are lost
            lost = tuple(n.name for n in used if n.name in result.silent)
        verdict = restarts.decide(why, lost, trainer_error=restarts.trainer_error(result.lines),
                                  restarts_done=len(history), max_restarts=o.max_restarts,
                                  previous_lost=history[-1].lost if history else None, progressed=at is not None)
        if not verdict.retry:
            raise LaunchError(f"training failed: {verdict.why if o.max_restarts else why} (output above); "
                              f"run directory {out}")
        newest = recovery.newest_checkpoint_epoch(c, chosen[0], out)
        step = restarts.Restart(attempt=len(history) + 1, why=why, lost=list(lost),
                                resumed_from_epoch=newest + 1 if newest is not None else 0,
                                epochs_lost=restarts.work_lost(at, newest), progress=list(at) if at else None)
        history.append(step)
        console.print(f"[launch] restart {step.attempt} of {o.max_restarts}: {why}; replacing {', '.join(lost)} "
                      f"and resuming at epoch {step.resumed_from_epoch} ({step.epochs_lost:g} epoch(s) of "
                      f"work lost)", markup=False, highlight=False)
        c = recover(c, list(lost))
        if make_data:  # the sample data is on the run's storage already
            data_path, make_data = f"{out}/shards", False
    if history:
        console.print(f"[launch] the run took {len(history)} restart(s), "
                      f"{sum(h.epochs_lost for h in history):g} epoch(s) of work repeated; "
                      f"record: {out}/{restarts.RECORD_FILE}", markup=False, highlight=False)
    trainreport.report(chosen, spec, result, c)


def _on_aws(c: clusters.Cluster | None, stack: str, cluster: str | None, o: _Options) -> None:
    """An AWS stack: wait for its nodes, stage the data, and run as a Slurm job (a stack with a head node) or as
    mpirun from here; --teardown deletes the stack after, or hands that to the job's epilog."""
    from launcher.execute import awsrun

    sess = stack_session(c, stack, o.region, o.profile, cluster=cluster)  # no such stack: the line status gives
    if o.max_restarts:  # a replacement node must find the run's storage by itself: one line, before anything starts
        from launcher.cluster.aws import api as aws
        from launcher.plans import storage

        if problem := storage.restarts_problem(aws.stack_outputs(sess, stack).storage, o.max_restarts):
            raise LaunchError(problem)

    def ready() -> clusters.Cluster:
        found = awsrun.connect_ready(sess, stack, profile=o.profile, timeout_s=o.ready_timeout)
        awsrun.install_node_access(found)
        awsrun.prepare_storage(found)
        return found

    def replaced(_c: clusters.Cluster, lost: list[str]) -> clusters.Cluster:
        # The Auto Scaling group replaces a terminated instance (its health check marks it unhealthy); discovery then
        # names the new instance as the node it stands for and pins its key from its console.
        console.print(f"[launch] waiting for the Auto Scaling group to replace {', '.join(lost)}", markup=False,
                      highlight=False)
        return ready()

    handover: dict[str, str | None] = {"line": None}  # who ends the stack after --teardown (awsrun.as_slurm_job)

    def run_it() -> None:
        from launcher.cluster.aws import lifecycle

        found = ready()
        chosen = found.select_workers(o.nodes)
        path = lifecycle.run_path(found, engine=o.engine, reducers=o.reducers)
        if path.note:
            awsrun.say(path.note)
        staged = awsrun.stage_data(found, chosen, o.data) if o.data else ""
        if not path.slurm:
            budgetcli.needs_slurm(o.max_cost, f"stack '{stack}' runs mpirun from here (no shared storage)")
            if problem := draining.slurm_problem(o.on_straggler, f"stack '{stack}' runs mpirun from here"):
                raise LaunchError(problem)
            _followed(found, o, o.output or f"{awsrun.shared_root(found) or chosen[0].workdir}/runs/{o.stamp}",
                      staged, replaced)
            return
        # A stack with a head node runs the job as the local cluster with Slurm does: the cluster owns it, and with
        # --teardown the job's epilog takes the stack down (as_slurm_job tells with_teardown).
        out = o.output or f"{awsrun.shared_root(found)}/runs/{o.stamp}"
        awsrun.as_slurm_job(found, out, lambda: _on_slurm(found, o, output=out, data=staged), handover)

    awsrun.check_data(sess, stack, o.data)  # a bucket the nodes may not read: one line, before anything starts
    awsrun.with_teardown(sess, stack, o.teardown, run_it, instead=lambda: handover["line"])


def _on_slurm(c: clusters.Cluster, o: _Options, *, output: str, data: str | None) -> None:
    """The run as a Slurm job the cluster owns: render its batch script, submit it on the head node, print its id,
    follow rank 0 until it ends (Ctrl-C detaches; the job runs on), then report as a followed run does."""
    import shlex

    from launcher.plans import slurm

    if o.reducers > len(c.reducers):
        raise LaunchError(f"--reducers {o.reducers} is more than the {len(c.reducers)} reducer node(s) of cluster "
                          f"'{c.name}'; bring one up with `launch local up --slurm --nodes N --reducers K`")
    chosen = c.select_workers(o.nodes)
    first = chosen[0]
    spec = o.spec(data or "", output)
    if o.checkpoint_to:
        store_region, aws_cli = job.checkpoint_store(c, o.region)
        spec = spec.model_copy(update={"checkpoint_to": o.checkpoint_to, "aws_region": store_region,
                                       "aws_cli": aws_cli})
    if not data:  # sample data, made before the job on the shared storage, as `launch data convert` would
        code, _ = remote.check(c, first, f"mkdir -p {shlex.quote(output)}")
        spec = spec.model_copy(update={"data": run.prepare_sample_data(c, first, output, sum(n.slots for n in chosen))})
    code, text = remote.check(c, first, f"cat {shlex.quote(spec.data)}/manifest.json")
    if code != 0:
        raise LaunchError(f"no manifest.json in {spec.data} on {first.name}; make shards with "
                          f"`launch data convert SRC --out {spec.data}` or leave out --data")
    import json

    train_images = sum(s["count"] for s in json.loads(text)["shards"] if s["split"] == "train")
    fabric_env, mca = run.fabric_settings(c, first)
    argv = slurm.job_mpirun(c, chosen, spec, fabric_env=fabric_env, mca=mca, reducers=c.reducers[:spec.reducers])
    script = slurm.batch_script(slurm.BatchJob(
        name=f"scaletrain-{spec.model}", nodes=len(chosen), slots=first.slots, output=output, python=c.python,
        mpirun=tuple(argv), max_restarts=o.max_restarts, stall_timeout_s=o.stall_timeout, teardown=o.teardown,
        shared_memory_gib=_shared_memory_gib(c), reducers=spec.reducers, node_check=o.node_check,
        budget=budgetcli.step_args(c, o.max_cost),
        on_straggler=o.on_straggler,
        rendezvous_port=job.DDP_PORT if spec.engine in ("ddp", "reducer") else None))
    from launcher.cli.jobs import submit_and_follow

    job_id, ended, seen = submit_and_follow(c, script, output, f"{len(chosen)} node(s), run directory {output}")
    # The run's record (and, before a teardown, its newest checkpoint) comes to this machine as after any run,
    # successful or not; the cluster's teardown waits for the TTL guard's next run (locally a grace period).
    trainreport.fetch_record(c, first, output, newest_checkpoint=o.teardown)
    if o.teardown:  # the job's epilog does it on the cluster's side (plans/slurm.epilog_script)
        console.print(f"the cluster takes itself down now that job {job_id} has ended (--teardown)", markup=False,
                      highlight=False)
    if ended.state != "succeeded":
        said = [ln for ln in seen if ln.startswith("error: ")]
        raise LaunchError(f"job {job_id} {ended.state} ({ended.slurm_state}, exit {ended.exit_code})"
                          + (f": {said[-1][len('error: '):]}" if said else "") + f"; run directory {output}")
    rc, text = remote.check(c, first, f"cat {shlex.quote(output)}/summary.json 2>/dev/null")
    summary = json.loads(text) if rc == 0 and text.strip() else None
    if ended.restarts:
        console.print(f"[launch] Slurm restarted the job {ended.restarts} time(s); each resumed from the newest "
                      f"complete checkpoint", markup=False, highlight=False)
    trainreport.report(chosen, spec, run.RunResult(0, output, train_images, summary, seen), c)


def _head_answers(c: clusters.Cluster, nodes: int | None) -> bool:
    """Is the head node there to run the job? When it is lost, the run is not a Slurm job: mpirun runs from here on
    the nodes, which still answer, and continues a run directory with --resume (checkpoints are on the shared
    storage). Not while a job the lost head node started still runs on a node: two runs would write one directory."""
    from launcher.execute import slurmjobs

    why = slurmjobs.head_lost(c)
    if why is None:
        return True
    # The brackets keep pgrep from finding the shell that runs it (its command line holds the pattern too).
    step = "'[l]auncher.execute.jobstep'"
    busy = [r.node for r in remote.run_all(c, c.select_workers(nodes), f"pgrep -f {step} >/dev/null") if r.ok]
    if busy:
        raise LaunchError(f"the head node '{c.head.name}' does not answer ({why}), and a job it started still runs on "
                          f"{', '.join(busy)}; wait for it to end (`launch exec -- pgrep -fa {step}`) or stop it "
                          f"(`launch exec -- pkill -f {step}`), then run again")
    console.print(f"note: the head node '{c.head.name}' does not answer ({why}), so this run is not a Slurm job: "
                  f"mpirun runs from here and the run ends with this launcher", markup=False, highlight=False)
    return False


def _shared_memory_gib(c: clusters.Cluster) -> float | None:
    """The memory every node of a local cluster shares (this machine's), for faults.diagnose; None on AWS."""
    import os

    if c.backend != "local":
        return None
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def _teardown(c: clusters.Cluster) -> None:
    if c.backend == "local":
        local.down(c)
        console.print(f"cluster '{c.name}' is down (--teardown)")
    else:
        from launcher.cluster.aws import api as aws

        assert c.aws is not None
        aws.teardown(aws.session(c.aws.region, c.aws.profile), c.aws.stack)
