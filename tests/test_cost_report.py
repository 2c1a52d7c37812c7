"""`launch cost`: the grid, its Pareto frontier, the rendered report (HTML parses, PNGs, CSV) and the command."""

from __future__ import annotations

import csv
import datetime as dt
import io
from html.parser import HTMLParser
from pathlib import Path

import pytest

from infra.catalog import UnknownInstanceType, get
from launcher import cli
from launcher.cost import aws_prices as pricing
from launcher.cost import prices
from launcher.cost import report as costreport
from launcher.cost.inputs import imagenet
from launcher.cost.prices import PriceQuote
from launcher.cost.report import MAX_CELLS, CostGrid, evaluate_grid, pareto_front

TODAY = dt.date(2026, 11, 21)
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def book_for(grid: CostGrid, cached=()) -> prices.PriceBook:
    names = {*grid.instance_types, grid.reducer_type, grid.ps_type}
    return prices.price_book([get(n) for n in names], cached)


# --- Pareto frontier -------------------------------------------------------------------------------------------


def test_pareto_front_by_hand():
    #            0 fast/dear  1 dominated  2 middle   3 slow/cheap  4 dominated  5 duplicate of 2
    points = [(1.0, 10.0), (2.0, 10.0), (2.0, 5.0), (4.0, 1.0), (5.0, 1.0), (2.0, 5.0)]
    assert pareto_front(points) == [0, 2, 5, 3]
    assert pareto_front([]) == []
    assert pareto_front([(3.0, 3.0)]) == [0]


def test_pareto_front_holds_no_dominated_point_and_misses_none():
    import random

    rng = random.Random(7)
    points = [(rng.uniform(1, 100), rng.uniform(1, 100)) for _ in range(300)]
    front = set(pareto_front(points))

    def dominated(i):
        t, c = points[i]
        return any(t2 <= t and c2 <= c and (t2, c2) != (t, c) for t2, c2 in points)

    assert front == {i for i in range(len(points)) if not dominated(i)}


# --- The grid ----------------------------------------------------------------------------------------------------


def test_default_grid_is_the_seed_comparison():
    grid = CostGrid()
    assert grid.instance_types == ("p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge")
    assert grid.strategies == ("horovod", "ps", "reducers")
    assert (grid.tier_nodes("ps", 8), grid.tier_nodes("reducers", 8), grid.tier_nodes("horovod", 8)) == (16, 8, 0)
    result = evaluate_grid(grid, imagenet(), book_for(grid), today=TODAY)
    assert len(result.rows) == grid.cells == 4 * 5 * 3
    # Seed 000's cell is in it, as the model gives it alone.
    seed = next(r for r in result.rows if (r.instance_type, r.nodes, r.strategy) == ("p3.16xlarge", 8, "horovod"))
    assert seed.images_per_sec == pytest.approx(40_992, rel=1e-3)
    front = [result.rows[i] for i in result.pareto]
    assert all(not any(o.time_to_train_s <= f.time_to_train_s and o.cost_usd < f.cost_usd for o in result.rows)
               for f in front)
    assert {q.instance_type for q in result.prices} == {*grid.instance_types, "c5n.18xlarge", "m5.24xlarge"}


def test_a_grid_over_the_cap_is_refused_naming_its_size():
    grid = CostGrid(nodes=tuple(range(1, 1001)))
    assert grid.cells == 12_000 > MAX_CELLS
    with pytest.raises(ValueError, match=r"^the grid has 12,000 cells \(4 instance types x 1000 node counts x 3 "
                                         r"strategies x 1 markets\), over the cap of 10,000; narrow it$"):
        evaluate_grid(grid, imagenet(), book_for(CostGrid()), today=TODAY)


@pytest.mark.parametrize(("grid", "error", "match"), [
    (CostGrid(instance_types=("p9.huge",)), UnknownInstanceType, "unknown instance type 'p9.huge'"),
    (CostGrid(strategies=("ring",)), ValueError, r"unknown strategy 'ring'; choose from: horovod, ps, reducers"),
    (CostGrid(markets=("reserved",)), ValueError, r"unknown market 'reserved'; choose from: on-demand, spot"),
    (CostGrid(nodes=(0, 2)), ValueError, r"--nodes 0: allowed: 1 to 4096 worker nodes"),
    (CostGrid(nodes=(2, 4097)), ValueError, r"--nodes 4097: allowed: 1 to 4096 worker nodes"),
    (CostGrid(instance_types=("c5n.18xlarge",)), ValueError, r"c5n.18xlarge has no GPUs"),
    (CostGrid(nodes=()), ValueError, r"the grid's nodes list is empty"),
    # Each tier, derived per worker, held to --reducers' limit (infra.catalog.MAX_NODES) and said the same way.
    (CostGrid(nodes=(4096,), strategies=("reducers",), reducers_per_worker=3), ValueError,
     r"^--reducers-per-worker 3 with --nodes 4096 makes 12,288 reducer nodes: allowed: 0 to 4096 reducer nodes$"),
    (CostGrid(nodes=(1,), strategies=("ps",), ps_per_worker=1e6), ValueError,
     r"^--ps-per-worker 1e\+06 with --nodes 1 makes 1,000,000 parameter server nodes: allowed: 0 to 4096 parameter "
     r"server nodes$"),
    (CostGrid(nodes=(1,), strategies=("ps",), ps_per_worker=4096.5), ValueError, r"makes 4,097 parameter server"),
    (CostGrid(nodes=(1, 16), strategies=("ps",), ps_per_worker=1e308), ValueError,  # was an OverflowError
     r"^--ps-per-worker 1e\+308 with --nodes 1 makes 1e\+308 parameter server nodes: allowed: 0 to 4096"),
    (CostGrid(nodes=(16,), strategies=("ps",), ps_per_worker=1e308), ValueError, r"makes inf parameter server"),
])
def test_bad_grids_are_refused_in_one_line(grid, error, match):
    with pytest.raises(error, match=match):
        grid.check()


@pytest.mark.parametrize("grid", [
    CostGrid(nodes=(4096,), strategies=("reducers",), reducers_per_worker=1),
    CostGrid(nodes=(1,), strategies=("ps",), ps_per_worker=4096),
    CostGrid(nodes=(2048,), strategies=("ps",)),  # the default 2 per worker, at the limit
])
def test_a_tier_of_exactly_the_node_limit_is_priced(grid):
    grid.check()
    strategy = grid.strategies[0]
    assert grid.tier_nodes(strategy, grid.nodes[0]) == 4096
    result = evaluate_grid(grid.model_copy(update={"batch_per_gpu": 1, "instance_types": ("p4d.24xlarge",)}),
                           imagenet(), book_for(grid), today=TODAY)
    assert [r.tier_nodes for r in result.rows] == [4096]


def test_a_batch_larger_than_a_ranks_share_is_refused_as_plan_refuses_it():
    """1,281,167 images over 16 x 8 ranks is 10,009 per rank: a batch of 10,009 is one step, 10,010 is none (it was
    priced: a 1.4e17 s step, and the time to train unchanged)."""
    grid = CostGrid(instance_types=("p5.48xlarge",), nodes=(16,), strategies=("horovod",), batch_per_gpu=10_009)
    assert len(evaluate_grid(grid, imagenet(), book_for(grid), today=TODAY).rows) == 1
    with pytest.raises(ValueError, match=r"^16 x p5.48xlarge: 1,281,167 images over 128 ranks is 10,009 per rank, "
                                         r"fewer than one batch of 10010; use fewer nodes or a smaller "
                                         r"--batch-per-gpu$"):
        evaluate_grid(grid.model_copy(update={"batch_per_gpu": 10_010}), imagenet(), book_for(grid), today=TODAY)


def test_spot_cells_come_from_cached_quotes_and_missing_ones_are_noted():
    grid = CostGrid(instance_types=("p4d.24xlarge", "p5.48xlarge"), nodes=(2, 4), strategies=("horovod",),
                    markets=("on-demand", "spot"))
    spot = [PriceQuote(instance_type="p4d.24xlarge", market="spot", usd_per_hour=9.8453, date=TODAY,
                       source="EC2 DescribeSpotPriceHistory (test)")]
    result = evaluate_grid(grid, imagenet(), book_for(grid, spot), today=TODAY)
    assert sorted({(r.instance_type, r.market) for r in result.rows}) == [
        ("p4d.24xlarge", "on-demand"), ("p4d.24xlarge", "spot"), ("p5.48xlarge", "on-demand")]
    assert result.notes == ["no spot price for p5.48xlarge: those cells are left out (fetch spot prices with "
                            "--refresh-prices)"]
    by = {(r.market, r.nodes): r for r in result.rows if r.instance_type == "p4d.24xlarge"}
    assert by["spot", 2].images_per_sec == by["on-demand", 2].images_per_sec
    assert by["spot", 2].cost_usd == pytest.approx(by["on-demand", 2].cost_usd * 9.8453 / 21.957642)
    with pytest.raises(ValueError, match="no cell of the grid could be priced"):
        evaluate_grid(grid.model_copy(update={"markets": ("spot",), "instance_types": ("p5.48xlarge",)}),
                      imagenet(), book_for(grid), today=TODAY)


# --- The rendered report -----------------------------------------------------------------------------------------


class _Balance(HTMLParser):
    """Fails on a closing tag that does not match the open one; void elements need no closing tag."""

    VOID = {"meta", "img", "br", "hr", "link", "input"}

    def __init__(self):
        super().__init__()
        self.stack: list[str] = []
        self.tags: list[str] = []
        self.images: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        if tag == "img":
            self.images.append(dict(attrs)["src"])
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        assert self.stack and self.stack[-1] == tag, f"</{tag}> closes <{self.stack[-1] if self.stack else None}>"
        self.stack.pop()


@pytest.fixture(scope="module")
def report():
    grid = CostGrid(nodes=(1, 2, 8), markets=("on-demand", "spot"))
    spot = [PriceQuote(instance_type="p4d.24xlarge", market="spot", usd_per_hour=9.8453, date=TODAY,
                       source="EC2 DescribeSpotPriceHistory (test)")]
    result = evaluate_grid(grid, imagenet(), book_for(grid, spot), today=TODAY)
    return result, costreport.render(result)


def test_report_has_every_file(report):
    _, files = report
    assert set(files) == {"report.md", "report.html", "grid.csv", *costreport.PLOTS}


def test_plots_are_non_empty_pngs(report):
    _, files = report
    for name in costreport.PLOTS:
        assert files[name].startswith(PNG_MAGIC) and len(files[name]) > 10_000, name


def test_html_parses_is_standalone_and_embeds_the_plots(report):
    result, files = report
    page = files["report.html"].decode()
    parser = _Balance()
    parser.feed(page)
    parser.close()
    assert parser.stack == []
    assert parser.tags[0] == "html" and "table" in parser.tags
    assert len(parser.images) == len(costreport.PLOTS)
    assert all(src.startswith("data:image/png;base64,") for src in parser.images)  # opens offline, one file
    assert "http://" not in page.replace("https://", "") and "<script" not in page
    assert page.count('class="front"') == len(result.pareto)


def test_markdown_states_the_prices_it_used_with_their_dates(report):
    result, files = report
    md = files["report.md"].decode()
    assert "## Prices used" in md
    for q in result.prices:
        assert f"| {q.instance_type} | {q.market} | {q.usd_per_hour:g} | {q.date} |" in md
    assert "no spot price for " in md  # the note, in the report too
    for name in costreport.PLOTS:
        assert f"]({name})" in md
    assert md.count("\n| * |") == len(result.pareto)


def test_csv_has_one_row_per_cell_and_marks_the_frontier(report):
    result, files = report
    rows = list(csv.DictReader(io.StringIO(files["grid.csv"].decode())))
    assert len(rows) == len(result.rows)
    assert sum(r["pareto"] == "true" for r in rows) == len(result.pareto)
    first = rows[0]
    assert float(first["cost_usd"]) == pytest.approx(result.rows[0].cost_usd, rel=1e-5)
    assert first["instance_type"] == result.rows[0].instance_type


def test_write_report_replaces_files_atomically(tmp_path):
    out = tmp_path / "r"
    costreport.write_report(out, {"a.txt": b"one"})
    costreport.write_report(out, {"a.txt": b"two", "b.txt": b"x"})
    assert (out / "a.txt").read_bytes() == b"two"
    assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]


# --- The command ---------------------------------------------------------------------------------------------


def run_cli(args: list[str], home: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setenv("SCALETRAIN_HOME", str(home))
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_launch_cost_writes_the_report(tmp_path, monkeypatch, capsys):
    out = tmp_path / "report"
    code, stdout, stderr = run_cli(["cost", "--instance-types", "p3.16xlarge,p4d.24xlarge", "--nodes", "1,8",
                                    "--out", str(out)], tmp_path / "home", monkeypatch, capsys)
    assert code == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(["report.md", "report.html", "grid.csv",
                                                            *costreport.PLOTS])
    assert "Pareto frontier of 12 shapes" in stdout
    assert f"report: {out / 'report.html'}" in stdout
    assert "p3.16xlarge on-demand $24.48/h as of 2026-09-24" in stdout


@pytest.mark.parametrize("markets", ["on-demand,spot", "spot"])
def test_refresh_without_aws_is_one_line_and_fails(markets, tmp_path, monkeypatch, capsys):
    """--refresh-prices asks for AWS's prices: without them the command stops (non-zero, one line naming the fetch
    and the way without the flag), instead of two warnings and a report from the catalog; it never tells the user to
    pass the flag they passed."""
    def offline(service):
        raise RuntimeError("Could not connect to the endpoint URL: https://api.pricing.us-east-1.amazonaws.com/")

    monkeypatch.setattr(pricing, "_client", offline)
    out = tmp_path / "report"
    code, stdout, stderr = run_cli(["cost", "--instance-types", "p5.48xlarge", "--strategies", "horovod", "--nodes",
                                    "2", "--markets", markets, "--refresh-prices", "--out", str(out)],
                                   tmp_path / "home", monkeypatch, capsys)
    assert code == 1 and stdout == ""
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --refresh-prices: could not fetch "), stderr
    assert "(RuntimeError: Could not connect" in lines[0] and "leave out --refresh-prices" in lines[0]
    assert "pass --refresh-prices" not in stderr and "with --refresh-prices" not in stderr
    assert not out.exists() and not pricing.cache_path(tmp_path / "home").exists()


def test_out_empty_is_refused_not_the_current_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = run_cli(["cost", "--instance-types", "p5.48xlarge", "--strategies", "horovod", "--nodes",
                                    "2", "--out", ""], tmp_path / "home", monkeypatch, capsys)
    assert code == 2 and stderr.startswith("error: --out needs a directory name, got ''"), stderr
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "grid.csv").exists()


def test_refreshed_prices_are_cached_and_used_next_time(tmp_path, monkeypatch, capsys):
    fetched = [PriceQuote(instance_type="p5.48xlarge", market="on-demand", usd_per_hour=50.0, date=TODAY,
                          source="AWS Price List API (test)")]
    monkeypatch.setattr(pricing, "refresh", lambda names, markets: (fetched, []))
    home = tmp_path / "home"
    args = ["cost", "--instance-types", "p5.48xlarge", "--strategies", "horovod", "--nodes", "2"]
    code, stdout, stderr = run_cli([*args, "--refresh-prices", "--out", str(tmp_path / "a")], home, monkeypatch,
                                   capsys)
    assert code == 0, stderr
    assert "p5.48xlarge on-demand $50/h as of 2026-11-21" in stdout
    assert pricing.load_cache(pricing.cache_path(home))[0] == fetched
    monkeypatch.setattr(pricing, "refresh", lambda names, markets: pytest.fail("no refresh without the flag"))
    code, stdout, _ = run_cli([*args, "--out", str(tmp_path / "b")], home, monkeypatch, capsys)
    assert code == 0 and "p5.48xlarge on-demand $50/h as of 2026-11-21" in stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", ",".join(str(n) for n in range(1, 1001))], "error: the grid has 12,000 cells"),
    (["--instance-types", "p9.huge"], "error: unknown instance type 'p9.huge'; choose one of:"),
    (["--strategies", "horovod,ring"], "error: unknown strategy 'ring'; choose from: horovod, ps, reducers"),
    (["--nodes", "1,two"], "error: --nodes: 'two' is not a valid item"),
    (["--markets", "spot", "--instance-types", "p5.48xlarge"], "error: no cell of the grid could be priced: no spot "
                                                               "price for "),
    (["--ps-per-worker", "0"], "error: --ps-per-worker must be > 0, got 0"),
    (["--reducers-per-worker", "-1"], "error: --reducers-per-worker must be > 0, got -1"),
    (["--gpu-throughput", "0"], "error: --gpu-throughput must be a number of images/s > 0, got 0"),
    (["--ps-per-worker", "inf", "--strategies", "ps"], "error: --ps-per-worker must be a (finite) number, got 'inf'"),
    (["--instance-types", ""], "error: --instance-types needs a comma-separated list, got ''"),
    (["--epochs", "0"], "error: --epochs must be >= 1, got 0"),
    (["--ps-per-worker", "1e308", "--strategies", "ps"],
     "error: --ps-per-worker 1e+308 with --nodes 1 makes 1e+308 parameter server nodes: allowed: 0 to 4096"),
    (["--nodes", "4096", "--strategies", "reducers", "--reducers-per-worker", "3"],
     "error: --reducers-per-worker 3 with --nodes 4096 makes 12,288 reducer nodes: allowed: 0 to 4096 reducer nodes"),
    (["--batch-per-gpu", str(2**53), "--instance-types", "p5.48xlarge"],
     "error: 1 x p5.48xlarge: 1,281,167 images over 8 ranks is 160,145 per rank, fewer than one batch of "
     f"{2**53}; use fewer nodes or a smaller --batch-per-gpu"),
    # Past 2**53 (10**400 was an OverflowError traceback).
    (["--batch-per-gpu", str(2**53 + 1)], "error: --batch-per-gpu must be at most 9,007,199,254,740,992 (2**53, "
                                          "the largest count the model holds exactly), got 9,007,199,254,740,993"),
    (["--images-per-epoch", "1" + "0" * 400], "error: --images-per-epoch must be at most 9,007,199,254,740,992"),
    # A figure the model cannot count: the plot's traceback (log scale of inf).
    (["--gpu-throughput", "1e-300"], "error: 1 x p3.16xlarge: the cost comes to inf, beyond what the model can count "
                                     "(per-GPU throughput 1e-300 img/s, override (--gpu-throughput))"),
    # A GPU type as the tier's: exit 1 before, from the model, once per run.
    (["--ps-type", "p4d.24xlarge"], "error: --ps-type p4d.24xlarge has GPUs; parameter servers run on CPU instance "
                                    "types (default m5.24xlarge)"),
    (["--reducer-type", "p5.48xlarge", "--strategies", "reducers"],
     "error: --reducer-type p5.48xlarge has GPUs; reducers run on CPU instance types (default c5n.18xlarge)"),
    (["--epochs", "10001"], "error: --epochs must be <= 10000, got 10001 (allowed: 1 to 10000 epochs)"),
    (["--precision", "fp8"], "error: --precision must be one of: amp, fp32; got 'fp8'"),
    (["--nodes", "2,4097"], "error: --nodes 4097: allowed: 1 to 4096 worker nodes"),
])
def test_bad_input_is_one_line_and_non_zero(tmp_path, monkeypatch, capsys, args, message):
    code, stdout, stderr = run_cli(["cost", *args, "--out", str(tmp_path / "r")], tmp_path / "home", monkeypatch,
                                   capsys)
    # A bad option is a usage error (2, as click's own); a grid no price known here covers is not (1).
    assert code == (1 if "could be priced" in message else 2)
    assert "Input should" not in stderr and "_" not in stderr.split()[1], stderr
    assert stderr.startswith(message) and stderr.count("\n") == 1, stderr
    assert not (tmp_path / "r").exists()


def test_a_gpu_tier_type_is_no_matter_when_its_strategy_is_not_compared(tmp_path, monkeypatch, capsys):
    code, _, stderr = run_cli(["cost", "--instance-types", "p5.48xlarge", "--strategies", "horovod,reducers",
                               "--nodes", "1", "--ps-type", "p4d.24xlarge", "--out", str(tmp_path / "r")],
                              tmp_path / "home", monkeypatch, capsys)
    assert code == 0, stderr


def test_the_smallest_throughput_the_model_can_count_makes_a_report(tmp_path, monkeypatch, capsys):
    code, _, stderr = run_cli(["cost", "--instance-types", "p3.16xlarge", "--strategies", "horovod", "--nodes", "1",
                               "--gpu-throughput", "1e-290", "--out", str(tmp_path / "r")], tmp_path / "home",
                              monkeypatch, capsys)
    assert code == 0 and (tmp_path / "r" / "time_vs_cost.png").stat().st_size > 0, stderr


def _bad_outs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    (tmp_path / "file").write_text("mine\n")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere" / "x")
    return {
        "file": (tmp_path / "file", "is a file; name a directory"),
        "under a file": (tmp_path / "file" / "r", f"{tmp_path / 'file'} is a file, not a directory"),
        "loop": (tmp_path / "loop", f"{tmp_path / 'loop'} is a symbolic link loop; name a directory"),
        "under a loop": (tmp_path / "loop" / "r", f"{tmp_path / 'loop'} is a symbolic link loop"),
        "dangling": (tmp_path / "dangling", f"is a symbolic link to {tmp_path / 'nowhere' / 'x'}, which does not "
                                            f"exist; name a directory"),
    }


def test_an_out_that_looks_like_an_option_is_refused(tmp_path, monkeypatch, capsys):
    """`launch cost --out --help` wrote the report into a directory named --help."""
    monkeypatch.chdir(tmp_path)
    code, _, stderr = run_cli(["cost", "--out", "--help"], tmp_path / "home", monkeypatch, capsys)
    assert code == 2 and stderr.startswith("error: --out --help looks like an option, not a directory; for a "
                                           "directory of that name write ./--help"), stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("case", ["file", "under a file", "loop", "under a loop", "dangling"])
def test_an_out_that_cannot_be_a_directory_is_a_usage_error_before_any_work(case, tmp_path, monkeypatch, capsys):
    """A symbolic link loop said "File exists" (exit 1), after the whole grid was computed and plotted."""
    from launcher.cost import report as costreport

    out, said = _bad_outs(tmp_path)[case]
    monkeypatch.setattr(costreport, "evaluate_grid", lambda *a, **kw: pytest.fail("computed before --out's check"))
    code, stdout, stderr = run_cli(["cost", "--out", str(out)], tmp_path / "home", monkeypatch, capsys)
    assert code == 2 and stdout == "" and stderr.count("\n") == 1, stderr
    assert stderr.startswith(f"error: --out {out}") and said in stderr, stderr
    assert (tmp_path / "file").read_text() == "mine\n"


def test_an_out_whose_directory_is_not_there_yet_is_made(tmp_path, monkeypatch, capsys):
    (tmp_path / "link").symlink_to(tmp_path / "real", target_is_directory=True)
    (tmp_path / "real").mkdir()
    for out in (tmp_path / "new" / "deeper", tmp_path / "link" / "r"):
        code, _, stderr = run_cli(["cost", "--instance-types", "p5.48xlarge", "--strategies", "horovod", "--nodes",
                                   "1", "--out", str(out)], tmp_path / "home", monkeypatch, capsys)
        assert code == 0 and (out / "report.html").is_file(), stderr
