"""`launch plan` (one cluster shape, offline: hostfile, mpirun line, env, EFA devices, LR schedule, estimate) and
`launch cost` (many shapes compared, and a report written)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer
from rich.table import Table

from launcher.cli.common import check_named, console, err, output_dir, plural, usage_error, validation_error
from launcher.errors import LaunchError
from launcher.plans import checkpointing, job

app = typer.Typer()

# The workload options launch plan and launch cost share.
WorkloadOpt = typer.Option("resnet50", "--workload", help="resnet50 (seed 000's ImageNet recipe), bert-large "
                           "(NVIDIA's phase 1, seed 004) or mask-rcnn; a custom model with --params, --sample-gflops "
                           "and --samples-per-epoch.")
ParamsOpt = typer.Option(None, "--params", help="A custom model: parameters whose gradients are reduced.")
SampleGflopsOpt = typer.Option(None, "--sample-gflops", help="A custom model: training GFLOP per sample, forward + "
                               "backward (ResNet-50 at 224 px: 24.5).")
SamplesPerEpochOpt = typer.Option(None, "--samples-per-epoch", help="A custom model: samples per epoch.")


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
             epochs: int = typer.Option(None, "--epochs", help="1 to 10000; default: the workload's recipe "
                                                               "(resnet50: 90, bert-large: 1 pass of phase 1, "
                                                               "mask-rcnn: 14)."),
             batch_per_gpu: int = typer.Option(None, "--batch-per-gpu", help="Samples per rank per micro-batch; "
                                               "default: the published figure's (ResNet-50: 256)."),
             warmup_epochs: float = typer.Option(None, "--warmup-epochs", help="Linear warmup, in epochs, less "
                                                 "than --epochs; default: the seed's 10 of every 90 (10 for 90, "
                                                 "1.67 for 15), as the trainer's."),
             images_per_epoch: int = typer.Option(None, "--images-per-epoch", help="Samples per epoch; default: "
                                                  "the workload's (ImageNet-1k for resnet50)."),
             gpu_throughput: float = typer.Option(None, "--gpu-throughput", help="Single-GPU samples/s of the "
                                                  "workload (ResNet-50 images/s); overrides the catalog's figure."),
             precision: str = typer.Option("amp", "--precision", help="amp (mixed precision) or fp32."),
             fp16_allreduce: bool = typer.Option(False, "--fp16-allreduce", help="fp16 gradient compression (the "
                                                                                 "trainer's --fp16-allreduce too)."),
             resized_shards: bool = typer.Option(False, "--resized-shards", help="The shards were converted with "
                                                 "`launch data convert --resize 256`: the loader decodes faster."),
             market: str = typer.Option("on-demand", "--market", help="on-demand or spot (spot prices come from "
                                                                     "`launch cost --refresh-prices`)."),
             spot_interruption: str = typer.Option("<5%", "--spot-interruption", help="With --market spot: the "
                                                   "Spot Instance Advisor's frequency of interruption for the "
                                                   "type (<5%, 5-10%, 10-15%, 15-20%, >20%), for the checkpoint "
                                                   "interval."),
             workload_name: str = WorkloadOpt, params: int = ParamsOpt, sample_gflops: float = SampleGflopsOpt,
             samples_per_epoch: int = SamplesPerEpochOpt,
             max_cost: str = typer.Option(None, "--max-cost", metavar="USD", help="Say when the estimate (with "
                                          "the head node) exceeds this cap (`launch train --max-cost`)."),
             as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables.")):
    """The plan and estimate for one cluster shape, offline: hostfile, mpirun, env, EFA devices, LR schedule, cost."""
    import json

    from launcher.cli import budget as budgetcli

    cap = budgetcli.checked(max_cost)
    workload = chosen_workload(workload_name, epochs=epochs, images_per_epoch=images_per_epoch, params=params,
                               sample_gflops=sample_gflops, samples_per_epoch=samples_per_epoch,
                               fp16_allreduce=fp16_allreduce)
    epochs = workload.epochs

    from infra.catalog import nodes_allowed
    from launcher.cost import shell as costshell
    from launcher.cost.inputs import DEFAULT_TIER_TYPE, STRATEGIES, STRATEGY_LABELS
    from launcher.cost.model import Estimate, default_tier_nodes, tier_noun
    from launcher.cost.prices import MARKETS, PriceUnavailable
    from launcher.cost.shape import PriceOutOfRange
    from launcher.plans import offline
    from training.schedule import default_warmup_epochs, lr_at, peak_lr, peak_step, warmup_problem

    check_nodes(nodes)
    if reducers is not None:
        check_nodes(reducers, "--reducers", role="parameter server" if strategy == "ps" else "reducer")
    for name, value in (("--epochs", epochs), ("--batch-per-gpu", batch_per_gpu),
                        ("--images-per-epoch", images_per_epoch)):
        check_count(name, value)
    check_named("--strategy", strategy, "one of: horovod, reducers, ps")  # '' would quietly mean the default
    check_named("--reducer-type", reducer_type, "an instance type such as c5n.18xlarge")
    check_throughput(gpu_throughput)
    check_precision(precision)
    warmup_epochs = default_warmup_epochs(epochs) if warmup_epochs is None else warmup_epochs
    if problem := warmup_problem(warmup_epochs, epochs):
        raise usage_error(problem)
    if market not in MARKETS:
        raise usage_error(f"unknown market '{market}'; choose one of: {', '.join(MARKETS)}")
    if problem := checkpointing.bucket_problem(spot_interruption):
        raise usage_error(f"--spot-interruption: {problem}")
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
    if reducers is None and strategy != "horovod":  # the model's count per worker, held to --reducers' limit
        count, noun = default_tier_nodes(strategy, nodes), tier_noun(strategy)
        if problem := nodes_allowed(count, noun):
            raise usage_error(f"--strategy {strategy} with --nodes {nodes} makes {count:,} {noun} nodes "
                              f"({count // nodes} per worker): {problem}; set the count with --reducers")
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
    except (PriceUnavailable, PriceOutOfRange) as e:  # what this machine knows (its price cache), not the options
        raise LaunchError(str(e)) from None
    except ValueError as e:  # a shape or option the plan cannot be made for (no GPUs, fewer images than a batch)
        raise usage_error(str(e)) from None
    over = None
    if cap is not None:  # launcher/plans/budget.plan_line
        doc["budget"], over = budgetcli.plan_budget(doc["estimate"]["cost_usd"], doc["estimate"]["time_to_train_s"],
                                                    cap)
    if as_json:  # strict JSON (RFC 8259 has no inf or nan): the model refuses those figures (cost.shape.finite)
        sys.stdout.write(json.dumps(doc, indent=2, allow_nan=False) + "\n")
        return
    e = Estimate.model_validate(doc["estimate"])
    console.print(f"plan: {e.shape}, {doc['shape']['ranks']} rank(s), {STRATEGY_LABELS[e.strategy]}, "
                  f"{e.market}, workload {e.workload}", markup=False)
    table = Table(title="estimate", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    for what, value in (
        ("per-GPU throughput", f"{_n(e.gpu_images_per_sec, ',.0f')} {e.rate_unit} "
                               f"({e.throughput_source.split(':')[0]})"),
        ("compute per step", f"{_n(e.compute_time_s * 1e3, ',.1f')} ms" + (
            f" ({e.accumulation_steps} micro-batches of {e.batch_per_gpu} per GPU: gradient accumulation)"
            if e.accumulation_steps > 1 else f" (batch {e.batch_per_gpu} per GPU)")),
        ("gradient reduction per step", f"{_n(e.comm_time_s * 1e3, ',.1f')} ms "
                                        f"({_n(e.exposed_comm_time_s * 1e3, ',.1f')} ms not hidden; limited by "
                                        f"{e.comm_limited_by})"),
        ("stragglers + negotiation", f"{_n(e.sync_overhead_s * 1e3, ',.1f')} ms (the slowest of "
                                     f"{plural(e.nodes, 'node')})"),
        ("step", f"{_n(e.step_time_s * 1e3, ',.1f')} ms"),
        ("throughput", f"{_n(e.images_per_sec, ',.0f')} {e.rate_unit}, {e.scaling_efficiency:.1%} scaling"),
        ("limited by", e.limited_by),
        ("input pipeline", f"{e.loader_workers_per_rank} loader processes per GPU"
                           + (", JPEGs decoded on the GPUs (--decode gpu)" if e.decode == "gpu" else "")
                           + f": {_n(e.loader_images_per_sec, ',.0f')} img/s against "
                             f"{_n(e.gpu_demand_images_per_sec, ',.0f')} the GPUs would take"
                           if workload.decodes_images else f"no JPEG decoding modelled for {e.workload}"),
        ("epoch (with checkpoint)", f"{_n(e.epoch_time_s, ',.1f')} s"),
        ("training", f"{_n(e.training_s / 60, ',.1f')} min ({plural(epochs, 'epoch')} + validation)"),
        ("provisioning + staging", f"{_n((e.provisioning_s + e.staging_s) / 60, ',.1f')} min"),
        ("time to train", f"{_n(e.time_to_train_s / 60, ',.1f')} min"),
        ("cluster price", f"${_n(e.cluster_usd_per_hour, ',.2f')}/h ({e.market}, as of {e.price_date})"),
        ("cost", f"${_n(e.cost_usd, ',.2f')} (${_n(e.cost_per_epoch_usd, ',.2f')} per epoch)"),
    ):
        table.add_row(what, value)
    console.print(table)
    console.print(e.advice, markup=False, highlight=False)  # input-, network- or compute-bound; what would change it
    if over:
        console.print(over, markup=False, highlight=False)
    elif cap is not None:
        console.print(f"budget: the estimate, ${doc['budget']['estimate_usd']:,.2f} with the head node, is within "
                      f"--max-cost ${cap:,.2f}", markup=False, highlight=False)
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
    # From the schedule's function, not by scanning doc["lr_schedule"]: the peak falls where warmup ends, between
    # epoch boundaries when warmup is not whole epochs (a 1-epoch run's 0.11), and the line costs the same for any run.
    steps, warmup = doc["steps_per_epoch"], doc["warmup_epochs"]
    top = peak_lr(doc["global_batch"])

    def lr(step: int) -> float:
        return lr_at(step, steps, epochs, top, warmup)

    at = peak_step(steps, epochs, warmup)
    console.print(f"lr: {lr(0):g} at epoch 0, peak {lr(at):g} at epoch {round(at / steps, 2):g} (step {at:,}), "
                  f"{lr(steps * epochs):g} at epoch {epochs} after {warmup:g} warmup epoch(s) "
                  f"({doc['steps_per_epoch']} steps per epoch, global batch {doc['global_batch']}; every epoch with "
                  f"--json)")
    ckpt = checkpointing.advice(workload.checkpoint_bytes, constants.checkpoint_write_bytes_per_sec,
                                e.epoch_time_s - e.checkpoint_s, e.step_time_s, e.market, e.nodes, spot_interruption)
    for line in checkpointing.lines(ckpt, e.market, e.nodes, spot_interruption):
        console.print(line, markup=False, highlight=False)
    for line in e.assumptions + doc["notes"]:
        console.print(f"  - {line}", markup=False, highlight=False)


def _n(x: float, spec: str) -> str:
    """``x`` as ``spec`` (',.1f'), or in three significant digits where that would print 16+ digits or round a small
    figure to 0 (a per-GPU throughput of 1e-200 img/s, the centuries it takes): the tables stay readable."""
    return format(x, spec) if not x or 1e-9 <= abs(x) < 1e15 else f"{x:.3g}"


def check_nodes(nodes: int, option: str = "--nodes", *, role: str = "worker") -> None:
    """The one node limit (infra.catalog.MAX_NODES), said as every command says it."""
    from infra.catalog import nodes_allowed

    if problem := nodes_allowed(nodes, role):
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


def check_count(option: str, value: int | None) -> None:
    """A count the model divides (samples, parameters, a batch, epochs): >= 1 and at most cost.shape.MAX_COUNT
    (2**53, the largest whole number a float holds exactly; far beyond it the model's arithmetic overflowed)."""
    from launcher.cost.shape import MAX_COUNT

    if value is None:
        return
    if value < 1:
        raise usage_error(f"{option} must be >= 1, got {value}")
    if value > MAX_COUNT:
        digits = len(str(value))
        shown = f"{value:,}" if digits <= 24 else f"a {digits}-digit number"
        raise usage_error(f"{option} must be at most {MAX_COUNT:,} (2**53, the largest count the model holds "
                          f"exactly), got {shown}")


def check_throughput(gpu_throughput: float | None) -> None:
    if gpu_throughput is not None and not 0 < gpu_throughput < float("inf"):
        raise usage_error(f"--gpu-throughput must be a number of images/s > 0, got {gpu_throughput:g}")


def chosen_workload(name: str, *, epochs: int | None, images_per_epoch: int | None, params: int | None,
                    sample_gflops: float | None, samples_per_epoch: int | None, fp16_allreduce: bool):
    """--workload, or a custom model from --params/--sample-gflops/--samples-per-epoch; bad input is one line."""
    from launcher.cli.common import usage_error
    from launcher.cost import workloads
    from training.schedule import epochs_problem

    if epochs is not None and (problem := epochs_problem(epochs)):  # a plan builds its LR schedule per epoch
        raise usage_error(problem)
    for option, value in (("--images-per-epoch", images_per_epoch), ("--params", params),
                          ("--samples-per-epoch", samples_per_epoch)):
        check_count(option, value)
    custom = {"--params": params, "--sample-gflops": sample_gflops, "--samples-per-epoch": samples_per_epoch}
    given = [option for option, value in custom.items() if value is not None]
    try:
        if given:
            if len(given) < len(custom):
                missing = ", ".join(o for o in custom if o not in given)
                raise usage_error(f"a custom model needs --params, --sample-gflops and --samples-per-epoch; "
                                  f"missing {missing}")
            if name != "resnet50":
                raise usage_error(f"--workload {name} has its own model; --params, --sample-gflops and "
                                  f"--samples-per-epoch describe a custom one (leave out --workload)")
            workload = workloads.custom(params=params, sample_gflops=sample_gflops,  # type: ignore[arg-type]
                                        samples_per_epoch=samples_per_epoch, epochs=epochs or 1,  # type: ignore[arg-type]
                                        fp16_allreduce=fp16_allreduce)
        else:
            workload = workloads.preset(name, epochs=epochs, fp16_allreduce=fp16_allreduce)
    except ValueError as e:
        raise usage_error(f"--workload: {e}" if "unknown workload" in str(e) else str(e)) from None
    if images_per_epoch is not None and images_per_epoch != workload.images_per_epoch:
        workload = workload.model_copy(update={"images_per_epoch": images_per_epoch, "dataset_bytes": None})
    return workload


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
             epochs: int = typer.Option(None, "--epochs", help="1 to 10000; default: the workload's recipe."),
             batch_per_gpu: int = typer.Option(None, "--batch-per-gpu", help="Default: the published figure's."),
             images_per_epoch: int = typer.Option(None, "--images-per-epoch", help="Default: the workload's."),
             gpu_throughput: float = typer.Option(None, "--gpu-throughput", help="Single-GPU ResNet-50 images/s "
                                                                                "for every type (overrides)."),
             precision: str = typer.Option("amp", "--precision", help="amp or fp32."),
             fp16_allreduce: bool = typer.Option(False, "--fp16-allreduce"),
             refresh_prices: bool = typer.Option(False, "--refresh-prices", help="Fetch on-demand (Price List API) "
                                                 "and spot prices from AWS first and cache them."),
             workload_name: str = WorkloadOpt, params: int = ParamsOpt, sample_gflops: float = SampleGflopsOpt,
             samples_per_epoch: int = SamplesPerEpochOpt,
             out: str = typer.Option(None, "--out", help="Report directory; default reports/cost-<time>.")):
    """Compare cluster shapes on time to train and cost; write a report (Markdown, HTML, PNG plots, CSV)."""
    import datetime as dt

    workload = chosen_workload(workload_name, epochs=epochs, images_per_epoch=images_per_epoch, params=params,
                               sample_gflops=sample_gflops, samples_per_epoch=samples_per_epoch,
                               fp16_allreduce=fp16_allreduce)
    epochs, images_per_epoch = workload.epochs, workload.images_per_epoch
    if batch_per_gpu is None and workload.name in ("resnet50", "custom"):
        batch_per_gpu = 256  # others: each GPU type's published batch (the grid's None)

    from pydantic import ValidationError

    from infra.catalog import UnknownInstanceType
    from launcher.cost import report as costreport
    from launcher.cost import shell as costshell
    from launcher.cost.inputs import STRATEGY_LABELS
    from launcher.cost.shape import PriceOutOfRange

    # Where the report goes is checked before anything is computed: '' (Path("") is ".": the current directory), a
    # file, a symbolic link loop or one to nothing is a bad --out.
    out_dir = output_dir("--out", out) if out is not None else \
        Path("reports") / f"cost-{time.strftime('%Y%m%d-%H%M%S')}"
    for name, value in (("--epochs", epochs), ("--batch-per-gpu", batch_per_gpu),
                        ("--images-per-epoch", images_per_epoch)):
        check_count(name, value)  # None: the workload's own
    check_throughput(gpu_throughput)
    check_precision(precision)
    try:
        grid = costreport.CostGrid(
            instance_types=costshell.parse_list(instance_types, "--instance-types") if instance_types is not None
            else costreport.DEFAULT_INSTANCE_TYPES,
            nodes=costshell.parse_list(nodes, "--nodes", int),
            strategies=costshell.parse_list(strategies, "--strategies"),
            markets=costshell.parse_list(markets, "--markets"), reducer_type=reducer_type,
            reducers_per_worker=reducers_per_worker, ps_type=ps_type, ps_per_worker=ps_per_worker,
            batch_per_gpu=batch_per_gpu, gpu_throughput=gpu_throughput, precision=precision)
        grid.check()
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
    except (costreport.NothingPriced, PriceOutOfRange) as e:  # what this machine knows (its prices), not the options
        raise LaunchError(str(e)) from None
    except ValueError as e:  # BatchTooLarge, OutOfRange, a tier the model refuses: the options, as plan says them
        raise usage_error(str(e)) from None
    for line in [*result.notes, *(n for n in (note, loader_note) if n)]:
        err.print(f"warning: {line}", markup=False, highlight=False)
    out = out_dir
    from launcher.loading import held_back

    with held_back():  # the report's plots: matplotlib loaded with Ctrl-C held back (launcher/loading.py says why)
        import matplotlib

        matplotlib.use("Agg")  # as cost/report.py renders, before pyplot picks a backend
        from matplotlib import pyplot  # noqa: F401 - loaded here; cost/report.py uses it
    try:
        costreport.write_report(out, costreport.render(result))
    except OSError as e:
        raise LaunchError(f"could not write the report to {out}: {e.strerror or e}") from None

    table = Table(title=f"Pareto frontier of {len(result.rows)} shapes: none is both faster and cheaper")
    for col in ("shape", "strategy", "market", workload.rate_unit, "scaling", "bound", "time to train", "cost (USD)"):
        table.add_column(col, justify="left" if col in ("shape", "strategy", "market", "bound") else "right")
    for i in result.pareto:
        r = result.rows[i]
        table.add_row(r.shape, STRATEGY_LABELS[r.strategy], r.market, f"{_n(r.images_per_sec, ',.0f')}",
                      f"{r.scaling_efficiency:.0%}", r.bound, f"{_n(r.time_to_train_s / 60, ',.0f')} min",
                      f"{_n(r.cost_usd, ',.2f')}")
    console.print(table)
    for i in result.pareto:  # what would change each frontier shape, said once per distinct verdict
        advice = result.rows[i].advice
        if advice not in [result.rows[j].advice for j in result.pareto[:result.pareto.index(i)]]:
            console.print(f"{result.rows[i].shape}: {advice}", markup=False, highlight=False)
    console.print("prices: " + "; ".join(f"{q.instance_type} {q.label()}" for q in result.prices), markup=False)
    console.print(f"report: {out / 'report.html'} (also report.md, grid.csv and {len(costreport.PLOTS)} PNG plots)",
                  markup=False, highlight=False)
