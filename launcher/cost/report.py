"""`launch cost`: the model over a grid of cluster shapes, its Pareto frontier, and the report directory.

Pure parts: :func:`evaluate_grid` (estimates for instance types x node counts x strategies x markets),
:func:`pareto_front` (the cells no other cell beats on both time and cost), :func:`render` (the report's files
as bytes: Markdown, a standalone HTML page with the plots embedded, the PNG plots, the CSV table). The one
impure step is :func:`write_report`, which writes those files atomically.
"""

from __future__ import annotations

import base64
import csv
import datetime as dt
import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from jinja2 import Environment, PackageLoader, StrictUndefined, select_autoescape
from pydantic import BaseModel, ConfigDict, Field

from infra.catalog import MAX_NODES, get, nodes_allowed
from launcher.cost.inputs import (
    DEFAULT_CONSTANTS,
    DEFAULT_TIER_TYPE,
    STRATEGIES,
    STRATEGY_LABELS,
    GpuThroughput,
    ModelConstants,
    Workload,
)
from launcher.cost.model import Estimate, estimate, model_notes, steps_per_epoch, tier_noun
from launcher.cost.prices import MARKETS, PriceBook, PriceQuote

__all__ = [
    "DEFAULT_INSTANCE_TYPES",
    "DEFAULT_NODES",
    "MAX_CELLS",
    "CostGrid",
    "GridResult",
    "NothingPriced",
    "evaluate_grid",
    "pareto_front",
    "render",
    "write_report",
]

# Seed comparison: P3 (seed 000, TCP) vs P3dn (seed 004, EFA) vs P4d (seed 002) vs P5, each with Horovod, seed 003's
# parameter servers and seed 004's reducers.
DEFAULT_INSTANCE_TYPES = ("p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge")
DEFAULT_NODES = (1, 2, 4, 8, 16)
MAX_CELLS = 10_000  # a grid larger than this is a typo more often than a plan; it says so instead of grinding


class CostGrid(BaseModel):
    """What `launch cost` compares: every combination of these, for one workload."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_types: tuple[str, ...] = DEFAULT_INSTANCE_TYPES
    nodes: tuple[int, ...] = DEFAULT_NODES
    strategies: tuple[str, ...] = STRATEGIES
    markets: tuple[str, ...] = ("on-demand",)
    reducer_type: str = DEFAULT_TIER_TYPE["reducers"]
    reducers_per_worker: float = Field(1.0, gt=0, allow_inf_nan=False)
    ps_type: str = DEFAULT_TIER_TYPE["ps"]
    ps_per_worker: float = Field(2.0, gt=0, allow_inf_nan=False)
    batch_per_gpu: int | None = Field(256, ge=1, description="None: each GPU type's published batch")
    gpu_throughput: float | None = None
    precision: str = "amp"

    @property
    def cells(self) -> int:
        return len(self.instance_types) * len(self.nodes) * len(self.strategies) * len(self.markets)

    def tier_nodes(self, strategy: str, nodes: int) -> int:
        ratio = {"ps": self.ps_per_worker, "reducers": self.reducers_per_worker}.get(strategy, 0.0)
        if problem := self.tier_problem(strategy, nodes):  # also a ratio whose product overflows a float
            raise ValueError(problem)
        return max(1, math.ceil(ratio * nodes - 1e-9)) if ratio else 0

    def tier_problem(self, strategy: str, nodes: int) -> str | None:
        """None when ``nodes`` workers' share of the strategy's tier (--reducers-per-worker or --ps-per-worker
        each) is within the one node limit (infra.catalog.MAX_NODES) `launch plan --reducers` keeps, else one line
        naming the options that made it."""
        option, ratio = {"ps": ("--ps-per-worker", self.ps_per_worker),
                         "reducers": ("--reducers-per-worker", self.reducers_per_worker)}.get(strategy, ("", 0.0))
        if not ratio:
            return None
        count = ratio * nodes - 1e-9  # a float: 1e308 x 16 is inf, never an OverflowError
        if count <= MAX_NODES:
            return None
        noun = tier_noun(strategy)
        shown = f"{math.ceil(count):,}" if count < 1e15 else f"{count:.3g}"
        return f"{option} {ratio:g} with --nodes {nodes} makes {shown} {noun} nodes: " \
               f"{nodes_allowed(MAX_NODES + 1, noun)}"

    def check(self) -> None:
        """``ValueError`` (one line) for an empty axis, an unknown name or a grid over :data:`MAX_CELLS`."""
        for axis in ("instance_types", "nodes", "strategies", "markets"):
            if not getattr(self, axis):
                raise ValueError(f"the grid's {axis.replace('_', ' ')} list is empty")
        if self.cells > MAX_CELLS:
            raise ValueError(f"the grid has {self.cells:,} cells ({len(self.instance_types)} instance types x "
                             f"{len(self.nodes)} node counts x {len(self.strategies)} strategies x "
                             f"{len(self.markets)} markets), over the cap of {MAX_CELLS:,}; narrow it")
        for name in (*self.instance_types, self.reducer_type, self.ps_type):
            get(name)  # UnknownInstanceType names the choices
        for s in self.strategies:
            if s not in STRATEGIES:
                raise ValueError(f"unknown strategy '{s}'; choose from: {', '.join(STRATEGIES)}")
        for m in self.markets:
            if m not in MARKETS:
                raise ValueError(f"unknown market '{m}'; choose from: {', '.join(MARKETS)}")
        for n in self.nodes:
            if problem := nodes_allowed(n):  # the one limit (infra.catalog.MAX_NODES) plan and the stack keep
                raise ValueError(f"--nodes {n}: {problem}")
        for s in self.strategies:  # the tiers too, each node count's share
            for n in self.nodes:
                if problem := self.tier_problem(s, n):
                    raise ValueError(problem)
        for strategy, option, name in (("ps", "--ps-type", self.ps_type), ("reducers", "--reducer-type",
                                                                           self.reducer_type)):
            if strategy in self.strategies and get(name).gpus:  # the model refuses them per cell; say it once, first
                raise ValueError(f"{option} {name} has GPUs; {tier_noun(strategy)}s run on CPU instance types "
                                 f"(default {DEFAULT_TIER_TYPE[strategy]})")
        for name in self.instance_types:
            if get(name).gpus == 0:
                raise ValueError(f"{name} has no GPUs; list GPU instance types (reducer and server types are "
                                 f"chosen with --reducer-type and --ps-type)")


class NothingPriced(ValueError):
    """No cell of the grid has a price here (spot prices not fetched yet): what this machine knows, not a bad option."""


class GridResult(BaseModel):
    """The evaluated grid: one estimate per cell that could be priced, and what could not be and why."""

    model_config = ConfigDict(frozen=True)

    grid: CostGrid
    workload: Workload
    rows: list[Estimate]
    pareto: list[int] = Field(description="indices into rows on the time/cost Pareto frontier")
    prices: list[PriceQuote]
    notes: list[str]
    generated: dt.date
    constants: ModelConstants = DEFAULT_CONSTANTS


def evaluate_grid(grid: CostGrid, workload: Workload, book: PriceBook, *, today: dt.date,
                  measured: Mapping[str, GpuThroughput] | None = None,
                  constants: ModelConstants = DEFAULT_CONSTANTS) -> GridResult:
    """Every cell of ``grid`` through the model, priced from ``book``; unpriceable cells become notes."""
    grid.check()
    rows: list[Estimate] = []
    notes = list(book.notes)
    keys: set[tuple[str, str]] = set()
    missing: dict[str, set[str]] = {}
    for name in grid.instance_types:
        instance = get(name)
        for market in grid.markets:
            for strategy in grid.strategies:
                tier = get(grid.ps_type if strategy == "ps" else grid.reducer_type) if strategy != "horovod" \
                    else None
                needed = [name] + ([tier.name] if tier is not None else [])
                absent = [t for t in needed if not book.has(t, market)]  # type: ignore[arg-type]
                if absent:
                    for t in absent:
                        missing.setdefault(market, set()).add(t)
                    continue
                for nodes in grid.nodes:
                    row = estimate(
                        instance, nodes, workload, strategy=strategy, tier=tier,
                        tier_nodes=grid.tier_nodes(strategy, nodes) if tier is not None else None,
                        gpu_throughput=grid.gpu_throughput, precision=grid.precision,  # type: ignore[arg-type]
                        measured=measured, batch_per_gpu=grid.batch_per_gpu,
                        price=book.quote(name, market),  # type: ignore[arg-type]
                        tier_price=book.quote(tier.name, market) if tier is not None else None,  # type: ignore[arg-type]
                        constants=constants,
                    )
                    try:  # `launch plan`'s check: a batch larger than each rank's share of the epoch is refused
                        steps_per_epoch(workload.images_per_epoch, row.nodes * instance.gpus,
                                        row.batch_per_gpu * row.accumulation_steps)
                    except ValueError as e:
                        raise type(e)(f"{row.shape}: {e}") from None
                    rows.append(row)
                    keys.update((t, market) for t in needed)
    for market, types in sorted(missing.items()):
        notes.append(f"no {market} price for {', '.join(sorted(types))}: those cells are left out"
                     + (" (fetch spot prices with --refresh-prices)" if market == "spot" else ""))
    if not rows:
        raise NothingPriced("no cell of the grid could be priced: " + "; ".join(notes[-len(missing):]))
    return GridResult(grid=grid, workload=workload, rows=rows,
                      pareto=pareto_front([(r.time_to_train_s, r.cost_usd) for r in rows]),
                      prices=book.used(sorted(keys)), notes=notes, generated=today, constants=constants)  # type: ignore[arg-type]


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats: none is at least as fast and as cheap and better in one.

    Sorted by time then cost, a point is on the frontier when it is cheaper than every faster point (an exact
    duplicate of a frontier point is on it too). Returned in order of increasing time.
    """
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    front: list[int] = []
    best = math.inf
    for i in order:
        time, cost = points[i]
        if cost < best:
            front.append(i)
            best = cost
        elif front and (time, cost) == points[front[-1]]:
            front.append(i)
    return front


# --- Rendering -----------------------------------------------------------------------------------------

CSV_COLUMNS = (
    "instance_type", "nodes", "total_gpus", "strategy", "tier_type", "tier_nodes", "market", "images_per_sec",
    "scaling_efficiency", "step_time_s", "compute_time_s", "comm_time_s", "exposed_comm_time_s", "bottleneck",
    "comm_limited_by", "epoch_time_s", "training_s", "time_to_train_s", "cluster_usd_per_hour", "cost_usd",
    "cost_per_epoch_usd", "price_date", "tier_price_date",
)
PLOTS = {
    "time_vs_cost.png": "Time to train vs cost; the Pareto frontier is the line through the circled cells",
    "scaling.png": "Throughput and scaling efficiency vs worker nodes",
    "cost_per_epoch.png": "Cost per epoch vs worker nodes",
}
_MARKERS = {"horovod": "o", "ps": "s", "reducers": "^"}


def _csv(result: GridResult) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*CSV_COLUMNS, "pareto"])
    front = set(result.pareto)
    for i, r in enumerate(result.rows):
        data = r.model_dump(mode="json")
        writer.writerow([_cell(data[c]) for c in CSV_COLUMNS] + [str(i in front).lower()])
    return out.getvalue().encode()


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _series(result: GridResult) -> dict[tuple[str, str, str], list[Estimate]]:
    """Rows grouped by (instance type, strategy, market), each sorted by nodes."""
    groups: dict[tuple[str, str, str], list[Estimate]] = {}
    for r in result.rows:
        groups.setdefault((r.instance_type, r.strategy, r.market), []).append(r)
    return {k: sorted(v, key=lambda r: r.nodes) for k, v in groups.items()}


def _plots(result: GridResult) -> dict[str, bytes]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.lines import Line2D

    types = list(dict.fromkeys(r.instance_type for r in result.rows))
    colors = {t: plt.get_cmap("tab10")(i % 10) for i, t in enumerate(types)}
    series = _series(result)
    pngs: dict[str, bytes] = {}

    def png(fig: object) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})  # type: ignore
        plt.close(fig)  # type: ignore[arg-type]
        return buf.getvalue()

    legend = [Line2D([], [], color=colors[t], marker="o", linestyle="", label=t) for t in types] + [
        Line2D([], [], color="0.3", marker=_MARKERS[s], linestyle="", label=STRATEGY_LABELS[s])
        for s in STRATEGIES if any(r.strategy == s for r in result.rows)]
    if any(r.market == "spot" for r in result.rows):
        legend.append(Line2D([], [], color="0.3", marker="o", markerfacecolor="none", linestyle="", label="spot"))

    fig, ax = plt.subplots(figsize=(8.5, 5.5))
    for r in result.rows:
        spot = r.market == "spot"
        ax.scatter(r.time_to_train_s / 3600, r.cost_usd, marker=_MARKERS[r.strategy], s=36,
                   facecolors="none" if spot else colors[r.instance_type], edgecolors=colors[r.instance_type])
    front = [result.rows[i] for i in result.pareto]
    ax.plot([r.time_to_train_s / 3600 for r in front], [r.cost_usd for r in front], color="black", linewidth=1,
            drawstyle="steps-post", label="Pareto frontier")
    ax.scatter([r.time_to_train_s / 3600 for r in front], [r.cost_usd for r in front], s=140, facecolors="none",
               edgecolors="black", linewidths=1.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    _plain_log_ticks(ax.xaxis, "{:g} h")
    _plain_log_ticks(ax.yaxis, "${:,.0f}")
    ax.set_xlabel("time to train (hours, incl. provisioning and staging)")
    ax.set_ylabel("cost (USD)")
    ax.set_title(f"{result.workload.epochs} epochs of {result.workload.images_per_epoch:,} images")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(handles=[*legend, Line2D([], [], color="black", label="Pareto frontier")], fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))
    pngs["time_vs_cost.png"] = png(fig)

    first_market = result.rows[0].market
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 7.5), sharex=True)
    for (name, strategy, market), rows in series.items():
        if market != first_market:
            continue  # throughput does not depend on the market
        nodes = [r.nodes for r in rows]
        label = f"{name}, {STRATEGY_LABELS[strategy]}"
        top.plot(nodes, [r.images_per_sec for r in rows], marker=_MARKERS[strategy], color=colors[name], label=label)
        bottom.plot(nodes, [r.scaling_efficiency * 100 for r in rows], marker=_MARKERS[strategy], color=colors[name])
    top.set_ylabel("images/s")
    top.set_yscale("log")
    _plain_log_ticks(top.yaxis, "{:,.0f}")
    bottom.set_ylabel("scaling efficiency (%)")
    bottom.set_xlabel("worker nodes")
    for ax in (top, bottom):
        ax.set_xscale("log", base=2)
        _plain_log_ticks(ax.xaxis, "{:g}")
        ax.grid(True, which="both", alpha=0.3)
    top.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    pngs["scaling.png"] = png(fig)

    fig, ax = plt.subplots(figsize=(8.5, 5))
    for (name, strategy, market), rows in series.items():
        ax.plot([r.nodes for r in rows], [r.cost_per_epoch_usd for r in rows], marker=_MARKERS[strategy],
                color=colors[name], linestyle="--" if market == "spot" else "-",
                label=f"{name}, {STRATEGY_LABELS[strategy]}, {market}")
    ax.set_xscale("log", base=2)
    _plain_log_ticks(ax.xaxis, "{:g}")
    ax.set_xlabel("worker nodes")
    ax.set_ylabel("cost per epoch (USD)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    pngs["cost_per_epoch.png"] = png(fig)
    return pngs


def _plain_log_ticks(axis: object, fmt: str) -> None:
    """Label a log axis's major ticks as plain numbers (not 3x10^-1) and drop the minor labels, which collide."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    if axis.get_scale() == "log" and axis.get_transform().base == 10:  # type: ignore[attr-defined]
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # type: ignore[attr-defined]
    axis.set_major_formatter(FuncFormatter(lambda value, _pos: fmt.format(value)))  # type: ignore[attr-defined]
    axis.set_minor_formatter(NullFormatter())  # type: ignore[attr-defined]


_env = Environment(loader=PackageLoader("launcher", "templates"), undefined=StrictUndefined,
                   autoescape=select_autoescape(enabled_extensions=("html.j2",), default_for_string=False),
                   keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def _context(result: GridResult) -> dict[str, object]:
    front = set(result.pareto)
    ranked = sorted(range(len(result.rows)), key=lambda i: (result.rows[i].cost_usd, result.rows[i].time_to_train_s))
    w = result.workload
    return {
        "result": result,
        "grid": result.grid,
        "workload": w,
        "rows": [(result.rows[i], i in front) for i in ranked],
        "pareto": [result.rows[i] for i in result.pareto],
        "fastest": min(result.rows, key=lambda r: r.time_to_train_s),
        "cheapest": min(result.rows, key=lambda r: r.cost_usd),
        "labels": STRATEGY_LABELS,
        "strategy_names": [STRATEGY_LABELS[s] for s in result.grid.strategies],
        "assumptions": model_notes(result.constants),
        "plots": PLOTS,
    }


def render(result: GridResult) -> dict[str, bytes]:
    """The report's files by name: report.md, report.html (standalone: PNGs embedded), the PNGs, grid.csv."""
    pngs = _plots(result)
    ctx = _context(result)
    embedded = {name: "data:image/png;base64," + base64.b64encode(data).decode() for name, data in pngs.items()}
    files = {
        "report.md": _env.get_template("cost_report.md.j2").render(**ctx).encode(),
        "report.html": _env.get_template("cost_report.html.j2").render(**ctx, images=embedded).encode(),
        "grid.csv": _csv(result),
    }
    return files | pngs


def write_report(out: Path, files: Mapping[str, bytes]) -> list[Path]:
    """Write each file under ``out`` atomically (temporary name, then rename); returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, data in files.items():
        path = out / name
        tmp = out / f".{name}.{os.getpid()}.tmp"
        tmp.write_bytes(data)
        os.replace(tmp, path)
        written.append(path)
    return written
