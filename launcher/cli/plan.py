"""`launch plan` (one cluster shape, offline: hostfile, mpirun line, env, EFA devices, LR schedule, estimate) and
`launch cost` (many shapes compared, and a report written)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer
from rich.table import Table

from launcher.cli.common import console, err, option_names, usage_error, validation_error
from launcher.errors import LaunchError
from launcher.plans import job

app = typer.Typer()


@app.command("plan")
def plan_cmd(nodes: int = typer.Option(..., "--nodes", help="Worker nodes."),
             instance_type: str = typer.Option(..., "--instance-type", help="Worker instance type, e.g. p4d.24xlarge."),
             reducers: int = typer.Option(None, "--reducers", help="CPU nodes of the reducer tier (parameter "
                                                                   "servers with --strategy ps); 0: none. Default: "
                                                                   "the model's count with --strategy reducers/ps."),
             reducer_type: str = typer.Option(None, "--reducer-type", help="Their instance type; default "
                                                                          "c5n.18xlarge (reducers), m5.24xlarge (ps)."),
             strategy: str = typer.Option(None, "--strategy", help="horovod, reducers or ps; default: reducers "
                                                                   "with --reducers or --reducer-type, else horovod."),
             epochs: int = typer.Option(90, "--epochs"),
             batch_per_gpu: int = typer.Option(256, "--batch-per-gpu", help="Images per rank per step."),
             warmup_epochs: float = typer.Option(None, "--warmup-epochs", help="Linear warmup, in epochs, less "
                                                 "than --epochs; default: the seed's 10 of every 90 (10 for 90, "
                                                 "1.67 for 15), as the trainer's."),
             images_per_epoch: int = typer.Option(1_281_167, "--images-per-epoch", help="Default: ImageNet-1k."),
             gpu_throughput: float = typer.Option(None, "--gpu-throughput", help="Single-GPU ResNet-50 images/s; "
                                                                                "overrides the catalog's figure."),
             precision: str = typer.Option("amp", "--precision", help="amp (mixed precision) or fp32."),
             fp16_allreduce: bool = typer.Option(False, "--fp16-allreduce", help="fp16 gradient compression (the "
                                                                                 "trainer's --fp16-allreduce too)."),
             resized_shards: bool = typer.Option(False, "--resized-shards", help="The shards were converted with "
                                                 "`launch data convert --resize 256`: the loader decodes faster."),
             market: str = typer.Option("on-demand", "--market", help="on-demand or spot (spot prices come from "
                                                                     "`launch cost --refresh-prices`)."),
             as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables.")):
    """The plan and estimate for one cluster shape, offline: hostfile, mpirun, env, EFA devices, LR schedule, cost."""
    import json

    from launcher.cost import shell as costshell
    from launcher.cost.inputs import DEFAULT_TIER_TYPE, STRATEGIES, STRATEGY_LABELS, imagenet
    from launcher.cost.model import Estimate
    from launcher.cost.prices import MARKETS, PriceUnavailable
    from launcher.plans import offline
    from training.schedule import default_warmup_epochs, warmup_problem

    check_nodes(nodes)
    for name, value, low in (("--epochs", epochs, 1), ("--batch-per-gpu", batch_per_gpu, 1),
                             ("--images-per-epoch", images_per_epoch, 1), ("--reducers", reducers, 0)):
        if value is not None and value < low:
            raise usage_error(f"{name} must be >= {low}, got {value}")
    check_throughput(gpu_throughput)
    check_precision(precision)
    warmup_epochs = default_warmup_epochs(epochs) if warmup_epochs is None else warmup_epochs
    if problem := warmup_problem(warmup_epochs, epochs):
        raise usage_error(problem)
    if market not in MARKETS:
        raise usage_error(f"unknown market '{market}'; choose one of: {', '.join(MARKETS)}")
    workers = catalog_type(instance_type, "--instance-type")
    if reducer_type:
        catalog_type(reducer_type, "--reducer-type")
    # An explicit --reducers 0 means no tier; only a count left out takes the model's default.
    if reducers == 0 and reducer_type and strategy is None:
        err.print(f"warning: --reducers 0 plans no reducer tier; --reducer-type {reducer_type} is not used",
                  markup=False, highlight=False)
        reducer_type = None
    strategy = strategy or ("reducers" if reducers or reducer_type else "horovod")
    if strategy not in STRATEGIES:
        raise usage_error(f"unknown strategy '{strategy}'; choose one of: {', '.join(STRATEGIES)}")
    tier = costshell.instance(reducer_type or DEFAULT_TIER_TYPE[strategy]) \
        if strategy != "horovod" or reducer_type else None
    workload = imagenet(epochs, fp16_allreduce=fp16_allreduce)
    if images_per_epoch != workload.images_per_epoch:
        workload = workload.model_copy(update={"images_per_epoch": images_per_epoch, "dataset_bytes": None})
    figures, note = costshell.load_measured()
    constants, loader_note = costshell.model_constants()
    book = costshell.price_book([workers] + ([tier] if tier else []), [market], refresh=False)
    for line in [*book.notes, *(n for n in (note, loader_note) if n)]:
        err.print(f"warning: {line}", markup=False, highlight=False)
    try:
        doc = offline.plan_document(
            workers, nodes, workload, strategy=strategy, tier=tier, tier_nodes=reducers,
            batch_per_gpu=batch_per_gpu, warmup_epochs=warmup_epochs, gpu_throughput=gpu_throughput,
            precision=precision, measured=figures, price=book.quote(workers.name, market),  # type: ignore[arg-type]
            tier_price=book.quote(tier.name, market) if tier else None,  # type: ignore[arg-type]
            constants=constants, resized_shards=resized_shards)
    except PriceUnavailable as e:  # what this machine knows (no cached spot price), not the command line
        raise LaunchError(str(e)) from None
    except ValueError as e:  # a shape or option the plan cannot be made for (no GPUs, fewer images than a batch)
        raise usage_error(str(e)) from None
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    e = Estimate.model_validate(doc["estimate"])
    console.print(f"plan: {e.shape}, {doc['shape']['ranks']} rank(s), {STRATEGY_LABELS[e.strategy]}, "
                  f"{e.market}", markup=False)
    table = Table(title="estimate", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    for what, value in (
        ("per-GPU throughput", f"{e.gpu_images_per_sec:,.0f} img/s ({e.throughput_source.split(':')[0]})"),
        ("compute per step", f"{e.compute_time_s * 1e3:,.1f} ms"),
        ("gradient reduction per step", f"{e.comm_time_s * 1e3:,.1f} ms ({e.exposed_comm_time_s * 1e3:,.1f} ms "
                                        f"not hidden; limited by {e.comm_limited_by})"),
        ("step", f"{e.step_time_s * 1e3:,.1f} ms"),
        ("throughput", f"{e.images_per_sec:,.0f} img/s, {e.scaling_efficiency:.1%} scaling"),
        ("limited by", e.limited_by),
        ("input pipeline", f"{e.loader_workers_per_rank} loader processes per GPU: {e.loader_images_per_sec:,.0f} "
                           f"img/s against {e.gpu_demand_images_per_sec:,.0f} the GPUs would take"),
        ("epoch (with checkpoint)", f"{e.epoch_time_s:,.1f} s"),
        ("training", f"{e.training_s / 60:,.1f} min ({epochs} epochs + validation)"),
        ("provisioning + staging", f"{(e.provisioning_s + e.staging_s) / 60:,.1f} min"),
        ("time to train", f"{e.time_to_train_s / 60:,.1f} min"),
        ("cluster price", f"${e.cluster_usd_per_hour:,.2f}/h ({e.market}, as of {e.price_date})"),
        ("cost", f"${e.cost_usd:,.2f} (${e.cost_per_epoch_usd:,.2f} per epoch)"),
    ):
        table.add_row(what, value)
    console.print(table)
    console.print(e.advice, markup=False, highlight=False)  # input-, network- or compute-bound; what would change it
    nodes_table = Table(title="worker nodes")
    for col in ("node", "slots", "EFA interfaces (network card: device index)"):
        nodes_table.add_column(col)
    for dev in doc["efa_devices"]:
        cards = ", ".join(f"{i['network_card_index']}:{i['device_index']}" for i in dev["interfaces"]) or "none"
        nodes_table.add_row(dev["node"], str(workers.gpus), cards)
    console.print(nodes_table)
    if doc["reducer_nodes"]:
        console.print(f"{e.strategy} nodes: {', '.join(doc['reducer_nodes'])} ({e.tier_type})")
    console.print("env: " + " ".join(f"{k}={v}" for k, v in doc["env"].items()), markup=False, highlight=False)
    console.print("hostfile:\n" + doc["hostfile"].rstrip(), markup=False, highlight=False)
    console.print("mpirun: " + job.command_line(doc["mpirun"]), markup=False, highlight=False)
    schedule = doc["lr_schedule"]
    peak_epoch, peak = max(schedule, key=lambda row: row[1])
    console.print(f"lr: {schedule[0][1]:g} at epoch 0, peak {peak:g} at epoch {peak_epoch}, {schedule[-1][1]:g} at "
                  f"epoch {schedule[-1][0]} after {doc['warmup_epochs']:g} warmup epoch(s) "
                  f"({doc['steps_per_epoch']} steps per epoch, global batch {doc['global_batch']}; every epoch with "
                  f"--json)")
    for line in e.assumptions + doc["notes"]:
        console.print(f"  - {line}", markup=False, highlight=False)


def check_nodes(nodes: int, option: str = "--nodes") -> None:
    """The one worker-node limit (infra.catalog.MAX_NODES), said as every command says it."""
    from infra.catalog import nodes_allowed

    if problem := nodes_allowed(nodes):
        raise usage_error(f"{option} {nodes}: {problem}")


def catalog_type(name: str, option: str):
    """The catalog's entry; a name it does not hold is a bad option value."""
    from launcher.cost import shell as costshell

    try:
        return costshell.instance(name)
    except LaunchError as e:
        raise usage_error(f"{option}: {e}") from None


def check_precision(precision: str) -> None:
    from typing import get_args

    from launcher.cost.inputs import Precision

    if precision not in get_args(Precision):
        raise usage_error(f"--precision must be one of: {', '.join(get_args(Precision))}; got '{precision}'")


def check_throughput(gpu_throughput: float | None) -> None:
    if gpu_throughput is not None and not 0 < gpu_throughput < float("inf"):
        raise usage_error(f"--gpu-throughput must be a number of images/s > 0, got {gpu_throughput:g}")


@app.command("cost")
def cost_cmd(instance_types: str = typer.Option(None, "--instance-types", help="Comma-separated GPU types; default "
                                                "p3.16xlarge,p3dn.24xlarge,p4d.24xlarge,p5.48xlarge."),
             nodes: str = typer.Option("1,2,4,8,16", "--nodes", help="Comma-separated worker node counts."),
             strategies: str = typer.Option("horovod,ps,reducers", "--strategies", help="Comma-separated: horovod "
                                            "(ring allreduce), ps (parameter servers), reducers (reducer tier)."),
             markets: str = typer.Option("on-demand", "--markets", help="on-demand, spot, or on-demand,spot."),
             reducer_type: str = typer.Option("c5n.18xlarge", "--reducer-type"),
             reducers_per_worker: float = typer.Option(1.0, "--reducers-per-worker"),
             ps_type: str = typer.Option("m5.24xlarge", "--ps-type", help="Parameter-server instance type."),
             ps_per_worker: float = typer.Option(2.0, "--ps-per-worker", help="Seed 003: 2 servers per worker."),
             epochs: int = typer.Option(90, "--epochs"),
             batch_per_gpu: int = typer.Option(256, "--batch-per-gpu"),
             images_per_epoch: int = typer.Option(1_281_167, "--images-per-epoch", help="Default: ImageNet-1k."),
             gpu_throughput: float = typer.Option(None, "--gpu-throughput", help="Single-GPU ResNet-50 images/s "
                                                                                "for every type (overrides)."),
             precision: str = typer.Option("amp", "--precision", help="amp or fp32."),
             fp16_allreduce: bool = typer.Option(False, "--fp16-allreduce"),
             refresh_prices: bool = typer.Option(False, "--refresh-prices", help="Fetch on-demand (Price List API) "
                                                 "and spot prices from AWS first and cache them."),
             out: str = typer.Option(None, "--out", help="Report directory; default reports/cost-<time>.")):
    """Compare cluster shapes on time to train and cost; write a report (Markdown, HTML, PNG plots, CSV)."""
    import datetime as dt

    from pydantic import ValidationError

    from infra.catalog import UnknownInstanceType
    from launcher.cost import report as costreport
    from launcher.cost import shell as costshell
    from launcher.cost.inputs import STRATEGY_LABELS, imagenet

    if out is not None and not out.strip():  # Path("") is ".": the report would land in the current directory
        raise usage_error(f"--out needs a directory name, got {out!r}")
    for name, value in (("--epochs", epochs), ("--batch-per-gpu", batch_per_gpu),
                        ("--images-per-epoch", images_per_epoch)):
        if value < 1:
            raise usage_error(f"{name} must be >= 1, got {value}")
    check_throughput(gpu_throughput)
    check_precision(precision)
    try:
        grid = costreport.CostGrid(
            instance_types=costshell.parse_list(instance_types, "--instance-types") if instance_types
            else costreport.DEFAULT_INSTANCE_TYPES,
            nodes=costshell.parse_list(nodes, "--nodes", int),
            strategies=costshell.parse_list(strategies, "--strategies"),
            markets=costshell.parse_list(markets, "--markets"), reducer_type=reducer_type,
            reducers_per_worker=reducers_per_worker, ps_type=ps_type, ps_per_worker=ps_per_worker,
            batch_per_gpu=batch_per_gpu, gpu_throughput=gpu_throughput, precision=precision)
        grid.check()
        workload = imagenet(epochs, fp16_allreduce=fp16_allreduce)
        if images_per_epoch != workload.images_per_epoch:
            workload = workload.model_copy(update={"images_per_epoch": images_per_epoch, "dataset_bytes": None})
    except ValidationError as e:
        raise validation_error(e) from None
    except (ValueError, UnknownInstanceType, LaunchError) as e:  # LaunchError: parse_list's one line
        raise usage_error(str(e)) from None
    types = [costshell.instance(n) for n in grid.instance_types]
    types += [costshell.instance(grid.reducer_type)] if "reducers" in grid.strategies else []
    types += [costshell.instance(grid.ps_type)] if "ps" in grid.strategies else []
    book = costshell.price_book(types, grid.markets, refresh=refresh_prices)
    figures, note = costshell.load_measured()
    constants, loader_note = costshell.model_constants()
    try:
        result = costreport.evaluate_grid(grid, workload, book, today=dt.date.today(), measured=figures,
                                          constants=constants)
    except ValueError as e:
        raise LaunchError(option_names(str(e))) from None
    for line in [*result.notes, *(n for n in (note, loader_note) if n)]:
        err.print(f"warning: {line}", markup=False, highlight=False)
    out = Path(out) if out is not None else Path("reports") / f"cost-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and not out.is_dir():
        raise LaunchError(f"--out {out} is a file; name a directory")
    try:
        costreport.write_report(out, costreport.render(result))
    except OSError as e:
        raise LaunchError(f"could not write the report to {out}: {e.strerror or e}") from None

    table = Table(title=f"Pareto frontier of {len(result.rows)} shapes: none is both faster and cheaper")
    for col in ("shape", "strategy", "market", "img/s", "scaling", "bound", "time to train", "cost (USD)"):
        table.add_column(col, justify="right" if col in ("img/s", "scaling", "time to train", "cost (USD)") else "left")
    for i in result.pareto:
        r = result.rows[i]
        table.add_row(r.shape, STRATEGY_LABELS[r.strategy], r.market, f"{r.images_per_sec:,.0f}",
                      f"{r.scaling_efficiency:.0%}", r.bound, f"{r.time_to_train_s / 60:,.0f} min",
                      f"{r.cost_usd:,.2f}")
    console.print(table)
    for i in result.pareto:  # what would change each frontier shape, said once per distinct verdict
        advice = result.rows[i].advice
        if advice not in [result.rows[j].advice for j in result.pareto[:result.pareto.index(i)]]:
            console.print(f"{result.rows[i].shape}: {advice}", markup=False, highlight=False)
    console.print("prices: " + "; ".join(f"{q.instance_type} {q.label()}" for q in result.prices), markup=False)
    console.print(f"report: {out / 'report.html'} (also report.md, grid.csv and {len(costreport.PLOTS)} PNG plots)",
                  markup=False, highlight=False)
