"""Prices the cost model uses: the catalog's dated on-demand figures and AWS's own when refreshed, as values.

Three sources, one shape (:class:`PriceQuote`: instance type, market, USD per hour, the date it was observed and
where it came from):

- the instance catalog (``infra/catalog.py``): us-east-1 Linux on-demand, each with its date and source; always
  there, so every report works offline;
- the AWS Price List API (boto3 ``pricing`` client, ``get_products``, service ``AmazonEC2``), on-demand;
- EC2 ``describe_spot_price_history``, the current spot price in each Availability Zone.

:func:`price_book` picks, per instance type and market, the newest quote among the catalog and what was fetched.
Everything here is pure, the parsing of AWS's answers included (tested against moto and recorded responses);
launcher.cost.aws_prices fetches and caches them.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from infra.catalog import InstanceType

__all__ = [
    "LOCATION",
    "MARKETS",
    "ON_DEMAND_ATTRIBUTES",
    "REGION",
    "Market",
    "PriceBook",
    "PriceQuote",
    "PriceUnavailable",
    "catalog_quote",
    "merge_quotes",
    "parse_price_list",
    "parse_spot_history",
    "price_book",
]

REGION = "us-east-1"
LOCATION = "US East (N. Virginia)"  # the Price List's `location` for REGION
Market = Literal["on-demand", "spot"]
MARKETS: tuple[Market, ...] = ("on-demand", "spot")

# The Price List attributes of the price the catalog carries: Linux, shared tenancy, no pre-installed
# software, capacity used by the instance itself (not an unused reservation).
ON_DEMAND_ATTRIBUTES = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}
_SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")


class PriceUnavailable(ValueError):
    """No price for an instance type in a market; the message is one line and says how to get one."""


class PriceQuote(BaseModel):
    """One hourly price, with the date it was observed and where it came from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    instance_type: str
    market: Market
    usd_per_hour: float = Field(gt=0, allow_inf_nan=False)
    date: dt.date = Field(description="the day the price was observed in its source")
    source: str = Field(min_length=1)
    region: str = REGION

    @property
    def key(self) -> tuple[str, Market]:
        return self.instance_type, self.market

    def label(self) -> str:
        """'on-demand $24.48/h as of 2026-09-24' -- what a report line says about this price."""
        return f"{self.market} ${self.usd_per_hour:g}/h as of {self.date}"


def catalog_quote(instance: InstanceType) -> PriceQuote:
    """The catalog's dated on-demand price as a quote."""
    return PriceQuote(instance_type=instance.name, market="on-demand", usd_per_hour=instance.price_usd_per_hour,
                      date=instance.price_date, source=f"scaletrain instance catalog: {instance.price_source}")


class PriceBook(BaseModel):
    """The quotes a report uses, one per (instance type, market), and what happened while gathering them."""

    model_config = ConfigDict(frozen=True)

    quotes: dict[str, PriceQuote] = Field(default_factory=dict, description="'TYPE/MARKET' -> quote")
    notes: tuple[str, ...] = ()

    def quote(self, instance_type: str, market: Market) -> PriceQuote:
        found = self.quotes.get(f"{instance_type}/{market}")
        if found is None:
            if market == "spot":
                raise PriceUnavailable(
                    f"no spot price for {instance_type} in {REGION}; fetch current spot prices with "
                    f"`launch cost --refresh-prices` (needs AWS credentials)")
            raise PriceUnavailable(f"no {market} price for {instance_type} in {REGION}")
        return found

    def has(self, instance_type: str, market: Market) -> bool:
        return f"{instance_type}/{market}" in self.quotes

    def used(self, keys: Iterable[tuple[str, Market]]) -> list[PriceQuote]:
        """The quotes for ``keys``, each once, sorted by instance type then market."""
        return sorted({self.quote(t, m) for t, m in keys}, key=lambda q: (q.instance_type, q.market))


def _newest(a: PriceQuote, b: PriceQuote) -> PriceQuote:
    """The newer quote; on the same day the one fetched from AWS (not the catalog)."""
    if a.date != b.date:
        return a if a.date > b.date else b
    return b if a.source.startswith("scaletrain instance catalog") else a


def merge_quotes(*groups: Iterable[PriceQuote]) -> list[PriceQuote]:
    """All quotes, the newest kept per (instance type, market)."""
    best: dict[tuple[str, str], PriceQuote] = {}
    for group in groups:
        for q in group:
            best[q.key] = _newest(best[q.key], q) if q.key in best else q
    return sorted(best.values(), key=lambda q: q.key)


def price_book(instances: Iterable[InstanceType], cached: Iterable[PriceQuote] = (),
               notes: Iterable[str] = ()) -> PriceBook:
    """Catalog on-demand prices for ``instances``, replaced by newer cached AWS quotes; spot only from the cache."""
    names = {i.name for i in instances}
    catalog = [catalog_quote(i) for i in instances]
    merged = merge_quotes(catalog, [q for q in cached if q.instance_type in names and q.region == REGION])
    return PriceBook(quotes={f"{q.instance_type}/{q.market}": q for q in merged}, notes=tuple(notes))


# --- The Price List API: parsing (pure) ------------------------------------------------------------------


def _usd_per_hour(on_demand_terms: dict[str, Any]) -> tuple[float, str]:
    """The one hourly USD rate in a product's OnDemand terms, with the term's effective date."""
    rates: list[tuple[float, str]] = []
    for term in on_demand_terms.values():
        for dim in term.get("priceDimensions", {}).values():
            if dim.get("unit") != "Hrs":
                continue
            usd = float(dim["pricePerUnit"]["USD"])
            if usd > 0:
                rates.append((usd, str(term.get("effectiveDate", ""))[:10]))
    if len({usd for usd, _ in rates}) != 1:
        raise ValueError(f"expected one hourly on-demand rate, found {sorted({usd for usd, _ in rates})}")
    return rates[0]


def parse_price_list(price_list: Iterable[str | dict[str, Any]], *, observed: dt.date,
                     region: str = REGION) -> dict[str, PriceQuote]:
    """On-demand quotes from ``get_products`` ``PriceList`` entries (each a JSON string, as boto3 returns them).

    Keeps the products that are the catalog's kind of price (Linux, shared tenancy, no pre-installed software,
    capacity status Used, in ``region``) and reads ``terms.OnDemand.*.priceDimensions.*.pricePerUnit.USD`` of
    the hourly dimension. Two different prices for one instance type raise ``ValueError``.
    """
    found: dict[str, PriceQuote] = {}
    for entry in price_list:
        item = json.loads(entry) if isinstance(entry, str) else entry
        product = item.get("product", {})
        attrs = product.get("attributes", {})
        if item.get("serviceCode", "AmazonEC2") != "AmazonEC2" or "instanceType" not in attrs:
            continue
        if attrs.get("regionCode", region) != region:
            continue
        if region == REGION and attrs.get("location", LOCATION) != LOCATION:
            continue
        if any(attrs.get(k) != v for k, v in ON_DEMAND_ATTRIBUTES.items()):
            continue
        if attrs.get("marketoption", "OnDemand") != "OnDemand":  # e.g. Capacity Blocks, priced differently
            continue
        terms = item.get("terms", {}).get("OnDemand", {})
        if not terms:
            continue
        usd, effective = _usd_per_hour(terms)
        name = attrs["instanceType"]
        source = (f"AWS Price List API (AmazonEC2 {region} Linux on-demand, sku {product.get('sku', '?')}, "
                  f"offer version {item.get('version', '?')}, effective {effective or '?'})")
        quote = PriceQuote(instance_type=name, market="on-demand", usd_per_hour=usd, date=observed, source=source,
                           region=region)
        if name in found and found[name].usd_per_hour != usd:
            raise ValueError(f"the Price List gives {name} two on-demand prices: "
                             f"{found[name].usd_per_hour:g} and {usd:g} USD/h")
        found[name] = quote
    return found


def parse_spot_history(records: Iterable[dict[str, Any]], *, observed: dt.date,
                       region: str = REGION) -> dict[str, PriceQuote]:
    """Spot quotes from ``describe_spot_price_history`` records: per instance type, the cheapest zone's latest price.

    A cluster lives in one placement group, so in one Availability Zone; the quote is that of the zone whose latest
    price is lowest, and its source names the zone and the price's timestamp.
    """
    latest: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        if r.get("ProductDescription") not in _SPOT_PRODUCTS:
            continue
        key = (r["InstanceType"], r["AvailabilityZone"])
        if key not in latest or _stamp(r["Timestamp"]) > _stamp(latest[key]["Timestamp"]):
            latest[key] = r
    best: dict[str, dict[str, Any]] = {}
    for (name, _zone), r in sorted(latest.items()):
        if name not in best or float(r["SpotPrice"]) < float(best[name]["SpotPrice"]):
            best[name] = r
    return {
        name: PriceQuote(instance_type=name, market="spot", usd_per_hour=float(r["SpotPrice"]), date=observed,
                         region=region,
                         source=(f"EC2 DescribeSpotPriceHistory ({r['ProductDescription']}): cheapest zone "
                                 f"{r['AvailabilityZone']} of {sum(1 for k in latest if k[0] == name)}, price set "
                                 f"{_stamp(r['Timestamp']).isoformat(timespec='minutes')}"))
        for name, r in best.items()
    }


def _stamp(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    text = str(value).replace("Z", "+00:00")
    if "." in text:  # AWS sends nanoseconds; datetime takes microseconds
        head, _, tail = text.partition(".")
        digits = "".join(ch for ch in tail if ch.isdigit())
        zone = tail[len(digits):]
        text = f"{head}.{digits[:6]}{zone}"
    stamp = dt.datetime.fromisoformat(text)
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=dt.timezone.utc)
