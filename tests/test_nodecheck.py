"""The node check's decision (launcher/plans/nodecheck.py): which node of a ring of pairs falls short, at the floor's
boundary on both sides; what a node of each kind is expected to reach; the node's kind from its health check."""

from __future__ import annotations

import subprocess

import pytest

from launcher.doctor.checks import BUSBW_FLOOR_FRACTION
from launcher.plans import nodecheck, slurm
from launcher.plans.nodecheck import Expectation, Pair

HOSTS = ["node0", "node1", "node2"]
LOCAL = nodecheck.expectation("local", None)
FLOOR = LOCAL.floor_bps


def pair(s: str, r: str, bps: float) -> Pair:
    return Pair(s, r, int(bps), 8.0)   # bytes such that 8 x bytes / 8 s = bps


def ring_with(slow: str | None, slow_bps: float, fast_bps: float = 4e9) -> list[Pair]:
    return [pair(s, r, slow_bps if slow in (s, r) else fast_bps) for s, r in nodecheck.ring(HOSTS)]


def test_the_ring_pairs_each_node_with_the_next_and_the_last_with_the_first():
    assert nodecheck.ring(HOSTS) == [("node0", "node1"), ("node1", "node2"), ("node2", "node0")]
    assert nodecheck.ring(["a"]) == []


def test_the_floor_is_the_doctors_fraction_of_the_expected_figure():
    assert FLOOR == BUSBW_FLOOR_FRACTION * nodecheck.LOCAL_EXPECTED_BPS


def test_a_node_just_below_the_floor_is_refused_with_its_figure_and_the_expected_one():
    v = nodecheck.decide(HOSTS, ring_with("node2", FLOOR - 8), LOCAL)
    assert [s.node for s in v.short] == ["node2"]
    assert v.short[0].measured_bps == pytest.approx(FLOOR - 8)
    assert "node check: node2 refused: measured 500.0 Mbit/s, expected 1.00 Gbit/s (at least 500.0 Mbit/s)" \
        in v.lines
    reason = v.short[0].reason()
    assert reason.startswith(nodecheck.REASON_PREFIX) and "500.0 Mbit/s" in reason and "1.00 Gbit/s" in reason
    assert len(reason) <= slurm.REASON_LIMIT


def test_a_node_at_the_floor_passes():
    v = nodecheck.decide(HOSTS, ring_with("node2", FLOOR), LOCAL)
    assert v.short == [] and v.lines[-1].startswith("node check: every node at least")


def test_a_slow_nodes_neighbours_pass_on_their_other_pair():
    v = nodecheck.decide(HOSTS, ring_with("node1", 5e6), LOCAL)
    assert [s.node for s in v.short] == ["node1"]


def test_a_pair_that_reported_nothing_counts_as_zero():
    pairs = [p for p in ring_with(None, 0) if p.sender != "node2"]   # node2's task said nothing
    pairs = [p for p in pairs if p.receiver != "node2"]             # nor did its receiver
    v = nodecheck.decide(HOSTS, pairs, LOCAL)
    assert [s.node for s in v.short] == ["node2"] and "node check: node2 -> node0: no figure" in v.lines


def test_every_node_short_drains_none():
    v = nodecheck.decide(HOSTS, ring_with(None, 0, fast_bps=1e6), LOCAL)
    assert v.short == [] and "not one node's fault" in v.lines[-1]


def test_two_nodes_name_neither():
    v = nodecheck.decide(["a", "b"], [pair("a", "b", 1e6), pair("b", "a", 1e6)], LOCAL)
    assert v.short == [] and "cannot say which" in v.lines[-1]
    assert not nodecheck.decide(["a", "b"], [pair("a", "b", 4e9), pair("b", "a", 4e9)], LOCAL).lines[-1].endswith(
        "drained")


def test_aws_expects_one_flows_limit_or_the_line_rate_when_lower():
    p4d = nodecheck.expectation("aws", 400, "p4d.24xlarge")
    assert p4d.expected_bps == nodecheck.SINGLE_FLOW_BPS and "p4d.24xlarge" in p4d.what
    small = nodecheck.expectation("aws", 2.5, "x.large")
    assert small.expected_bps == 2.5e9
    assert nodecheck.expectation("aws", None) is None and nodecheck.expectation(None, None) is None


def test_the_nodes_kind_from_its_health_check_script():
    script = ("#!/bin/bash\n# Rendered by launcher/plans/slurm.py (health_check_script).\n"
              "exec /opt/scaletrain/venv/bin/python -m launcher.doctor.health --backend aws --python /p "
              "--mpirun /m --instance-type p4d.24xlarge --storage fsx\n")
    assert nodecheck.node_kind(script) == ("aws", "p4d.24xlarge")
    assert nodecheck.node_kind("exec python -m launcher.doctor.health --backend local\n") == ("local", None)
    assert nodecheck.node_kind("exec 'unterminated\n") == (None, None)


def test_pair_figure_in_bits_per_second():
    assert Pair("a", "b", 1_000_000, 2.0).bps == 4e6 and Pair("a", "b", 5, 0).bps == 0.0
    assert Expectation(1e9, "x").floor_bps == BUSBW_FLOOR_FRACTION * 1e9


# --- GPU nodes: all_reduce_perf across each node's own GPUs ---------------------------------------------------------

def one_node_output(busbw: float, wrong: int = 0) -> str:
    """all_reduce_perf -b 512M -e 512M -g 8 on one node, as nccl-tests prints it (one process, eight GPUs)."""
    algbw = busbw / (2 * 7 / 8)
    return "\n".join([
        "# nThread 1 nGpus 8 minBytes 536870912 maxBytes 536870912 step: 1048576(bytes) warmup iters: 5 iters: 20 "
        "agg iters: 1 validation: 1 graph: 0",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   "
        "busbw #wrong",
        f"   536870912     134217728     float     sum      -1   2310.5  {algbw:6.2f}  {busbw:6.2f}      0   2305.1  "
        f"{algbw:6.2f}  {busbw:6.2f}      0",
        f"# Out of bounds values : {wrong} {'OK' if not wrong else 'FAILED'}",
        f"# Avg bus bandwidth    : {busbw:.4f}", "#", ""])


P4D = nodecheck.gpu_expectation("p4d.24xlarge", 8, 600.0)


def test_gpu_nodes_expect_one_direction_of_their_nvlink_and_pcie_or_one_gpu_is_not_judged():
    from infra import catalog

    assert (P4D.expected_gbs, P4D.floor_gbs, P4D.gpus) == (300.0, 300.0 * BUSBW_FLOOR_FRACTION, 8)

    def of(name):
        t = catalog.get(name)
        return nodecheck.gpu_expectation(name, t.gpus, t.gpu_interconnect_gbps)
    assert of("p3.16xlarge").expected_gbs == 150.0 and of("p5.48xlarge").expected_gbs == 450.0
    assert of("p3.2xlarge") is None            # one GPU: nothing to reduce
    assert of("g5.48xlarge") is None           # PCIe: the host's topology decides, the catalog does not say
    assert nodecheck.gpu_expectation("x", 8, nodecheck.NVLINK_MIN_GBPS - 1) is None
    assert nodecheck.gpu_expectation("x", 8, nodecheck.NVLINK_MIN_GBPS) is not None


def test_a_gpu_node_runs_one_all_reduce_perf_over_all_its_gpus():
    argv = nodecheck.gpu_command("/opt/nccl-tests/build/all_reduce_perf", 8)
    assert argv == ["/opt/nccl-tests/build/all_reduce_perf", "-b", "536870912", "-e", "536870912", "-g", "8",
                    "-n", "20", "-w", "5", "-c", "1"]


def test_a_gpu_nodes_figure_is_its_largest_messages_bus_bandwidth_and_wrong_values_give_none():
    assert nodecheck.gpu_figure(0, one_node_output(231.5)) == (231.5, "")
    busbw, why = nodecheck.gpu_figure(0, one_node_output(231.5, wrong=3))
    assert busbw is None and why == "3 wrong values in its results"
    busbw, why = nodecheck.gpu_figure(1, "NCCL failure common.cu:1007 'unhandled cuda error'\n")
    assert busbw is None and why == "all_reduce_perf exit 1: NCCL failure common.cu:1007 'unhandled cuda error'"


def test_a_gpu_node_just_below_the_floor_is_refused_and_one_at_it_passes():
    floor = P4D.floor_gbs
    v = nodecheck.decide_gpus(["a", "b", "c"], {"a": (floor, ""), "b": (floor - 0.1, ""), "c": (231.0, "")}, P4D)
    assert [s.node for s in v.short] == ["b"]
    assert v.short[0].reason() == (f"{nodecheck.REASON_PREFIX}all_reduce_perf across its 8 GPUs {floor - 0.1:.1f} "
                                   f"GB/s, below {floor:.0f} GB/s ({BUSBW_FLOOR_FRACTION:g} of p4d.24xlarge's 300 "
                                   "GB/s NVLink)")
    assert "node check: b refused: all_reduce_perf across its 8 GPUs" in "\n".join(v.lines)


def test_a_gpu_node_whose_test_failed_is_refused_with_why_and_one_that_said_nothing_is_not():
    v = nodecheck.decide_gpus(["a", "b", "c"], {"a": (None, "all_reduce_perf exit 1: boom"), "b": (231.0, "")}, P4D)
    assert [s.node for s in v.short] == ["a"] and "no figure (all_reduce_perf exit 1: boom)" in v.short[0].reason()
    assert "node check: c: all_reduce_perf across its GPUs said nothing" in v.lines


def test_every_gpu_node_short_drains_none():
    v = nodecheck.decide_gpus(["a", "b"], {"a": (20.0, ""), "b": (None, "exit 1")}, P4D)
    assert v.short == [] and "not one node's fault; none is drained" in v.lines[-1]


def test_one_gpu_nodes_task_runs_all_reduce_perf_and_says_its_figure(tmp_path, monkeypatch, capsys):
    """launcher/execute/nodecheck.measure_gpus, the task srun starts on each node, with an all_reduce_perf that
    prints what nccl-tests prints and checks the arguments it was given."""
    import json

    from ami import paths
    from launcher.execute import nodecheck as run

    (tmp_path / "all_reduce_perf").write_text(
        "#!/bin/sh\n"
        '[ "$*" = "-b 536870912 -e 536870912 -g 4 -n 20 -w 5 -c 1" ] || { echo "bad args: $*"; exit 3; }\n'
        f"cat <<'EOF'\n{one_node_output(140.25)}EOF\n")
    (tmp_path / "all_reduce_perf").chmod(0o755)
    monkeypatch.setattr(paths, "NCCL_TESTS", str(tmp_path))
    monkeypatch.setenv("SLURMD_NODENAME", "queue-dy-p4d-1")
    assert run.measure_gpus(4) == 0
    assert json.loads(capsys.readouterr().out) == {"node": "queue-dy-p4d-1", "busbw": 140.25, "why": ""}
    (tmp_path / "all_reduce_perf").unlink()
    assert run.measure_gpus(4) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["busbw"] is None and "FileNotFoundError" in said["why"]


def test_the_jobs_step_drains_a_short_gpu_node_once_even_when_the_ring_names_it_too(monkeypatch):
    from launcher.execute import nodecheck as run

    drained = []
    monkeypatch.setattr(run, "gpus_expected_here", lambda: P4D)
    monkeypatch.setattr(run, "measure_gpu_nodes", lambda hosts, gpus, job: {"a": (231.0, ""), "b": (12.0, ""),
                                                                             "c": (229.0, "")})
    expected = Expectation(5e9, "one TCP flow")
    monkeypatch.setattr(run, "expected_here", lambda: expected)
    monkeypatch.setattr(run, "measure_ring", lambda hosts, addresses, job: [
        Pair("a", "b", 1, 1.0), Pair("b", "c", 1, 1.0), Pair("c", "a", 2**30, 1.0)])
    monkeypatch.setattr(run.subprocess, "run", lambda argv, **kw: drained.append(argv))
    said = []
    short = run.refuse_short(["a", "b", "c"], {}, "7", said.append)
    assert [s.node for s in short] == ["b"] and isinstance(short[0], nodecheck.GpuShort)
    assert len(drained) == 1 and drained[0][:3] == ["scontrol", "update", "NodeName=b"]
    assert any(ln.startswith("node check: b: all_reduce_perf across its 8 GPUs 12.0 GB/s") for ln in said)


MPI_STAND_IN = r'''
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
/* all_reduce_perf as nccl-tests builds it with MPI=1: MPI_Init first, then its table (from $TABLE). */
int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    FILE *f = fopen(getenv("TABLE"), "r");
    int c;
    while (f && (c = fgetc(f)) != EOF) putchar(c);
    MPI_Finalize();
    return 0;
}
'''


@pytest.mark.timeout(120)
def test_a_gpu_nodes_mpi_built_test_initialises_inside_an_srun_task(tmp_path, monkeypatch, capsys):
    """The task srun starts on a node runs all_reduce_perf as its child, with the step's SLURM_ variables, and this
    machine's real Open MPI takes such a process for one srun launched directly and fails MPI_Init without PMI
    (issue 47 item 4: the check measured nothing on any node). An MPI program standing in for all_reduce_perf,
    built with this machine's mpicc, must initialise and print its table."""
    import json
    import shutil

    from ami import paths
    from launcher.execute import nodecheck as run

    if shutil.which("mpicc") is None:
        pytest.skip("no mpicc (Debian's libopenmpi-dev)")
    (tmp_path / "stand_in.c").write_text(MPI_STAND_IN)
    subprocess.run(["mpicc", str(tmp_path / "stand_in.c"), "-o", str(tmp_path / "all_reduce_perf")], check=True,
                   capture_output=True)
    (tmp_path / "table").write_text(one_node_output(140.25))
    monkeypatch.setattr(paths, "NCCL_TESTS", str(tmp_path))
    # What srun gives each task of `srun --overlap --jobid=J -N2 -n2` (srun(1), OUTPUT ENVIRONMENT VARIABLES).
    for name, value in {"SLURM_JOB_ID": "7", "SLURM_JOBID": "7", "SLURM_STEP_ID": "3", "SLURM_STEPID": "3",
                        "SLURM_NODELIST": "node[0-1]", "SLURM_PROCID": "0", "SLURM_NTASKS": "2",
                        "SLURMD_NODENAME": "node0", "TABLE": str(tmp_path / "table")}.items():
        monkeypatch.setenv(name, value)
    assert run.measure_gpus(8) == 0
    assert json.loads(capsys.readouterr().out) == {"node": "node0", "busbw": 140.25, "why": ""}


def test_a_gpu_check_that_measured_no_node_says_so_and_drains_none():
    v = nodecheck.decide_gpus(["a", "b"], {"a": (None, "all_reduce_perf exit 1: MPI_Init"),
                                           "b": (None, "all_reduce_perf exit 1: MPI_Init")}, P4D)
    assert v.short == []
    assert v.lines[-1] == ("node check: the GPU check could not measure on any node (all_reduce_perf exit 1: "
                           "MPI_Init): nothing measured, none is drained")
    # The other side: one node measured, the one that did not is refused as before.
    v = nodecheck.decide_gpus(["a", "b"], {"a": (None, "exit 1"), "b": (231.0, "")}, P4D)
    assert [s.node for s in v.short] == ["a"]
