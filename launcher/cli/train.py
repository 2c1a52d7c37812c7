"""`launch train`: check the options, run the job on the cluster (local or AWS, torn down when asked), fetch its
record, and report accuracy, measured against predicted throughput, and what the run would cost on AWS."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import typer
from rich.table import Table

from launcher import cluster as clusters
from launcher.cli.common import (
    ClusterOpt,
    ProfileOpt,
    RegionOpt,
    check_aws_options,
    check_seconds,
    chosen_engine,
    console,
    err,
    stack_session,
    target,
    usage_error,
)
from launcher.errors import LaunchError
from launcher.execute import remote, run
from launcher.local import backend as local
from launcher.plans import job

app = typer.Typer()


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
                                                 "stack's region.")):
    """Train on the cluster with Horovod (or DDP) over mpirun; stream rank 0; report accuracy and AWS cost."""
    from training.model import check_model

    try:
        check_model(model)
    except ValueError as e:
        raise usage_error(str(e)) from None
    engine = chosen_engine(engine, reducers, job.ENGINES, tier_with="horovod")
    from training.schedule import epochs_problem

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
    from training.schedule import default_warmup_epochs, warmup_problem

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
    if probe_misses < 1:
        raise usage_error(f"--probe-misses must be >= 1, got {probe_misses}")
    if not stall_timeout >= 0:
        raise usage_error(f"--stall-timeout must be a number of seconds >= 0 (0: no silence check), "
                          f"got {stall_timeout:g}")
    from launcher.plans import watchdog

    watch = watchdog.Watch(interval_s=probe_interval, misses=probe_misses, stall_s=stall_timeout)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    def train_spec(data_path: str, out: str = "", *, resume: bool = resume) -> job.TrainSpec:
        """The trainer's options for this run, one place for each path (Slurm's job or mpirun from here)."""
        return job.TrainSpec(data=data_path, output=out, model=model, image_size=image_size, epochs=epochs,
                             batch_per_gpu=batch_per_gpu, warmup_epochs=warmup_epochs, workers=workers, resume=resume,
                             engine=engine, reducers=reducers, extra_args=tuple(trainer_args or ()))

    def body(c: clusters.Cluster, out: str, data_path: str,
             recover: Callable[[clusters.Cluster, list[str]], clusters.Cluster]) -> None:
        from launcher.execute import recovery
        from launcher.plans import faults, restarts

        history: list[restarts.Restart] = []
        make_data = not data
        while True:
            chosen = c.select_workers(nodes)
            if reducers > len(c.reducers):
                raise LaunchError(f"--reducers {reducers} is more than the {len(c.reducers)} reducer node(s) of "
                                  f"cluster '{c.name}'; bring one up with `launch local up --nodes N --reducers K`")
            spec = train_spec(data_path, out, resume=resume or bool(history))
            if checkpoint_to:
                store_region, aws_cli = job.checkpoint_store(c, region)
                spec = spec.model_copy(update={"checkpoint_to": checkpoint_to, "aws_region": store_region,
                                               "aws_cli": aws_cli})
            result = run.train(c, chosen, spec, make_data=make_data, reducers=c.reducers[:reducers], watch=watch)
            if history:
                recovery.write_record(c, chosen[0], out, history)
            # The run directory is on the cluster's storage, which --teardown deletes; a first node the watchdog
            # gave up on would only hold the verdict back by the fetch's timeout.
            if not c.shares_launcher_fs and chosen[0].name not in result.silent:
                _fetch_record(c, chosen[0], out, newest_checkpoint=teardown)
            if result.exit_code == 0 and not result.stopped:
                break
            used = chosen + c.reducers[:reducers]
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
                                      restarts_done=len(history), max_restarts=max_restarts,
                                      previous_lost=history[-1].lost if history else None, progressed=at is not None)
            if not verdict.retry:
                raise LaunchError(f"training failed: {verdict.why if max_restarts else why} (output above); "
                                  f"run directory {out}")
            newest = recovery.newest_checkpoint_epoch(c, chosen[0], out)
            step = restarts.Restart(attempt=len(history) + 1, why=why, lost=list(lost),
                                    resumed_from_epoch=newest + 1 if newest is not None else 0,
                                    epochs_lost=restarts.work_lost(at, newest), progress=list(at) if at else None)
            history.append(step)
            console.print(f"[launch] restart {step.attempt} of {max_restarts}: {why}; replacing {', '.join(lost)} "
                          f"and resuming at epoch {step.resumed_from_epoch} ({step.epochs_lost:g} epoch(s) of "
                          f"work lost)", markup=False, highlight=False)
            c = recover(c, list(lost))
            if make_data:  # the sample data is on the run's storage already
                data_path, make_data = f"{out}/shards", False
        if history:
            console.print(f"[launch] the run took {len(history)} restart(s), "
                          f"{sum(h.epochs_lost for h in history):g} epoch(s) of work repeated; "
                          f"record: {out}/{restarts.RECORD_FILE}", markup=False, highlight=False)
        _report(chosen, spec, result, c)

    c, stack = target(cluster)
    if stack is None and c is not None and c.head is not None and _head_answers(c, nodes):
        _on_slurm(c, nodes=nodes, data=data, output=output or f"{c.shared_root}/runs/{stamp}", teardown=teardown,
                  max_restarts=max_restarts, stall_timeout=stall_timeout, region=region, checkpoint_to=checkpoint_to,
                  spec=train_spec(data or ""))
        return
    if stack is None:
        assert c is not None
        try:

            if c.shares_launcher_fs:  # loopback nodes see this machine's paths
                body(c, run.local_output(output, stamp), str(Path(data).expanduser().resolve()) if data else "",
                     local.replace_local)
            else:  # rehearsal nodes, like EC2 instances, see their own disks and the shared storage only
                body(c, output or f"{c.shared_root or c.nodes[0].workdir}/runs/{stamp}", data or "",
                     local.replace_local)
        finally:
            if teardown:
                _teardown(c)
        return

    from launcher.execute import awsrun

    sess = stack_session(c, stack, region, profile, cluster=cluster)  # no such stack: the line status gives
    if max_restarts:  # a replacement node must find the run's storage by itself: one line, before anything starts
        from launcher.cluster.aws import api as aws
        from launcher.plans import storage

        if problem := storage.restarts_problem(aws.stack_outputs(sess, stack).storage, max_restarts):
            raise LaunchError(problem)

    def ready() -> clusters.Cluster:
        found = awsrun.connect_ready(sess, stack, profile=profile, timeout_s=ready_timeout)
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

    def on_aws() -> None:
        from launcher.cluster.aws import lifecycle

        found = ready()
        chosen = found.select_workers(nodes)
        path = lifecycle.run_path(found, engine=engine, reducers=reducers)
        if path.note:
            awsrun.say(path.note)
        staged = awsrun.stage_data(found, chosen, data) if data else ""
        if not path.slurm:
            body(found, output or f"{awsrun.shared_root(found) or chosen[0].workdir}/runs/{stamp}", staged, replaced)
            return
        # A stack with a head node runs the job as the local cluster with Slurm does: the cluster owns it, and with
        # --teardown the job's epilog takes the stack down (as_slurm_job tells with_teardown).
        out = output or f"{awsrun.shared_root(found)}/runs/{stamp}"
        spec = train_spec(staged)
        awsrun.as_slurm_job(found, out, lambda: _on_slurm(
            found, nodes=nodes, data=staged, output=out, teardown=teardown, max_restarts=max_restarts,
            stall_timeout=stall_timeout, region=region, checkpoint_to=checkpoint_to, spec=spec), handover)

    awsrun.check_data(sess, stack, data)  # a bucket the nodes may not read: one line, before anything starts
    awsrun.with_teardown(sess, stack, teardown, on_aws, instead=lambda: handover["line"])


def _on_slurm(c: clusters.Cluster, *, nodes: int | None, data: str | None, output: str, teardown: bool,
              max_restarts: int, stall_timeout: float, region: str | None, checkpoint_to: str | None,
              spec: job.TrainSpec) -> None:
    """The run as a Slurm job the cluster owns: render its batch script, submit it on the head node, print its id,
    follow rank 0 until it ends (Ctrl-C detaches; the job runs on), then report as a followed run does."""
    import shlex

    from launcher.plans import slurm

    if spec.reducers > len(c.reducers):
        raise LaunchError(f"--reducers {spec.reducers} is more than the {len(c.reducers)} reducer node(s) of cluster "
                          f"'{c.name}'; bring one up with `launch local up --slurm --nodes N --reducers K`")
    chosen = c.select_workers(nodes)
    first = chosen[0]
    spec = spec.model_copy(update={"output": output})
    if checkpoint_to:
        store_region, aws_cli = job.checkpoint_store(c, region)
        spec = spec.model_copy(update={"checkpoint_to": checkpoint_to, "aws_region": store_region,
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
        mpirun=tuple(argv), max_restarts=max_restarts, stall_timeout_s=stall_timeout, teardown=teardown,
        shared_memory_gib=_shared_memory_gib(c), reducers=spec.reducers,
        rendezvous_port=job.DDP_PORT if spec.engine in ("ddp", "reducer") else None))
    from launcher.cli.jobs import submit_and_follow

    job_id, ended, seen = submit_and_follow(c, script, output, f"{len(chosen)} node(s), run directory {output}")
    # The run's record (and, before a teardown, its newest checkpoint) comes to this machine as after any run,
    # successful or not; the cluster's teardown waits for the TTL guard's next run (locally a grace period).
    _fetch_record(c, first, output, newest_checkpoint=teardown)
    if teardown:  # the job's epilog does it on the cluster's side (plans/slurm.epilog_script)
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
    _report(chosen, spec, run.RunResult(0, output, train_images, summary, seen), c)


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


def _fetch_record(c: clusters.Cluster, first: clusters.Node, out: str, *, newest_checkpoint: bool) -> None:
    """Bring the run's record (and, before a teardown, its newest checkpoint) to this machine; a failure here is a
    warning, never the run's verdict."""
    from launcher.execute import results

    dest = results.local_copy(clusters.state_root(), c.name, out)
    try:
        got = results.fetch(c, first, out, dest, newest_checkpoint=newest_checkpoint, timeout_s=60)
    except LaunchError as e:
        console.print(f"warning: could not fetch the run's record from {first.name}: {e}", markup=False,
                      highlight=False)
        return
    size = sum(f.size for f in got)
    console.print(f"fetched {len(got)} file(s), {size / 2**20:,.1f} MiB, from {first.name}:{out} to {dest}",
                  markup=False, highlight=False)


def _report(chosen, spec: job.TrainSpec, result: run.RunResult, cluster: clusters.Cluster | None = None) -> None:
    import datetime as dt

    from launcher.cost import measured
    from launcher.cost import shell as costshell
    from launcher.cost.inputs import Workload
    from launcher.cost.model import compare, estimate
    from launcher.cost.runcheck import check_run
    from training.model import flops_per_image, parameter_count

    s = result.summary or {}
    top1 = "n/a" if s.get("top1") is None else f"{s['top1']:.1%}"
    top5 = "n/a" if s.get("top5") is None else f"{s['top5']:.1%}"
    console.print(f"\nrun finished: {spec.model} on {len(chosen)} node(s) / {s.get('ranks', '?')} rank(s), "
                  f"{spec.epochs} epochs, top-1 {top1}, top-5 {top5}, "
                  f"{s.get('images_per_sec', 0):.0f} img/s, {s.get('time_s', 0):.0f} s")
    console.print(f"metrics: {result.output}/metrics.jsonl   checkpoints: {result.output}/checkpoint-epoch*.pt")
    images = result.train_images
    ratio = flops_per_image(spec.model, spec.image_size) / flops_per_image("resnet50", 224)
    per_epoch = s["steps_per_epoch"] * s["global_batch"] if s.get("steps_per_epoch") and s.get("global_batch") \
        else images
    workload = Workload(images_per_epoch=max(per_epoch, 1), epochs=spec.epochs, flops_ratio=ratio,
                        param_count=parameter_count(spec.model, s.get("classes", 1000)))
    figures, _ = costshell.load_measured()
    constants, _ = costshell.model_constants()

    # Measured against predicted, for the shape that ran.
    c = cluster or costshell.cluster_of(list(chosen))
    ran_on = c.instance_type if c is not None and c.backend == "aws" else None
    on_gpus = s.get("device") not in (None, "cpu")
    if not (ran_on and on_gpus):
        where = f"{c.backend} cluster '{c.name}'" if c is not None else "this cluster"
        console.print(f"\nmeasured vs predicted: not available -- the model predicts GPU instance types from the "
                      f"catalog, and this run's {s.get('ranks', '?')} rank(s) ran on "
                      f"{'CPUs' if not on_gpus else 'GPUs of an unknown instance type'} of the {where}.")
    elif not (s.get("train_images") and s.get("images_per_sec") and s.get("time_s")):
        console.print("\nmeasured vs predicted: not available -- the run trained no images (summary.json)")
    else:
        try:
            instance = costshell.instance(ran_on)
            book = costshell.price_book([instance], ["on-demand"], refresh=False)
            predicted = estimate(
                instance, len(chosen), workload, batch_per_gpu=spec.batch_per_gpu, measured=figures,
                precision="fp32" if s.get("precision") == "fp32" else "amp", price=book.quote(ran_on, "on-demand"),
                constants=constants)
            check = check_run(predicted, images=s["train_images"], images_per_sec=s["images_per_sec"],
                              loop_s=s["time_s"], steady_images_per_sec=s.get("steady_images_per_sec"))
        except (ValueError, LaunchError) as e:
            console.print(f"\nmeasured vs predicted: no prediction ({e})")
        else:
            table = Table(title=f"measured vs predicted: {predicted.shape}, {predicted.market}")
            for col in ("", "measured", "predicted", "off by"):
                table.add_column(col, justify="left" if not col else "right", no_wrap=True)
            for what, got, want, off in check.rows:
                table.add_row(what, got, want, f"{off:+.1%}")
            console.print(table)
            console.print(check.verdict())
            console.print(f"per-GPU figure: {predicted.throughput_source.split(':')[0]}; "
                          f"{book.quote(ran_on, 'on-demand').label()}")
            found = measured.from_run(instance, nodes=len(chosen), model=spec.model, image_size=spec.image_size,
                                      summary=s, run_dir=result.output, today=dt.date.today())
            if found:
                try:
                    measured.record(measured.path(clusters.state_root()), *found)
                    console.print(f"recorded {found[1].img_per_sec:,.0f} img/s per GPU as this project's measured "
                                  f"{found[0]} figure; the cost model now uses it")
                except OSError as e:
                    err.print(f"warning: could not record the measured {found[0]} figure ({e.strerror or e})")

    table = Table(title=f"the same run on AWS ({len(chosen)} node(s), {images} images x {spec.epochs} epochs)")
    for col in ("instance", "img/s", "limited by", "time", "cost (USD)"):
        table.add_column(col, justify="left" if col in ("instance", "limited by") else "right", no_wrap=True)
    estimates = compare(["p3.16xlarge", "p4d.24xlarge", "p5.48xlarge"], len(chosen), workload,
                        batch_per_gpu=spec.batch_per_gpu, constants=constants)
    for e in estimates:
        table.add_row(e.instance_type, f"{e.images_per_sec:,.0f}", e.limited_by, f"{e.time_to_train_s / 60:.1f} min",
                      f"{e.cost_usd:,.2f}")
    console.print(table)
    dates = ", ".join(f"{e.instance_type} {e.price_date}" for e in estimates)
    console.print(f"us-east-1 on-demand prices as of {dates}; time includes provisioning "
                  f"({estimates[0].provisioning_s:.0f} s) and staging the data; `launch cost` compares more shapes.")


def _teardown(c: clusters.Cluster) -> None:
    if c.backend == "local":
        local.down(c)
        console.print(f"cluster '{c.name}' is down (--teardown)")
    else:
        from launcher.cluster.aws import api as aws

        assert c.aws is not None
        aws.teardown(aws.session(c.aws.region, c.aws.profile), c.aws.stack)
