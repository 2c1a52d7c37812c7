"""`launch plan` and `launch cost` with --workload (issue 27 item 4): the reducer tier shortens BERT-large's step on
64 x p3dn.24xlarge and buys nothing for ResNet-50 on 8 nodes; a custom model from --params; bad input in one line."""

from __future__ import annotations

import csv
import json

import pytest

from launcher import cli

TIER = ["--reducers", "64", "--reducer-type", "c5n.18xlarge"]


def launch(args: list[str], tmp_path, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))  # no price cache, no measurements: the catalog
    code = cli.main(args)
    out, err = capsys.readouterr()
    return code, out, err


def estimate_of(args: list[str], tmp_path, monkeypatch, capsys) -> dict:
    code, out, err = launch(["plan", *args, "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    return json.loads(out)["estimate"]


# --- The done-when pairs --------------------------------------------------------------------------------


def test_bert_large_on_64_p3dn_the_reducer_tier_shortens_the_step(tmp_path, monkeypatch, capsys):
    shape = ["--workload", "bert-large", "--nodes", "64", "--instance-type", "p3dn.24xlarge"]
    ring = estimate_of(shape, tmp_path, monkeypatch, capsys)
    tier = estimate_of(shape + TIER, tmp_path, monkeypatch, capsys)
    assert (ring["workload"], ring["rate_unit"], ring["accumulation_steps"]) == ("bert-large", "seq/s", 2)
    assert (tier["strategy"], tier["tier_nodes"], tier["tier_type"]) == ("reducers", 64, "c5n.18xlarge")
    assert tier["step_time_s"] < 0.9 * ring["step_time_s"]
    assert tier["images_per_sec"] > ring["images_per_sec"] and tier["cost_usd"] < ring["cost_usd"]


@pytest.mark.parametrize("instance", ["p3dn.24xlarge", "p4d.24xlarge"])
def test_resnet50_on_8_nodes_the_reducer_tier_does_not(instance, tmp_path, monkeypatch, capsys):
    shape = ["--nodes", "8", "--instance-type", instance]
    ring = estimate_of(shape, tmp_path, monkeypatch, capsys)
    tier = estimate_of(shape + ["--reducers", "8", "--reducer-type", "c5n.18xlarge"], tmp_path, monkeypatch, capsys)
    assert ring["workload"] == "resnet50"
    assert tier["step_time_s"] == pytest.approx(ring["step_time_s"]) and tier["cost_usd"] > ring["cost_usd"]
    assert ring["scaling_efficiency"] < 0.96  # item 5: not 100% any more


def test_the_tables_say_sequences_accumulation_and_where_the_tier_pays(tmp_path, monkeypatch, capsys):
    code, out, err = launch(["plan", "--workload", "bert-large", "--nodes", "64", "--instance-type", "p3dn.24xlarge"],
                            tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "workload bert-large" in out.splitlines()[0]
    flat = " ".join(out.split())
    for text in ("224 seq/s", "2 micro-batches of 64 per GPU", "stragglers + negotiation",
                 "network-bound:", "the reducer tier (--reducers N --reducer-type c5n.18xlarge)",
                 "train bert-large with your own script (`launch run`)",
                 "(1 epoch + validation)", "(the slowest of 64 nodes)"):
        assert text in flat, text


def test_resnet50_is_the_default_workload(tmp_path, monkeypatch, capsys):
    shape = ["--nodes", "2", "--instance-type", "p4d.24xlarge"]
    assert estimate_of(shape, tmp_path, monkeypatch, capsys) == \
        estimate_of(shape + ["--workload", "resnet50"], tmp_path, monkeypatch, capsys)


def test_a_custom_model_from_its_parameters_and_flops(tmp_path, monkeypatch, capsys):
    e = estimate_of(["--nodes", "4", "--instance-type", "p4d.24xlarge", "--params", "1000000000", "--sample-gflops",
                     "49.08", "--samples-per-epoch", "1000000", "--epochs", "2"], tmp_path, monkeypatch, capsys)
    assert (e["workload"], e["rate_unit"]) == ("custom", "samples/s")
    assert e["gpu_images_per_sec"] == pytest.approx(2470 / 2)  # twice ResNet-50's 24.54 GFLOP per image
    assert e["network_bytes_per_node"] == pytest.approx(2 * 3 / 4 * 4e9)  # 1B fp32 gradients, ring of 4


@pytest.mark.parametrize(("args", "message"), [
    (["--workload", "gpt"], "error: --workload: unknown workload 'gpt'; choose one of: resnet50, bert-large, "
                            "mask-rcnn"),
    (["--params", "1000"], "error: a custom model needs --params, --sample-gflops and --samples-per-epoch; missing "
                           "--sample-gflops, --samples-per-epoch"),
    (["--workload", "bert-large", "--params", "1", "--sample-gflops", "1", "--samples-per-epoch", "1"],
     "error: --workload bert-large has its own model"),
    (["--params", "0", "--sample-gflops", "1", "--samples-per-epoch", "1"], "error: --params must be >= 1, got 0"),
    (["--params", "1", "--sample-gflops", "0", "--samples-per-epoch", "1"],
     "error: --sample-gflops must be a positive"),
    (["--workload", "bert-large", "--epochs", "0"], "error: --epochs must be >= 1, got 0"),
])
@pytest.mark.parametrize("command", ["plan", "cost"])
def test_bad_workload_input_is_one_line(command, args, message, tmp_path, monkeypatch, capsys):
    shape = ["--nodes", "2", "--instance-type", "p4d.24xlarge"] if command == "plan" else \
        ["--nodes", "2", "--instance-types", "p4d.24xlarge", "--out", str(tmp_path / "r")]
    code, out, err = launch([command, *shape, *args], tmp_path, monkeypatch, capsys)
    assert code == 2 and out == "" and err.startswith(message) and err.count("\n") == 1, err
    assert "Traceback" not in err


def test_cost_compares_bert_large_shapes_in_sequences(tmp_path, monkeypatch, capsys):
    out_dir = tmp_path / "report"
    code, out, err = launch(["cost", "--workload", "bert-large", "--instance-types", "p3dn.24xlarge", "--nodes",
                             "16,64", "--strategies", "horovod,reducers", "--out", str(out_dir)],
                            tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "seq/s" in out
    report = (out_dir / "report.md").read_text()
    assert "1 epochs of 461,242,368 sequences (bert-large)" in report and "| seq/s |" in report
    rows = {(r["nodes"], r["strategy"]): r for r in csv.DictReader((out_dir / "grid.csv").open())}
    assert float(rows[("64", "reducers")]["step_time_s"]) < float(rows[("64", "horovod")]["step_time_s"])
