"""The `launch` command line. Each command parses, calls the core, and prints; errors are one line."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from launcher import cluster as clusters
from launcher import local, plan, remote, run
from launcher.errors import LaunchError

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="scaletrain: provision a GPU cluster, shard ImageNet, train ResNet-50 with Horovod over "
                       "MPI, and report what it cost. The same commands drive a local cluster of SSH nodes.")
local_app = typer.Typer(no_args_is_help=True, help="A local cluster of real sshd nodes on 127.0.0.1.")
data_app = typer.Typer(no_args_is_help=True, help="Sample data in the ILSVRC2012 layout; conversion to shards.")
app.add_typer(local_app, name="local")
app.add_typer(data_app, name="data")
console = Console(soft_wrap=True)
err = Console(stderr=True, soft_wrap=True)

ClusterOpt = typer.Option(None, "--cluster", help="Cluster name; defaults to the only cluster there is.")


@contextlib.contextmanager
def _progress(what: str, total: int) -> Iterator[Callable[[], None]]:
    """A progress bar with images/s and ETA on a terminal; yields the per-image tick."""
    bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]:>8} img/s"),
                   TimeRemainingColumn(), console=err, disable=not err.is_terminal)
    with bar:
        task = bar.add_task(what, total=max(total, 0), rate="")
        start = time.perf_counter()

        def tick() -> None:
            done = bar.tasks[0].completed + 1
            bar.update(task, advance=1, rate=f"{done / max(time.perf_counter() - start, 1e-9):.0f}")

        yield tick


@local_app.command("up")
def local_up(nodes: int = typer.Option(2, "--nodes", help="Worker nodes."),
             reducers: int = typer.Option(0, "--reducers", help="Reducer nodes (CPU-only role)."),
             base_port: int = typer.Option(None, "--base-port", help="First port; default: free ports.")):
    """Start one sshd per node on 127.0.0.1 and write the cluster's keys, ssh_config and known_hosts."""
    c = local.up(nodes, reducers, base_port)
    console.print(f"cluster '{c.name}' is up: {len(c.workers)} worker(s), {len(c.reducers)} reducer(s)")
    for n in c.nodes:
        console.print(f"  {n.name:<10} {n.role:<8} {n.address}:{n.port}  pid {c.processes[n.name]}  {n.workdir}")
    console.print(f"ssh_config: {c.ssh_config}   (try: ssh -F {c.ssh_config} {c.nodes[0].name})")


@local_app.command("down")
def local_down(cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Stop the local cluster's sshd processes and remove its state."""
    c = clusters.load(cluster)
    if c.backend != "local":
        raise LaunchError(f"cluster '{c.name}' is an AWS cluster; bring it down with `launch down`")
    stopped = local.down(c)
    console.print(f"cluster '{c.name}' is down ({stopped} sshd process(es) stopped)")


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(command: list[str] = typer.Argument(..., help="The command (after --), run by each node's shell."),
          cluster: str = ClusterOpt):
    """Run one command on every node in parallel; output is prefixed by node."""
    c = clusters.load(cluster)
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


@app.command("status")
def status(cluster: str = ClusterOpt):
    """Nodes of a cluster and whether each answers over SSH."""
    c = clusters.load(cluster)
    answers = {r.node: r for r in remote.run_all(c, c.nodes, "uptime -p 2>/dev/null || uptime")}
    table = Table(title=f"cluster '{c.name}' ({c.backend})")
    for col in ("node", "role", "address", "slots", "state", "uptime"):
        table.add_column(col)
    for n in c.nodes:
        r = answers[n.name]
        table.add_row(n.name, n.role, n.address, str(n.slots), "ready" if r.ok else f"unreachable: {r.error}",
                      r.stdout.strip() if r.ok else "")
    console.print(table)
    if not all(r.ok for r in answers.values()):
        raise typer.Exit(1)


@data_app.command("sample")
def data_sample(out: Path = typer.Option(..., "--out", help="Directory to create (ILSVRC2012 layout)."),
                classes: int = typer.Option(10, "--classes", help="Number of classes (2..1000)."),
                per_class: int = typer.Option(100, "--per-class", help="Training images per class."),
                val_per_class: int = typer.Option(None, "--val-per-class",
                                                  help="Validation images per class; default per-class/5."),
                seed: int = typer.Option(0, "--seed", help="Same seed, same bytes.")):
    """Write a synthetic data set in the real ILSVRC2012 layout, learnable by a small network."""
    from training.sample import make_sample

    total = classes * (per_class + (val_per_class if val_per_class is not None else max(2, per_class // 5)))
    with _progress("sample", total) as tick:
        try:
            summary = make_sample(out, classes=classes, per_class=per_class, val_per_class=val_per_class,
                                  seed=seed, on_image=tick)
        except ValueError as e:
            raise LaunchError(str(e)) from None
    console.print(f"wrote {summary['train']} training and {summary['val']} validation images "
                  f"in {classes} classes to {out}")


@data_app.command("convert")
def data_convert(src: Path = typer.Argument(..., help="ILSVRC2012 root with train/<wnid>/ and val/<wnid>/."),
                 out: Path = typer.Option(..., "--out", help="Directory for the shards and manifest.json."),
                 shard_size: int = typer.Option(1000, "--shard-size", help="Samples per shard."),
                 seed: int = typer.Option(0, "--seed", help="Shuffle seed.")):
    """Convert an ImageNet-layout directory into WebDataset shards with a manifest."""
    from training.convert import convert

    if not src.exists():
        raise LaunchError(f"SRC {src} does not exist")
    total = sum(1 for split in ("train", "val") for p in (src / split).glob("*/*") if p.is_file())
    with _progress("convert", total) as tick:
        try:
            manifest = convert(src, out, shard_size=shard_size, seed=seed, on_sample=tick)
        except ValueError as e:
            raise LaunchError(str(e)) from None
    splits = ", ".join(f"{k}: {v['samples']} samples in {v['shards']} shards"
                       for k, v in manifest["splits"].items())
    console.print(f"wrote {out}/manifest.json ({splits}); {len(manifest['rejected'])} input(s) rejected")
    for r in manifest["rejected"]:
        err.print(f"  rejected {r['path']}: {r['reason']}", markup=False, highlight=False)


@app.command("train", context_settings={"allow_interspersed_args": False})
def train(trainer_args: list[str] = typer.Argument(None, help="Extra trainer options after --, e.g. -- "
                                                             "--label-smoothing 0.1 (see python -m training.train "
                                                             "--help)."),
          cluster: str = ClusterOpt,
          nodes: int = typer.Option(None, "--nodes", help="Worker nodes to use; default all."),
          data: str = typer.Option(None, "--data", help="Shards directory (as the nodes see it); "
                                                       "default: make sample data and convert it."),
          model: str = typer.Option("resnet50", "--model", help="resnet18, resnet34, resnet50 or resnet101."),
          image_size: int = typer.Option(224, "--image-size", help="Training crop size in px."),
          epochs: int = typer.Option(90, "--epochs"),
          batch_per_gpu: int = typer.Option(256, "--batch-per-gpu", help="Images per rank per step."),
          warmup_epochs: float = typer.Option(None, "--warmup-epochs", help="Default: 10 (seed 000)."),
          workers: int = typer.Option(2, "--workers", help="Data loader processes per rank."),
          output: str = typer.Option(None, "--output", help="Run directory; default runs/<time>."),
          resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in --output."),
          teardown: bool = typer.Option(False, "--teardown", help="Bring the cluster down afterwards, "
                                                                  "also on failure or Ctrl-C.")):
    """Train on the cluster with Horovod over mpirun; stream rank 0; report accuracy and AWS cost."""
    from training.model import check_model

    try:
        check_model(model)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    for name, value in (("--epochs", epochs), ("--batch-per-gpu", batch_per_gpu), ("--image-size", image_size)):
        if value < 1:
            raise LaunchError(f"{name} must be >= 1, got {value}")
    c = clusters.load(cluster)
    try:
        chosen = c.select_workers(nodes)
        if resume and output is None:
            raise LaunchError("--resume needs --output: the run directory holding the checkpoints")
        out = run.local_output(output, time.strftime("%Y%m%d-%H%M%S"))
        data_path = str(Path(data).expanduser().resolve()) if data else ""
        spec = plan.TrainSpec(data=data_path, output=out, model=model, image_size=image_size, epochs=epochs,
                              batch_per_gpu=batch_per_gpu, warmup_epochs=warmup_epochs, workers=workers,
                              resume=resume, extra_args=tuple(trainer_args or ()))
        result = run.train(c, chosen, spec, make_data=not data)
        if result.exit_code != 0:
            raise LaunchError(f"training failed: mpirun on {chosen[0].name} exited {result.exit_code} "
                              f"(output above); run directory {out}")
        _report(chosen, spec, result)
    finally:
        if teardown:
            _teardown(c)


def _report(chosen, spec: plan.TrainSpec, result: run.RunResult) -> None:
    from launcher import costmodel
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
    workload = costmodel.Workload(images_per_epoch=images, epochs=spec.epochs, flops_ratio=ratio,
                                  param_count=parameter_count(spec.model, s.get("classes", 1000)))
    table = Table(title=f"the same run on AWS ({len(chosen)} node(s), {images} images x {spec.epochs} epochs)")
    for col in ("instance", "img/s", "bound by", "time", "cost (USD)"):
        table.add_column(col, justify="left" if col in ("instance", "bound by") else "right", no_wrap=True)
    estimates = costmodel.compare(["p3.16xlarge", "p4d.24xlarge", "p5.48xlarge"], len(chosen), workload,
                                  batch_per_gpu=spec.batch_per_gpu)
    for e in estimates:
        table.add_row(e.instance_type, f"{e.images_per_sec:,.0f}", e.bottleneck, f"{e.time_to_train_s / 60:.1f} min",
                      f"{e.cost_usd:,.2f}")
    console.print(table)
    dates = ", ".join(f"{e.instance_type} {e.price_date}" for e in estimates)
    console.print(f"us-east-1 on-demand prices as of {dates}; time includes a fixed start-up "
                  f"(provisioning, data staging).")


def _teardown(c: clusters.Cluster) -> None:
    if c.backend == "local":
        local.down(c)
        console.print(f"cluster '{c.name}' is down (--teardown)")
    else:
        raise LaunchError(f"cluster '{c.name}' is on AWS; tear it down with `npx cdk destroy`")


def main(argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, prog_name="launch", standalone_mode=False)
    except click.UsageError as e:
        hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx else ""
        print(f"error: {e.format_message()}{hint}", file=sys.stderr)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        return 130
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return rv if isinstance(rv, int) else 0
