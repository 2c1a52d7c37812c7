"""`launch plan`: the offline plan for a cluster shape (golden per family), its EFA env and devices, the command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from golden import assert_golden

from ami import paths
from ami.render import load_versions
from infra.catalog import get
from launcher import cli
from launcher.cost.inputs import imagenet
from launcher.plans import efa, offline
from launcher.plans import job as plan
from launcher.plans.efa import SoftwareVersions

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ["p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge"]
CONTRACT = {"hostfile", "mpirun", "env", "efa_devices", "lr_schedule", "estimate"}
ESTIMATE_KEYS = {"images_per_sec", "scaling_efficiency", "step_time_s", "comm_time_s", "time_to_train_s", "cost_usd"}


def launch_plan(args: list[str], tmp_path, monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))  # no price cache, no measurements: the catalog
    code = cli.main(["plan", *args])
    out, err = capsys.readouterr()
    return code, out, err


# --- Goldens: one per family ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_plan_json_golden(name, tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(["--nodes", "2", "--instance-type", name, "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert_golden(f"plan-{name}.json", out)
    doc = json.loads(out)
    assert doc.keys() >= CONTRACT and doc["estimate"].keys() >= ESTIMATE_KEYS
    assert doc == offline.plan_document(get(name), 2, imagenet(90))
    # The image's paths: its Open MPI by absolute path with --prefix for the remote orted, its venv's python.
    assert doc["mpirun"][:3] == [paths.MPIRUN, "--prefix", paths.MPI_PREFIX]
    assert paths.PYTHON in doc["mpirun"] and doc["placeholders"]["python"] == paths.PYTHON


def test_plan_json_golden_with_reducers(tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(["--nodes", "4", "--instance-type", "p3dn.24xlarge", "--reducers", "4",
                                  "--reducer-type", "c5n.18xlarge", "--epochs", "30", "--batch-per-gpu", "128",
                                  "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert_golden("plan-p3dn.24xlarge-reducers.json", out)
    doc = json.loads(out)
    assert doc["reducer_nodes"] == ["reducer0", "reducer1", "reducer2", "reducer3"]
    # 8 training ranks per worker node; one reducer process per reducer node, started by the same MPMD mpirun
    assert doc["hostfile"] == "".join(f"node{i} slots=8\n" for i in range(4)) + "".join(
        f"reducer{i} slots=1\n" for i in range(4))
    assert ":" in doc["mpirun"] and doc["mpirun"][-4:-2] == ["-m", "training.reducer"]
    assert doc["estimate"]["strategy"] == "reducers" and doc["estimate"]["tier_nodes"] == 4


def test_reducers_0_means_no_reducer_tier(tmp_path, monkeypatch, capsys):
    # An explicit 0 is not "not given": it used to plan the model's default of 8 reducers.
    code, out, err = launch_plan(["--nodes", "8", "--instance-type", "p4d.24xlarge", "--reducers", "0",
                                  "--reducer-type", "c5n.18xlarge", "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert (doc["shape"]["strategy"], doc["shape"]["reducers"], doc["reducer_nodes"]) == ("horovod", 0, [])
    assert doc["estimate"]["tier_nodes"] == 0 and ":" not in doc["mpirun"]
    assert doc["hostfile"] == "".join(f"node{i} slots=8\n" for i in range(8))
    assert err == "warning: --reducers 0 plans no reducer tier; --reducer-type c5n.18xlarge is not used\n"
    # Left out, the count is the model's; asked for a tier with none in it, one line says so.
    code, out, err = launch_plan(["--nodes", "8", "--instance-type", "p4d.24xlarge", "--reducer-type",
                                  "c5n.18xlarge", "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0 and json.loads(out)["shape"]["reducers"] == 8
    code, out, err = launch_plan(["--nodes", "8", "--instance-type", "p4d.24xlarge", "--strategy", "reducers",
                                  "--reducers", "0"], tmp_path, monkeypatch, capsys)
    assert code == 2 and out == "" and err.startswith("error: the reducers strategy needs at least 1 reducer node, "
                                                      "got 0 (see `launch plan --help`)")


# --- Tables in a pipe or a log ----------------------------------------------------------------------------------


@pytest.mark.parametrize("args", [
    ["plan", "--nodes", "8", "--instance-type", "p4d.24xlarge"],
    ["plan", "--nodes", "4", "--instance-type", "p3dn.24xlarge", "--reducers", "4"],
    ["cost", "--nodes", "1,16"],
], ids=["plan", "plan-reducers", "cost"])
def test_tables_stay_readable_when_output_is_piped(args, tmp_path):
    # stdout a pipe (as with `| cat` or `> log`), no COLUMNS: rich used to take 80 columns and cut cells to `i…`.
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    env |= {"SCALETRAIN_HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    extra = ["--out", str(tmp_path / "report")] if args[0] == "cost" else []
    proc = subprocess.run([sys.executable, "-m", "launcher", *args, *extra], capture_output=True, text=True,
                          env=env, cwd=ROOT, stdin=subprocess.DEVNULL, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith(("│", "┃"))]
    assert rows, proc.stdout
    assert "…" not in proc.stdout, proc.stdout
    # One line per row: no cell wrapped onto a continuation line whose first cell is empty.
    assert not [ln for ln in rows if ln.startswith("│ ") and ln.split("│")[1].strip() == ""], proc.stdout
    if args[0] == "cost":
        assert "│ 16 x p5.48xlarge " in proc.stdout


# --- What the plan says, family by family ----------------------------------------------------------------------


def test_p3_16xlarge_has_nothing_efa_and_seed_003s_mpi_flags():
    doc = offline.plan_document(get("p3.16xlarge"), 8, imagenet(90))
    assert not any(k.startswith(("FI_", "NCCL_")) for k in doc["env"])
    assert doc["efa_devices"] == [{"node": f"node{i}", "interfaces": []} for i in range(8)]
    argv = doc["mpirun"]
    assert argv[argv.index("btl") + 1] == "^openib" and "btl_tcp_if_exclude" not in argv
    assert argv[argv.index("-np") + 1] == "64"
    assert doc["estimate"]["images_per_sec"] == pytest.approx(40_992, rel=1e-3)


@pytest.mark.parametrize(("name", "cards", "rdma"), [("p3dn.24xlarge", 1, False), ("p4d.24xlarge", 4, True),
                                                     ("p5.48xlarge", 32, True)])
def test_efa_types_get_interfaces_per_card_and_the_efa_env(name, cards, rdma):
    doc = offline.plan_document(get(name), 2, imagenet(90))
    for node, dev in zip(("node0", "node1"), doc["efa_devices"], strict=True):
        assert dev["node"] == node
        assert [(i["network_card_index"], i["device_index"]) for i in dev["interfaces"]] == \
            [(0, 0)] + [(card, 0) for card in range(1, cards)]
    # The plan is for the image ami/ builds: its aws-ofi-nccl and libfabric need none of the old workarounds.
    assert doc["software"] == {"aws_ofi_nccl": load_versions().aws_ofi_nccl, "libfabric": load_versions().libfabric}
    assert doc["env"] == {"OMP_NUM_THREADS": str(get(name).vcpus // get(name).gpus), "PYTHONUNBUFFERED": "1",
                          "HOROVOD_CYCLE_TIME": "1", "FI_EFA_USE_HUGE_PAGE": "0"}
    # An image with software old enough to need them gets them (the cheatsheet's presets).
    old = offline.plan_document(get(name), 2, imagenet(90), versions=SoftwareVersions(aws_ofi_nccl="1.5.0"))["env"]
    assert old["FI_PROVIDER"] == "efa" and old["NCCL_PROTO"] == "simple" and ("FI_EFA_USE_DEVICE_RDMA" in old) == rdma
    argv = doc["mpirun"]
    assert argv[argv.index("btl") + 1] == "tcp,self"
    assert argv[argv.index("btl_tcp_if_exclude") + 1] == "lo,docker0"
    assert "FI_EFA_USE_HUGE_PAGE=0" in argv and argv[argv.index("FI_EFA_USE_HUGE_PAGE=0") - 1] == "-x"
    assert argv.index("FI_EFA_USE_HUGE_PAGE=0") < argv.index("training.train")


def test_lr_schedule_is_seed_000s_at_every_epoch_boundary():
    doc = offline.plan_document(get("p3.16xlarge"), 8, imagenet(90))
    schedule = doc["lr_schedule"]
    assert [e for e, _ in schedule] == list(range(91))
    assert schedule[0][1] == pytest.approx(0.001)
    assert schedule[10][1] == pytest.approx(6.4)  # 0.1 per 256 x 16,384
    assert schedule[90][1] == 0.0
    assert max(lr for _, lr in schedule) == schedule[10][1]
    assert doc["steps_per_epoch"] == 1_281_167 // 64 // 256


def test_offline_plan_does_not_import_torch():
    code = ("import sys; import launcher.plans.offline, launcher.cost.report, launcher.cost.shell; "
            "sys.exit(1 if 'torch' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


# --- launcher.plans.efa -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("versions", "expected"), [
    # Unknown: current software's settings, not the oldest (NCCL_PROTO=simple costs bandwidth); DEVICE_RDMA is
    # harmless on current software and kept for p4/p5.
    (None, {"FI_EFA_USE_DEVICE_RDMA", "FI_EFA_USE_HUGE_PAGE"}),
    (SoftwareVersions(libfabric="1.22.0amzn4.0"), {"FI_EFA_USE_DEVICE_RDMA", "FI_EFA_USE_HUGE_PAGE"}),
    (SoftwareVersions(aws_ofi_nccl="1.5.0"), {"FI_EFA_USE_DEVICE_RDMA", "FI_EFA_USE_HUGE_PAGE", "FI_PROVIDER",
                                              "NCCL_PROTO"}),
    (SoftwareVersions(aws_ofi_nccl="1.6.0-aws"), {"FI_EFA_USE_DEVICE_RDMA", "FI_EFA_USE_HUGE_PAGE"}),
    (SoftwareVersions(aws_ofi_nccl="v1.7.3-aws"), {"FI_EFA_USE_DEVICE_RDMA", "FI_EFA_USE_HUGE_PAGE"}),
    (SoftwareVersions(aws_ofi_nccl="1.7.3-aws", libfabric="1.18.1amzn1.0"), {"FI_EFA_USE_HUGE_PAGE"}),
])
def test_fabric_env_follows_the_aws_ofi_nccl_cheatsheet_by_version(versions, expected):
    assert set(efa.fabric_env(get("p4d.24xlarge"), versions)) == expected


def test_fabric_env_without_rdma_and_without_efa():
    assert efa.fabric_env(get("p3dn.24xlarge")) == {"FI_EFA_USE_HUGE_PAGE": "0"}
    assert efa.fabric_env(get("p3dn.24xlarge"), SoftwareVersions(aws_ofi_nccl="1.5.0")) == {
        "FI_EFA_USE_HUGE_PAGE": "0", "FI_PROVIDER": "efa", "NCCL_PROTO": "simple"}
    assert efa.fabric_env(get("p3.16xlarge")) == {}
    assert efa.mpi_mca(get("p3.16xlarge"), mpi_interface=None) == []
    assert efa.mpi_mca(get("p5.48xlarge"), mpi_interface="ens32") == [("pml", "ob1"), ("btl", "tcp,self")]
    with pytest.raises(ValueError, match="cannot read version 'latest'"):
        efa.fabric_env(get("p5.48xlarge"), SoftwareVersions(aws_ofi_nccl="latest"))


def test_fabric_mpirun_argv_replaces_and_adds_mca_settings():
    cluster = offline.hypothetical_cluster(get("p4d.24xlarge"), 2)
    spec = plan.TrainSpec(data="/d", output="/o")
    base = plan.mpirun_argv(cluster, cluster.workers, spec, "/o/hostfile")
    argv = plan.fabric_mpirun_argv(cluster, cluster.workers, spec, "/o/hostfile", fabric_env={"B": "2", "A": "1"},
                                   mca=[("btl", "tcp,self"), ("new_key", "v")])
    assert argv.count("btl") == 1 and argv[argv.index("btl") + 1] == "tcp,self"
    assert argv[argv.index("new_key") - 1] == "--mca" and argv.index("new_key") < argv.index("-x")
    trainer = plan.trainer_argv(cluster.python, plan.sized(spec, cluster.workers))
    assert argv[-len(trainer):] == trainer and trainer[trainer.index("--workers") + 1] == "6"  # p4d: 6 cores per GPU
    assert argv.index("A=1") < argv.index("B=2")
    assert len(argv) == len(base) + 3 + 4  # one new MCA triple, two -x pairs


# --- The command ---------------------------------------------------------------------------------------------------


def test_plan_prints_tables_without_json(tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(["--nodes", "8", "--instance-type", "p3.16xlarge"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert out.startswith("plan: 8 x p3.16xlarge, 64 rank(s), Horovod ring allreduce, on-demand")
    for text in ("40,992 img/s, 90.0% scaling", "network-bound: 5% of each step waits on worker network (TCP)",
                 f"mpirun: {paths.MPIRUN} --prefix {paths.MPI_PREFIX} -np 64",
                 "hostfile:\nnode0 slots=8",
                 "lr: 0.001 at epoch 0, peak 6.4 at epoch 10 (step 780), 0 at epoch 90", "time to train"):
        assert text in out


def test_plan_gpu_throughput_override_and_spot_from_the_cache(tmp_path, monkeypatch, capsys):
    from launcher.cost import aws_prices as pricing
    from launcher.cost.prices import PriceQuote

    pricing.save_cache(pricing.cache_path(tmp_path / "home"), [
        PriceQuote(instance_type="p4d.24xlarge", market="spot", usd_per_hour=9.8453, date="2026-11-21",
                   source="EC2 DescribeSpotPriceHistory (test)")])
    code, out, err = launch_plan(["--nodes", "2", "--instance-type", "p4d.24xlarge", "--market", "spot",
                                  "--gpu-throughput", "3000", "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    e = json.loads(out)["estimate"]
    assert e["market"] == "spot" and e["price_usd_per_hour"] == 9.8453 and e["price_date"] == "2026-11-21"
    assert e["gpu_images_per_sec"] == 3000 and e["throughput_source"] == "override (--gpu-throughput)"


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "2", "--instance-type", "p9.huge"], "error: --instance-type: unknown instance type 'p9.huge'; "
                                                     "choose one of:"),
    (["--nodes", "2", "--instance-type", "c5n.18xlarge"], "error: c5n.18xlarge has no GPUs"),
    (["--nodes", "0", "--instance-type", "p5.48xlarge"], "error: --nodes 0: allowed: 1 to 4096 worker nodes"),
    (["--nodes", "2", "--instance-type", "p5.48xlarge", "--strategy", "ring"], "error: unknown strategy 'ring'"),
    (["--nodes", "2", "--instance-type", "p5.48xlarge", "--strategy", "horovod", "--reducers", "2"],
     "error: the horovod strategy has no reducer or server nodes"),
    (["--nodes", "2", "--instance-type", "p5.48xlarge", "--market", "spot"],
     "error: no spot price for p5.48xlarge in us-east-1; fetch current spot prices with `launch cost "
     "--refresh-prices`"),
    (["--nodes", "2", "--instance-type", "p5.48xlarge", "--precision", "fp32"], "error: no fp32 ResNet-50 figure"),
    (["--nodes", "4096", "--instance-type", "p5.48xlarge"], "error: 1,281,167 images over 32768 ranks is 39 per "
                                                            "rank, fewer than one batch of 256"),
    (["--instance-type", "p5.48xlarge"], "error: Missing option '--nodes'"),
    # The one node limit (infra.catalog.MAX_NODES), on both sides, as `launch cost` and the stack say it.
    (["--nodes", "4097", "--instance-type", "p5.48xlarge", "--images-per-epoch", "999999999"],
     "error: --nodes 4097: allowed: 1 to 4096 worker nodes"),
    (["--nodes", "5000", "--instance-type", "p4d.24xlarge"], "error: --nodes 5000: allowed: 1 to 4096 worker nodes"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--strategy", "reducers", "--reducers", "4097"],
     "error: --reducers 4097: allowed: 0 to 4096 reducer nodes"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--reducers", "-1"],
     "error: --reducers -1: allowed: 0 to 4096 reducer nodes"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--strategy", "ps", "--reducers", "4097"],
     "error: --reducers 4097: allowed: 0 to 4096 parameter server nodes"),
    # The tier the model derives (2 servers, 1 reducer per worker) is held to the same limit.
    (["--nodes", "3000", "--instance-type", "p4d.24xlarge", "--strategy", "ps", "--batch-per-gpu", "1"],
     "error: --strategy ps with --nodes 3000 makes 6,000 parameter server nodes (2 per worker): allowed: 0 to 4096 "
     "parameter server nodes; set the count with --reducers"),
    (["--nodes", "2049", "--instance-type", "p4d.24xlarge", "--strategy", "ps", "--batch-per-gpu", "1"],
     "error: --strategy ps with --nodes 2049 makes 4,098 parameter server nodes"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--gpu-throughput", "0"],
     "error: --gpu-throughput must be a number of images/s > 0, got 0"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--precision", "fp8"],
     "error: --precision must be one of: amp, fp32; got 'fp8'"),
    # A warmup that reaches the end of the run: the LR would never decay.
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--warmup-epochs", "200"],
     "error: --warmup-epochs 200 reaches the end of the 90-epoch run"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", "15", "--warmup-epochs", "15"],
     "error: --warmup-epochs 15 reaches the end of the 15-epoch run"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--warmup-epochs", "-1"],
     "error: --warmup-epochs must be >= 0, got -1"),
    # A plan builds its LR schedule per epoch: 10^9 epochs ran out of memory.
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", "10001"],
     "error: --epochs must be <= 10000, got 10001 (allowed: 1 to 10000 epochs)"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", "1000000000"],
     "error: --epochs must be <= 10000, got 1000000000"),
    (["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", "0"], "error: --epochs must be >= 1, got 0"),
    # Figures the model cannot count: --json printed `Infinity` (not JSON), the tables a 300-digit time to train.
    (["--nodes", "1", "--instance-type", "p4d.24xlarge", "--gpu-throughput", "1e-300", "--json"],
     "error: 1 x p4d.24xlarge: the cost comes to inf, beyond what the model can count (per-GPU throughput 1e-300 "
     "img/s, override (--gpu-throughput))"),
    (["--nodes", "1", "--instance-type", "p4d.24xlarge", "--params", "1", "--sample-gflops", "1e308",
      "--samples-per-epoch", "100000"], "error: 1 x p4d.24xlarge: the cost comes to inf"),
    # Counts past 2**53 (10**400 was an OverflowError traceback); '' quietly meant the default.
    (["--nodes", "1", "--instance-type", "p4d.24xlarge", "--images-per-epoch", str(2**53 + 1)],
     "error: --images-per-epoch must be at most 9,007,199,254,740,992 (2**53, the largest count the model holds "
     "exactly), got 9,007,199,254,740,993"),
    (["--nodes", "1", "--instance-type", "p4d.24xlarge", "--batch-per-gpu", "1" + "0" * 400],
     "error: --batch-per-gpu must be at most 9,007,199,254,740,992 (2**53, the largest count the model holds "
     "exactly), got a 401-digit number"),
    (["--nodes", "1", "--instance-type", "p4d.24xlarge", "--params", "1" + "0" * 40, "--sample-gflops", "1",
      "--samples-per-epoch", "100000"], "error: --params must be at most 9,007,199,254,740,992"),
    (["--nodes", "1", "--instance-type", "p4d.24xlarge", "--strategy", ""],
     "error: --strategy needs one of: horovod, reducers, ps, got ''"),
    (["--nodes", "1", "--instance-type", "p4d.24xlarge", "--reducer-type", " "],
     "error: --reducer-type needs an instance type such as c5n.18xlarge, got ' '"),
])
def test_bad_input_is_one_line_and_non_zero(args, message, tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(args, tmp_path, monkeypatch, capsys)
    # A bad option is a usage error (2, as click's own); a price this machine has not fetched is not (1).
    assert code == (1 if "spot price" in message else 2) and out == ""
    assert err.startswith(message) and err.count("\n") == 1, err


def test_the_node_limit_admits_its_last_count(tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(["--nodes", "4096", "--instance-type", "p5.48xlarge", "--images-per-epoch",
                                  "999999999", "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(out)["shape"]["nodes"] == 4096


@pytest.mark.parametrize(("epochs", "warmup"), [(90, 10), (15, 1.67), (1, 0.11), (30, 3.33)])
def test_the_default_warmup_is_the_seeds_share_of_the_run_and_the_plan_shows_it(epochs, warmup, tmp_path,
                                                                                 monkeypatch, capsys):
    from training.train import parse_args

    code, out, err = launch_plan(["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", str(epochs),
                                  "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    doc = json.loads(out)
    assert doc["warmup_epochs"] == warmup
    argv = doc["mpirun"]
    assert float(argv[argv.index("--warmup-epochs") + 1]) == warmup  # what the ranks are told
    # The trainer, left to itself, takes the same default (a run started without the plan's line agrees with it).
    assert parse_args(["--output", "x", "--synthetic", "--epochs", str(epochs)]).warmup_epochs == warmup
    # The peak is reached after the warmup, not at the end: the LR decays to 0 at the last epoch.
    assert doc["lr_schedule"][-1][1] == 0
    code, out, err = launch_plan(["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", str(epochs)],
                                 tmp_path, monkeypatch, capsys)
    assert f"after {warmup:g} warmup epoch(s)" in out


def test_a_derived_tier_at_the_node_limit_is_planned(tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(["--nodes", "2048", "--instance-type", "p4d.24xlarge", "--strategy", "ps",
                                  "--batch-per-gpu", "1", "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(out)["shape"]["reducers"] == 4096


def test_the_epoch_ceiling_admits_its_last_count(tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", "10000", "--json"],
                                 tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(out)["lr_schedule"][-1][0] == 10000


@pytest.mark.parametrize(("epochs", "peak_at"), [(1, "epoch 0.11 (step 34)"), (15, "epoch 1.67 (step 521)"),
                                                 (90, "epoch 10 (step 3,120)")])
def test_the_lr_line_shows_the_real_peak_where_warmup_ends(epochs, peak_at, tmp_path, monkeypatch, capsys):
    """The peak falls where warmup ends, between epoch boundaries for a short run: a 1-epoch run said 'peak 0.001 at
    epoch 0' (the by-epoch schedule's highest entry)."""
    code, out, err = launch_plan(["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", str(epochs)],
                                 tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert f"lr: 0.001 at epoch 0, peak 1.6 at {peak_at}, 0 at epoch {epochs} after" in out


def test_a_warmup_just_short_of_the_run_is_accepted(tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(["--nodes", "2", "--instance-type", "p4d.24xlarge", "--epochs", "15",
                                  "--warmup-epochs", "14.9", "--json"], tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert json.loads(out)["warmup_epochs"] == 14.9


def test_recorded_measurements_replace_the_catalog_figure_and_the_loader_assumption(tmp_path, monkeypatch, capsys):
    from launcher.cost import measured
    from launcher.cost.inputs import GpuThroughput

    home = tmp_path / "home"
    measured.record(measured.path(home), "V100/amp", GpuThroughput(img_per_sec=1000, source="measured: test run"))
    measured.record_loader(measured.loader_path(home), 50.0, "bench: test")
    code, out, err = launch_plan(["--nodes", "1", "--instance-type", "p3.16xlarge", "--json"], tmp_path, monkeypatch,
                                 capsys)
    assert code == 0, err
    e = json.loads(out)["estimate"]
    assert e["throughput_source"] == "measured: test run" and e["gpu_images_per_sec"] == 1000
    # 32 loader processes (4 per GPU, one per physical core) x 50 img/s = 1,600 img/s, fewer than the 8 GPUs'
    # 8 x 1,000 x 0.867: the loader sets the pace (a V100 has no measured JPEG decoder: no GPU decode).
    assert e["bottleneck"] == "data loading (CPU)" and e["images_per_sec"] == pytest.approx(1600)
    assert e["bound"] == "input-bound" and "--resize 256" in e["advice"]
    (home / "measured" / "loader.json").write_text("[]")
    code, out, err = launch_plan(["--nodes", "1", "--instance-type", "p3.16xlarge", "--json"], tmp_path, monkeypatch,
                                 capsys)
    assert code == 0 and err.startswith("warning: ignored the measured-loader file")
    assert json.loads(out)["estimate"]["images_per_sec"] == pytest.approx(8 * 1000 * 0.867)


@pytest.mark.parametrize("args", [
    ["--gpu-throughput", "1e-290"],  # a time to train of 1e302 s: absurd, but a number, so strict JSON holds it
    ["--images-per-epoch", str(2**53)],
    ["--params", str(2**53), "--sample-gflops", "1", "--samples-per-epoch", "100000"],
])
def test_the_last_figures_the_model_can_count_are_planned_as_strict_json(args, tmp_path, monkeypatch, capsys):
    code, out, err = launch_plan(["--nodes", "1", "--instance-type", "p4d.24xlarge", *args, "--json"], tmp_path,
                                 monkeypatch, capsys)
    assert code == 0, err

    def refuse(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    assert json.loads(out, parse_constant=refuse)["estimate"]["cost_usd"] > 0


def test_a_price_the_model_cannot_count_is_this_machines_not_the_options(tmp_path, monkeypatch, capsys):
    """A cached quote of $1e308/h made the cost inf: said as a price to check, exit 1 (nothing typed was wrong); an
    inf one is no quote at all (the cache is ignored with a warning)."""
    prices = tmp_path / "home" / "prices"
    prices.mkdir(parents=True)
    for usd, code, said in ((1e308, 1, "error: 1 x p4d.24xlarge: the cost comes to inf at $1e+308/h, beyond what the "
                                       "model can count; check the price"),
                            ("Infinity", 0, "warning: ignored the price cache")):
        (prices / "us-east-1.json").write_text(
            '{"region": "us-east-1", "quotes": [{"instance_type": "p4d.24xlarge", "market": "on-demand", '
            f'"usd_per_hour": {usd}, "date": "2030-01-01", "source": "test"}}]}}')
        got, out, err = launch_plan(["--nodes", "1", "--instance-type", "p4d.24xlarge", "--json"], tmp_path,
                                    monkeypatch, capsys)
        assert got == code and err.startswith(said), err


def test_figures_no_table_can_hold_are_printed_in_three_digits(tmp_path, monkeypatch, capsys):
    """A time to train of 1e302 s printed 300 digits with thousands separators; a per-GPU throughput of 1e-290
    img/s printed as 0."""
    code, out, err = launch_plan(["--nodes", "1", "--instance-type", "p4d.24xlarge", "--gpu-throughput", "1e-290"],
                                 tmp_path, monkeypatch, capsys)
    assert code == 0, err
    assert "1e-290 img/s (override" in out and "2.77e+295 min" in out and ",000,000" not in out
    code, out, _ = launch_plan(["--nodes", "1", "--instance-type", "p4d.24xlarge"], tmp_path, monkeypatch, capsys)
    assert "2,470 img/s (catalog, A100" in out and "e+" not in out  # ordinary figures as they were
