"""launch plan's checkpoint section (launcher/plans/checkpointing.py): the work an interruption loses and Young's
interval, against golden values at each boundary."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from launcher.plans import checkpointing as ck

RESNET50 = 25_557_032 * 8  # fp32 weights + SGD momentum, the cost model's checkpoint_bytes
GP3 = 125 * 2**20


def test_on_demand_is_not_interrupted_by_aws_and_loses_half_an_epoch():
    a = ck.advice(RESNET50, GP3, epoch_s=600.0, step_s=0.5, market="on-demand", nodes=8)
    assert a.write_s == pytest.approx(1.5598, abs=1e-4) and a.lost_s == 300.0
    assert (a.mtbi_s, a.young_s, a.every_steps, a.young_lost_s) == (None, None, None, None)
    assert ck.lines(a, "on-demand", 8)[1] == "on-demand: AWS does not interrupt On-Demand instances; once an epoch " \
                                            "is enough"


def test_spot_rate_is_the_buckets_upper_edge_per_instance_per_730_hour_month_times_the_nodes():
    a = ck.advice(RESNET50, GP3, epoch_s=1e9, step_s=1.0, market="spot", nodes=8, bucket="<5%")
    assert a.mtbi_s == pytest.approx(730 * 3600 / (0.05 * 8))  # 1,825 h
    assert ck.advice(RESNET50, GP3, 1e9, 1.0, "spot", 1, ">20%").mtbi_s == pytest.approx(730 * 3600 / 0.2)
    assert ck.advice(RESNET50, GP3, 1e9, 1.0, "spot", 1, "15-20%").mtbi_s == pytest.approx(730 * 3600 / 0.2)
    assert ck.advice(RESNET50, GP3, 1e9, 1.0, "spot", 1, "5-10%").mtbi_s == pytest.approx(730 * 3600 / 0.1)


def test_youngs_interval_golden():
    # C = 1 s, M = 730 h / (0.05 x 2) = 26,280,000 s: sqrt(2 C M) = 7,249.8 s; steps of 2 s: 3,624 of them.
    a = ck.advice(GP3, GP3, epoch_s=10_000.0, step_s=2.0, market="spot", nodes=2)
    assert a.write_s == 1.0 and a.young_s == pytest.approx(math.sqrt(2 * 26_280_000), rel=1e-12)
    assert a.every_steps == 3624 and a.young_lost_s == 3624.0 and a.lost_s == 5000.0
    assert ck.lines(a, "spot", 2)[2] == ("Young's interval sqrt(2 x 1.0 s x 7,300.0 h) = 2.0 h: launch train "
                                         "--checkpoint-every 3,624 (an interruption then loses 60.4 min on average)")


def test_no_mid_epoch_interval_when_an_epoch_is_as_short_as_youngs_and_one_step_at_least():
    young = math.sqrt(2 * 26_280_000)
    assert ck.advice(GP3, GP3, young, 2.0, "spot", 2).every_steps is None          # equal: the epoch's own
    assert ck.advice(GP3, GP3, young * 1.001, 2.0, "spot", 2).every_steps == 3624  # just longer: mid-epoch
    assert ck.advice(GP3, GP3, 1e9, 1e6, "spot", 2).every_steps == 1               # a step longer than Young's
    assert "once an epoch is as often as that" in ck.lines(ck.advice(GP3, GP3, young, 2.0, "spot", 2), "spot", 2)[2]


def test_unknown_bucket_is_refused_in_one_line():
    assert ck.bucket_problem("<5%") is None
    assert ck.bucket_problem("7%") == ("unknown interruption frequency '7%'; choose one of the Spot Instance "
                                       "Advisor's: <5%, 5-10%, 10-15%, 15-20%, >20%")
    with pytest.raises(ValueError, match="7%"):
        ck.advice(GP3, GP3, 1.0, 1.0, "spot", 1, "7%")


def test_plan_prints_the_section_and_refuses_a_bad_bucket(tmp_path):
    def plan(*extra):
        return subprocess.run([sys.executable, "-m", "launcher", "plan", "--instance-type", "p4d.24xlarge", "--nodes",
                               "2", *extra], capture_output=True, text=True, timeout=120,
                              env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"})
    ok = plan()
    assert ok.returncode == 0, ok.stderr
    assert "on-demand: AWS does not interrupt On-Demand instances; once an epoch is enough" in ok.stdout
    bad = plan("--spot-interruption", "7%")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "7%" in bad.stderr
