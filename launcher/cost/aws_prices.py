"""AWS's current prices, fetched and cached: the only code of launcher.cost that calls AWS or keeps files of prices.

What AWS returned is cached under ``<state root>/prices/us-east-1.json`` (``$SCALETRAIN_HOME`` or
``~/.scaletrain``) with the date it was fetched; launcher.cost.prices parses the answers and merges them with the
catalog's.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from launcher.cost.prices import (
    ON_DEMAND_ATTRIBUTES,
    REGION,
    Market,
    PriceQuote,
    merge_quotes,
    parse_price_list,
    parse_spot_history,
)

__all__ = ["cache_path", "fetch_on_demand", "fetch_spot", "load_cache", "refresh", "save_cache"]


# --- Fetching (the only code here that calls AWS) ---------------------------------------------------------


def fetch_on_demand(instance_types: Iterable[str], *, client: Any, observed: dt.date) -> dict[str, PriceQuote]:
    """On-demand quotes from the Price List API. ``client`` is a boto3 ``pricing`` client (us-east-1 endpoint)."""
    found: dict[str, PriceQuote] = {}
    paginator = client.get_paginator("get_products")
    for name in instance_types:
        filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": name},
                   {"Type": "TERM_MATCH", "Field": "regionCode", "Value": REGION},
                   *({"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in ON_DEMAND_ATTRIBUTES.items())]
        entries: list[str] = []
        for page in paginator.paginate(ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"):
            entries.extend(page.get("PriceList", []))
        found.update(parse_price_list(entries, observed=observed))
    return found


def fetch_spot(instance_types: Iterable[str], *, client: Any, now: dt.datetime) -> dict[str, PriceQuote]:
    """Current spot quotes from EC2. ``client`` is a boto3 ``ec2`` client in us-east-1."""
    records: list[dict[str, Any]] = []
    paginator = client.get_paginator("describe_spot_price_history")
    for page in paginator.paginate(InstanceTypes=sorted(set(instance_types)), ProductDescriptions=["Linux/UNIX"],
                                   StartTime=now, EndTime=now):
        records.extend(page.get("SpotPriceHistory", []))
    return parse_spot_history(records, observed=now.date())


def refresh(instance_types: Iterable[str], markets: Iterable[Market], *, now: dt.datetime | None = None,
            clients: dict[str, Any] | None = None) -> tuple[list[PriceQuote], list[str]]:
    """Fetch current prices from AWS; never raises for AWS trouble, it says what failed instead.

    Returns the quotes it got and one note per market that could not be fetched (no boto3, no credentials, no
    network, access denied) or per instance type AWS had no price for. ``clients`` ('pricing', 'ec2') lets tests
    pass stubbed or moto clients.
    """
    names = sorted(set(instance_types))
    now = now or dt.datetime.now(dt.timezone.utc)
    quotes: list[PriceQuote] = []
    notes: list[str] = []
    for market in dict.fromkeys(markets):
        service = "pricing" if market == "on-demand" else "ec2"
        try:
            client = (clients or {}).get(service) or _client(service)
            got = (fetch_on_demand(names, client=client, observed=now.date()) if market == "on-demand"
                   else fetch_spot(names, client=client, now=now))
        except Exception as e:  # noqa: BLE001 - any AWS or network failure becomes a note; the catalog stands
            notes.append(f"could not fetch {market} prices from AWS ({type(e).__name__}: "
                         f"{(str(e).splitlines() or [''])[0]})")
            continue
        quotes.extend(got.values())
        missing = [n for n in names if n not in got]
        if missing:
            notes.append(f"AWS returned no {market} price in {REGION} for {', '.join(missing)}")
    return quotes, notes


def _client(service: str) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as e:
        raise RuntimeError("boto3 is not installed (pip install boto3)") from e
    config = Config(connect_timeout=5, read_timeout=20, retries={"max_attempts": 2, "mode": "standard"})
    return boto3.client(service, region_name=REGION, config=config)


# --- The cache ------------------------------------------------------------------------------------------


def cache_path(root: Path) -> Path:
    """Where fetched prices are kept: ``<state root>/prices/us-east-1.json``."""
    return root / "prices" / f"{REGION}.json"


def load_cache(path: Path) -> tuple[list[PriceQuote], str | None]:
    """The cached quotes, and a one-line note when the file exists but cannot be used (it is then ignored)."""
    if not path.is_file():
        return [], None
    try:
        data = json.loads(path.read_text())
        return [PriceQuote.model_validate(q) for q in data["quotes"]], None
    except (OSError, ValueError, KeyError, TypeError, ValidationError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        return [], f"ignored the price cache {path} ({first}); delete it or refresh with --refresh-prices"


def save_cache(path: Path, quotes: Iterable[PriceQuote]) -> None:
    """Merge ``quotes`` into the cache (newest per type and market) and write it atomically."""
    old, _ = load_cache(path)
    merged = merge_quotes(old, quotes)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"region": REGION, "quotes": [q.model_dump(mode="json") for q in merged]},
                              indent=1) + "\n")
    os.replace(tmp, path)
