"""The shell around the cost model for `launch plan`, `launch cost` and the run report: option parsing, the price
cache, AWS price refreshes and recorded measurements. It decides nothing; the model and the report are pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from infra.catalog import InstanceType, UnknownInstanceType, get
from launcher import cluster as clusters
from launcher.cluster import Cluster, Node, state_root
from launcher.cost import aws_prices, measured, prices
from launcher.cost.inputs import DEFAULT_CONSTANTS, GpuThroughput, ModelConstants
from launcher.errors import LaunchError

T = TypeVar("T")

__all__ = ["cluster_of", "instance", "load_measured", "model_constants", "parse_list", "price_book"]


def instance(name: str) -> InstanceType:
    try:
        return get(name)
    except UnknownInstanceType as e:
        raise LaunchError(str(e)) from None


def parse_list(text: str, option: str, cast: Callable[[str], T] = str) -> tuple[T, ...]:  # type: ignore[assignment]
    """'1,2, 4' -> (1, 2, 4); duplicates dropped, order kept; a bad item is a one-line LaunchError."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise LaunchError(f"{option} needs a comma-separated list, got '{text}'")
    out: list[T] = []
    for item in items:
        try:
            value = cast(item)
        except ValueError:
            raise LaunchError(f"{option}: '{item}' is not a valid item (expected a comma-separated list of "
                              f"{getattr(cast, '__name__', 'values')})") from None
        if value not in out:
            out.append(value)
    return tuple(out)


def load_measured() -> tuple[dict[str, GpuThroughput], str | None]:
    return measured.load(measured.path(state_root()))


def model_constants() -> tuple[ModelConstants, str | None]:
    """The model's constants, with the loader's per-core rate (full-size shards) replaced by a recorded measurement
    when there is one (bench/loader.py --record)."""
    loader, note = measured.load_loader(measured.loader_path(state_root()))
    if loader is None:
        return DEFAULT_CONSTANTS, note
    return DEFAULT_CONSTANTS.model_copy(update={"loader_img_per_sec_per_core": loader.img_per_sec}), note


def price_book(instances: Iterable[InstanceType], markets: Iterable[str], *, refresh: bool) -> prices.PriceBook:
    """Catalog prices, newer cached AWS quotes over them, and with ``refresh`` a fetch from AWS first.

    With ``refresh`` the user asked for AWS's prices: a market that could not be fetched at all (no credentials, no
    network, access denied) is one LaunchError naming the fetch and the way without it, and nothing is cached or
    written; a type AWS has no price for is a note in the book. Without ``refresh`` the catalog and its dates stand.
    """
    instances = list(dict.fromkeys(instances))
    names = [i.name for i in instances]
    markets = list(dict.fromkeys(markets))
    path = aws_prices.cache_path(state_root())
    notes: list[str] = []
    fetched: list[prices.PriceQuote] = []
    if refresh:
        fetched, problems = aws_prices.refresh(names, markets)  # type: ignore[arg-type]
        failed = [p for p in problems if p.startswith("could not fetch")]
        if failed:
            raise LaunchError(f"--refresh-prices: {'; '.join(failed)}; nothing was cached (leave out "
                              f"--refresh-prices to use the catalog's dated on-demand prices and cached spot prices)")
        notes += problems
        if fetched:
            try:
                aws_prices.save_cache(path, fetched)
            except OSError as e:
                notes.append(f"could not write the price cache {path} ({e.strerror or e})")
        if "on-demand" in markets and not any(q.market == "on-demand" for q in fetched):
            dated = ", ".join(f"{i.name} {i.price_date}" for i in instances)
            notes.append(f"using the offline catalog's on-demand prices ({dated})")
    cached, note = aws_prices.load_cache(path)
    if note:
        notes.append(note)
    return prices.price_book(instances, prices.merge_quotes(cached, fetched), notes)


def cluster_of(nodes: list[Node]) -> Cluster | None:
    """The saved cluster these nodes belong to (the run report is handed nodes, not the cluster), or None."""
    if not nodes:
        return None
    for name in clusters.known_names():
        try:
            c = clusters.load(name)
        except LaunchError:
            continue
        if nodes[0] in c.nodes:
            return c
    return None
