"""What `launch train` does after a run: bring its record to this machine, and report accuracy, measured against
predicted throughput, and what the same run would cost on AWS."""

from __future__ import annotations

from rich.table import Table

from launcher import cluster as clusters
from launcher.cli.common import console, err
from launcher.errors import LaunchError
from launcher.execute import run
from launcher.plans import job


def fetch_record(c: clusters.Cluster, first: clusters.Node, out: str, *, newest_checkpoint: bool) -> None:
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


def report(chosen, spec: job.TrainSpec, result: run.RunResult, cluster: clusters.Cluster | None = None) -> None:
    """The run's verdict: accuracy and speed from its summary, measured against predicted for the shape that ran
    (recorded as the project's measured figure when it ran on GPUs of a catalog type), and the same run's cost on
    AWS's instance families."""
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
