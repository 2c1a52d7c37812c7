"""Prices: Price List and spot parsing (recorded responses, stubbed pricing, moto EC2), the cache, the book."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber
from moto import mock_aws

from infra.catalog import get
from launcher.cost import aws_prices as pricing
from launcher.cost import prices
from launcher.cost.prices import PriceQuote, PriceUnavailable

DATA = Path(__file__).parent / "data"
TODAY = dt.date(2026, 11, 21)
NOW = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.timezone.utc)


def recorded_pages(instance_type: str) -> list[dict]:
    return json.loads((DATA / "pricing_get_products_us_east_1.json").read_text())[instance_type]


def quote(name: str, market: str, usd: float, date: dt.date, source: str = "AWS Price List API (test)") -> PriceQuote:
    return PriceQuote(instance_type=name, market=market, usd_per_hour=usd, date=date, source=source)


# --- Parsing ---------------------------------------------------------------------------------------------


def test_price_list_parsing_keeps_linux_shared_used_and_skips_the_decoys():
    entries = [e for page in recorded_pages("p3.16xlarge") for e in page["PriceList"]]
    assert len(entries) == 5 and all(isinstance(e, str) for e in entries)  # JSON strings, as boto3 returns them
    found = prices.parse_price_list(entries, observed=TODAY)
    assert list(found) == ["p3.16xlarge"]
    q = found["p3.16xlarge"]
    assert (q.market, q.usd_per_hour, q.date, q.region) == ("on-demand", 24.48, TODAY, "us-east-1")
    assert "sku RQ9EVZ3WGQKT6P5G" in q.source and "effective 2026-11-01" in q.source
    assert "offer version 20261120195253" in q.source


def test_price_list_parsing_rejects_two_prices_for_one_type():
    entries = [e for page in recorded_pages("p3.16xlarge") for e in page["PriceList"]]
    other = json.loads(entries[1])
    dims = next(iter(other["terms"]["OnDemand"].values()))["priceDimensions"]
    next(iter(dims.values()))["pricePerUnit"]["USD"] = "30.0"
    with pytest.raises(ValueError, match="two on-demand prices: 24.48 and 30 USD/h"):
        prices.parse_price_list([entries[1], json.dumps(other)], observed=TODAY)


def test_price_list_parsing_skips_capacity_blocks():
    entry = json.loads(recorded_pages("p5.48xlarge")[0]["PriceList"][0])
    block = json.loads(json.dumps(entry))
    block["product"]["attributes"]["marketoption"] = "CapacityBlock"
    dims = next(iter(block["terms"]["OnDemand"].values()))["priceDimensions"]
    next(iter(dims.values()))["pricePerUnit"]["USD"] = "31.464"
    found = prices.parse_price_list([json.dumps(block), json.dumps(entry)], observed=TODAY)
    assert found["p5.48xlarge"].usd_per_hour == 55.04


def test_price_list_parsing_skips_other_regions():
    entry = json.loads(recorded_pages("p5.48xlarge")[0]["PriceList"][0])
    entry["product"]["attributes"] |= {"regionCode": "eu-west-1", "location": "EU (Ireland)"}
    assert prices.parse_price_list([entry], observed=TODAY) == {}


def test_spot_history_parsing_takes_each_zones_latest_then_the_cheapest_zone():
    records = json.loads((DATA / "spot_price_history_us_east_1.json").read_text())["SpotPriceHistory"]
    found = prices.parse_spot_history(records, observed=TODAY)
    # us-east-1a's latest is 11.2045 (its older 7.10 no longer holds); 1b's 9.8453 is cheaper; Windows is ignored.
    p4d = found["p4d.24xlarge"]
    assert (p4d.market, p4d.usd_per_hour, p4d.date) == ("spot", 9.8453, TODAY)
    assert "cheapest zone us-east-1b of 2" in p4d.source and "2026-11-21T08:13+00:00" in p4d.source
    assert found["p5.48xlarge"].usd_per_hour == 31.412


# --- Fetching: a stubbed pricing client and moto's EC2 --------------------------------------------------------


def test_fetch_on_demand_pages_through_get_products():
    client = boto3.client("pricing", region_name="us-east-1", aws_access_key_id="test", aws_secret_access_key="test")
    stub = Stubber(client)
    pages = recorded_pages("p3.16xlarge")
    filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": "p3.16xlarge"},
               {"Type": "TERM_MATCH", "Field": "regionCode", "Value": "us-east-1"},
               {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
               {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
               {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
               {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
               {"Type": "TERM_MATCH", "Field": "licenseModel", "Value": "No License required"}]
    expected = {"ServiceCode": "AmazonEC2", "Filters": filters, "FormatVersion": "aws_v1"}
    stub.add_response("get_products", pages[0], expected)
    stub.add_response("get_products", pages[1], expected | {"NextToken": "page-2-token"})
    stub.add_response("get_products", recorded_pages("p5.48xlarge")[0],
                      expected | {"Filters": [{**filters[0], "Value": "p5.48xlarge"}, *filters[1:]]})
    with stub:
        found = pricing.fetch_on_demand(["p3.16xlarge", "p5.48xlarge"], client=client, observed=TODAY)
    stub.assert_no_pending_responses()
    assert {k: q.usd_per_hour for k, q in found.items()} == {"p3.16xlarge": 24.48, "p5.48xlarge": 55.04}


@mock_aws
def test_fetch_spot_reads_describe_spot_price_history_from_moto():
    ec2 = boto3.client("ec2", region_name="us-east-1")
    found = pricing.fetch_spot(["p4d.24xlarge", "c5n.18xlarge", "p3.16xlarge"], client=ec2, now=NOW)
    # moto's offerings have no P3 rows, and it prices every zone at 0.00001.
    assert set(found) == {"p4d.24xlarge", "c5n.18xlarge"}
    assert all(q.market == "spot" and q.usd_per_hour == 0.00001 and q.date == TODAY for q in found.values())
    assert "Linux/UNIX (Amazon VPC)" in found["p4d.24xlarge"].source


def test_refresh_turns_aws_failures_into_notes_and_keeps_what_it_got():
    class NoCredentials:
        def get_paginator(self, name):
            raise RuntimeError("Unable to locate credentials")

    with mock_aws():
        ec2 = boto3.client("ec2", region_name="us-east-1")
        quotes, notes = pricing.refresh(["p3.16xlarge", "p4d.24xlarge"], ["on-demand", "spot"], now=NOW,
                                        clients={"pricing": NoCredentials(), "ec2": ec2})
    assert [q.key for q in quotes] == [("p4d.24xlarge", "spot")]
    assert notes == ["could not fetch on-demand prices from AWS (RuntimeError: Unable to locate credentials)",
                     "AWS returned no spot price in us-east-1 for p3.16xlarge"]


# --- The cache and the book ----------------------------------------------------------------------------------


def test_cache_round_trip_keeps_the_newest_quote_and_writes_atomically(tmp_path):
    path = pricing.cache_path(tmp_path)
    assert path == tmp_path / "prices" / "us-east-1.json"
    pricing.save_cache(path, [quote("p4d.24xlarge", "spot", 9.0, dt.date(2026, 11, 1))])
    pricing.save_cache(path, [quote("p4d.24xlarge", "spot", 8.0, dt.date(2026, 11, 20)),
                              quote("p5.48xlarge", "on-demand", 55.04, dt.date(2026, 11, 20))])
    pricing.save_cache(path, [quote("p4d.24xlarge", "spot", 7.0, dt.date(2026, 10, 1))])  # older: ignored
    cached, note = pricing.load_cache(path)
    assert note is None
    assert {(q.instance_type, q.market): (q.usd_per_hour, q.date) for q in cached} == {
        ("p4d.24xlarge", "spot"): (8.0, dt.date(2026, 11, 20)),
        ("p5.48xlarge", "on-demand"): (55.04, dt.date(2026, 11, 20))}
    assert [p.name for p in path.parent.iterdir()] == ["us-east-1.json"]  # no temporary file left behind


def test_a_damaged_cache_is_ignored_with_a_note(tmp_path):
    path = pricing.cache_path(tmp_path)
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    cached, note = pricing.load_cache(path)
    assert cached == [] and note.startswith(f"ignored the price cache {path} (")
    assert "\n" not in note


def test_price_book_uses_the_catalog_offline_and_newer_aws_quotes_when_cached():
    p5, p3 = get("p5.48xlarge"), get("p3.16xlarge")
    offline = prices.price_book([p5, p3])
    assert offline.quote("p5.48xlarge", "on-demand").usd_per_hour == 55.04
    assert offline.quote("p5.48xlarge", "on-demand").date == p5.price_date
    assert offline.quote("p3.16xlarge", "on-demand").source.startswith("scaletrain instance catalog: ")
    with pytest.raises(PriceUnavailable, match=r"^no spot price for p5.48xlarge in us-east-1; fetch current spot "
                                              r"prices with `launch cost --refresh-prices`"):
        offline.quote("p5.48xlarge", "spot")
    newer = quote("p5.48xlarge", "on-demand", 54.0, p5.price_date + dt.timedelta(days=1))
    older = quote("p3.16xlarge", "on-demand", 30.0, p3.price_date - dt.timedelta(days=1))
    spot = quote("p5.48xlarge", "spot", 31.4, TODAY)
    book = prices.price_book([p5, p3], [newer, older, spot], notes=["x"])
    assert book.quote("p5.48xlarge", "on-demand").usd_per_hour == 54.0
    assert book.quote("p3.16xlarge", "on-demand").usd_per_hour == 24.48  # the catalog's is newer
    assert book.quote("p5.48xlarge", "spot").usd_per_hour == 31.4
    assert book.notes == ("x",)
    same_day = quote("p3.16xlarge", "on-demand", 24.0, p3.price_date)
    assert prices.price_book([p3], [same_day]).quote("p3.16xlarge", "on-demand").usd_per_hour == 24.0
