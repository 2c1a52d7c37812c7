"""`launch doctor`: its checks over recorded tool output (good and broken p4d nodes), and for real, locally."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clusterutil import assert_one_line_error, cluster_state, launch, needs_root, up

from ami import paths
from infra import catalog
from launcher.doctor import checks as doctor
from launcher.doctor.checks import Probe

DATA = Path(__file__).parent / "data" / "doctor"
P4D = catalog.get("p4d.24xlarge")


def recorded(case: str = "p4d-good") -> dict[str, Probe]:
    """The good p4d node's probes, with those a broken case recorded in their place."""
    probes: dict[str, Probe] = {}
    for directory in ("p4d-good", case):
        for f in sorted((DATA / directory).glob("*.txt")):
            rc_file = f.with_suffix(".rc")
            probes[f.stem] = Probe(f.read_text(), int(rc_file.read_text()) if rc_file.exists() else 0)
    return probes


def by_name(checks: list[doctor.Check]) -> dict[str, doctor.Check]:
    return {c.name: c for c in checks}


def test_a_good_p4d_node_passes_every_check() -> None:
    checks = by_name(doctor.evaluate_aws(recorded(), P4D, storage="auto"))
    assert {n: c.status for n, c in checks.items()} == dict.fromkeys(
        ["gpus", "driver/cuda", "efa devices", "libfabric efa", "nccl", "horovod", "mpi", "shared storage"], "ok")
    assert checks["gpus"].detail == "8 x NVIDIA A100-SXM4-40GB (40,960 MiB)"
    assert checks["driver/cuda"].detail == "driver 570.172.08, CUDA 12.8 (driver supports 12.8)"
    assert checks["libfabric efa"].detail == "efa provider on 4 devices, libfabric 1.22.0amzn4.0"
    assert checks["nccl"].detail == "libnccl.so.2 and /opt/amazon/ofi-nccl/lib/libnccl-net-ofi.so"
    assert checks["shared storage"].detail == "lustre at /fsx, writable"


@pytest.mark.parametrize(("case", "check", "reason"), [
    ("gpu-missing", "gpus", "7 GPU(s) visible, p4d.24xlarge has 8 x A100-40GB"),
    ("driver-wrong-kernel", "driver/cuda", "no nvidia kernel module for kernel 6.8.0-1031-aws"),
    ("efa-2-of-4", "efa devices", "2 of 4 EFA devices"),
    ("efa-2-of-4", "libfabric efa", "the efa provider serves 2 of 4 devices"),
    ("horovod-without-nccl", "horovod", "Horovod 0.28.1 built without NCCL"),
    ("storage-not-mounted", "shared storage", "not mounted: no lustre at /fsx or beegfs at /beegfs"),
    ("storage-read-only", "shared storage", "lustre at /fsx is mounted but not writable"),
])  # fmt: skip
def test_a_broken_node_fails_exactly_that_check(case: str, check: str, reason: str) -> None:
    checks = doctor.on_node(doctor.evaluate_aws(recorded(case), P4D, storage="auto"), "node3")
    failed = {c.name: c for c in checks if c.failed}
    assert check in failed and reason in failed[check].detail, failed
    expected_failures = {"efa-2-of-4": 2, "driver-wrong-kernel": 2}.get(case, 1)  # gpus too
    assert len(failed) == expected_failures, failed
    line = doctor.verdict(checks)
    assert line is not None and line.startswith("1 node(s) not ready: node3 ") and reason in line


def test_cuda_newer_than_the_driver_supports() -> None:
    probes = recorded()
    probes["nvidia-smi-header"] = Probe(probes["nvidia-smi-header"].output.replace("CUDA Version: 12.8",
                                                                                   "CUDA Version: 12.4"), 0)
    check = doctor.check_driver(*(probes[k] for k in ("nvidia-smi", "nvidia-smi-header", "nvcc", "kernel", "image")))
    assert check.failed and "CUDA 12.8 is newer than driver 570.172.08 supports (CUDA 12.4)" in check.detail


def test_a_driver_other_than_the_image_pinned() -> None:
    probes = recorded()
    probes["nvidia-smi"] = Probe(probes["nvidia-smi"].output.replace("570.172.08", "570.86.15"), 0)
    check = doctor.check_driver(*(probes[k] for k in ("nvidia-smi", "nvidia-smi-header", "nvcc", "kernel", "image")))
    assert check.failed and "the image pinned 570.172.08" in check.detail


def test_wrong_gpu_model_and_types_without_efa() -> None:
    a10g = doctor.check_gpus(recorded()["nvidia-smi"], catalog.get("g5.48xlarge"))
    assert a10g.failed and "8 GPU(s) are not A10G: NVIDIA A100-SXM4-40GB" in a10g.detail
    wrong = doctor.check_gpus(recorded()["nvidia-smi"], catalog.get("p4de.24xlarge"))  # A100 80GB expected
    assert wrong.failed and "8 GPU(s) are not A100-80GB" in wrong.detail
    p3 = catalog.get("p3.16xlarge")
    assert doctor.check_efa_devices(Probe("", 2), p3).status == "skip"
    assert doctor.check_nccl(recorded()["ldconfig"], Probe("", 2), p3).status == "ok"
    assert doctor.check_nccl(recorded()["ldconfig"], Probe("", 2), P4D).failed
    assert doctor.check_nccl(Probe("", 1), recorded()["ofi-nccl"], P4D).detail.startswith("libnccl.so.2 is not")


def test_clock_skew_beyond_the_uncertainty_fails() -> None:
    assert doctor.check_clock("1795234386.164740472\n", 1795234386.10, 1795234386.20).status == "ok"
    skewed = doctor.check_clock("1795234389.912345678\n", 1795234386.10, 1795234386.20)
    assert skewed.failed and skewed.detail.startswith("+3.76 s from the launcher's clock")
    # A slow round trip widens the window: 0.7 s off with +/- 0.5 s known is within the 0.5 s limit.
    assert doctor.check_clock("1795234387.2", 1795234386.0, 1795234387.0).status == "ok"
    assert doctor.check_clock("Thu Nov 21", 0, 1).failed


def test_bus_bandwidth_against_the_network() -> None:
    good = doctor.check_bus_bandwidth(0, (DATA / "all_reduce_perf-p4d-2nodes-efa.txt").read_text(), P4D, 2)
    assert good.status == "ok", good.detail
    assert good.detail == ("bus bandwidth 45.0 GB/s at 2,048 MiB on 2 nodes; p4d.24xlarge's network allows "
                           "50.0 GB/s")
    low = doctor.check_bus_bandwidth(0, (DATA / "all_reduce_perf-p4d-2nodes-sockets.txt").read_text(), P4D, 2)
    assert low.failed and "bus bandwidth 4.0 GB/s" in low.detail and "is NCCL using EFA (aws-ofi-nccl)?" in low.detail
    wrong = doctor.check_bus_bandwidth(0, (DATA / "all_reduce_perf-wrong-values.txt").read_text(), P4D, 2)
    assert wrong.failed and "16 wrong values" in wrong.detail
    crashed = doctor.check_bus_bandwidth(1, "mpirun noticed that process rank 3 exited on signal 11", P4D, 2)
    assert crashed.failed and "signal 11" in crashed.detail
    assert doctor.parse_bus_bandwidth((DATA / "all_reduce_perf-p4d-2nodes-efa.txt").read_text()) == 27.4218


def test_horovod_check_build_is_parsed_from_its_real_format() -> None:
    build = doctor.parse_check_build((DATA / "p4d-good" / "horovod-build.txt").read_text())
    assert build["Available Controllers"] == {"MPI": True, "Gloo": True}
    assert build["Available Tensor Operations"]["NCCL"] is True and build["Available Frameworks"]["MXNet"] is False
    cpu = (DATA / "horovod-without-nccl" / "horovod-build.txt").read_text()
    assert doctor.check_horovod_build(Probe(cpu, 0), need_nccl=False).status == "ok"


def test_probe_output_round_trips_through_the_markers() -> None:
    import subprocess

    script = doctor._probe("one", "printf 'a\\nb\\n'") + "; " + doctor._probe("two", "echo oops >&2; exit 3")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True).stdout
    assert doctor.parse_probes(out) == {"one": Probe("a\nb\n", 0), "two": Probe("oops\n", 3)}
    script = doctor.probe_script("aws", paths.PYTHON, paths.MPIRUN)
    assert "findmnt -J -t lustre,beegfs" in script
    assert "/opt/scaletrain/venv/bin/horovodrun --check-build" in script


def test_probes_name_the_images_tools_by_absolute_path() -> None:
    # The launcher's SSH command is a non-login shell: PATH has none of the image's directories (ami/paths.py).
    script = doctor.probe_script("aws", paths.PYTHON, paths.MPIRUN)
    assert script.startswith(paths.path_export())
    assert f"{paths.MPIRUN} --version" in script and f"{paths.FI_INFO} -p efa -t FI_EP_RDM" in script
    assert f"{paths.FI_INFO} --version" in script and "/sbin/ldconfig -p" in script
    bare = [cmd for cmd in ("mpirun --version", "fi_info -p", "fi_info --version")
            if f"( {cmd}" in script]
    assert bare == [], bare
    local = doctor.probe_script("local", "/venv/bin/python", "/usr/bin/mpirun")
    assert "( /usr/bin/mpirun --version )" in local and "export PATH" not in local


def test_a_node_whose_group_is_on_tcp_needs_no_efa() -> None:
    # -c efa=false, or a reducer beside P4d/P5: the stack gave it no EFA interface; it shows no device.
    probes = recorded() | {"infiniband": Probe("", 0), "fi_info": Probe("No data available\n", 61),
                           "ofi-nccl": Probe("ls: cannot access\n", 2)}
    checks = by_name(doctor.evaluate_aws(probes, P4D, storage="auto", efa_devices=0))
    assert [checks[n].status for n in ("efa devices", "libfabric efa", "nccl")] == ["skip", "skip", "ok"]
    assert "on TCP" in checks["efa devices"].detail
    # The same node in a group that has EFA fails: 0 of 4 devices.
    assert by_name(doctor.evaluate_aws(probes, P4D, storage="auto", efa_devices=4))["efa devices"].failed


def test_a_rehearsal_nodes_shared_storage_must_be_a_writable_mount(tmp_path) -> None:
    import subprocess

    def probed(mount: str) -> doctor.Check:
        script = doctor.probe_script("local", "/venv/bin/python", "/usr/bin/mpirun", shared_mount=mount)
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True).stdout
        return doctor.check_shared_mount(doctor.parse_probes(out)["shared-mount"], mount)

    # A directory is not a mount: a node whose /fsx was never mounted writes to its own disk, which no node shares.
    assert probed(str(tmp_path)) == doctor.fail("shared storage", f"nothing mounted at {tmp_path}")
    assert doctor.check_shared_mount(doctor.Probe("/fsx\ntouch: cannot touch '/fsx/.d': Read-only file system\n", 1),
                                     "/fsx").detail == "/fsx is not writable: touch: cannot touch '/fsx/.d': " \
                                                       "Read-only file system"
    assert "shared-mount" not in doctor.probe_script("local", "/venv/bin/python", "/usr/bin/mpirun")
    local = by_name(doctor.evaluate_local({}, "/venv/bin/python"))
    assert local["shared storage"].status == "skip"  # loopback nodes share this machine's file system
    checks = by_name(doctor.evaluate_local({"shared-mount": doctor.Probe("/fsx\nwritable /fsx\n", 0)},
                                           "/venv/bin/python", shared_mount="/fsx"))
    assert checks["shared storage"] == doctor.ok("shared storage", "/fsx mounted, writable")


def test_bad_storage_choice() -> None:
    with pytest.raises(ValueError, match="--storage must be one of auto, fsx, beegfs, none"):
        doctor.check_storage(Probe("", 0), Probe("", 0), "nfs")


# --- For real, on a 2-node rehearsal cluster (each node its own machine, sharing only /fsx) ---------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    home = tmp_path_factory.mktemp("doctor") / "home"
    up(home, "--nodes", "2")
    yield home
    launch(home, "local", "down")


@pytest.mark.cluster
@needs_root
def test_doctor_on_the_local_cluster(cluster) -> None:
    proc = launch(cluster, "doctor")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("│")]
    cells = [[c.strip() for c in ln.strip("│").split("│")] for ln in rows]
    status = {(c[0], c[1]): c[2] for c in cells if len(c) == 4 and c[0]}
    for node in ("node0", "node1"):
        for check in ("mpi", "horovod", "workdir", "clock", "shared storage"):
            assert status[(node, check)] == "ok", proc.stdout
        for check in ("gpus", "driver/cuda", "efa devices", "libfabric efa", "nccl"):
            assert status[(node, check)] == "skip", proc.stdout
    assert status[("all nodes", "mpirun across nodes")] == "ok"
    # mpirun from the image's prefix on node0 started a rank on each node, which named itself
    assert "2 ranks, one on each of node0, node1" in proc.stdout
    assert "/fsx mounted, writable" in proc.stdout
    assert "the local cluster has no GPUs" in proc.stdout and "0 failed" in proc.stdout


@pytest.mark.cluster
@needs_root
def test_doctor_names_the_broken_node(cluster) -> None:
    state_file = cluster / "clusters" / "local" / "cluster.json"
    good = state_file.read_text()
    state = cluster_state(cluster)
    state["python"] = "/nonexistent/python3"
    state_file.write_text(json.dumps(state))
    try:
        proc = launch(cluster, "doctor", "--cluster", "local")
    finally:
        state_file.write_text(good)
    assert_one_line_error(proc, "2 node(s) not ready: node0 horovod: horovod.torch does not import with "
                                "/nonexistent/python3")
    assert "fail" in proc.stdout


@pytest.mark.cluster
@needs_root
def test_doctor_bad_storage_option(cluster) -> None:
    assert_one_line_error(launch(cluster, "doctor", "--storage", "nfs"), "--storage must be one of: auto, fsx")


# --- Which aws-ofi-nccl NCCL loaded: NCCL_DEBUG=INFO names it (issue 25, item 8) -------------------------------------

NCCL_INFO = DATA / "nccl-info"


@pytest.mark.parametrize(("case", "pinned", "status", "detail"), [
    ("efa-ofi-1.18.0-nccl-2.29.2-two-nodes.txt", "1.18.0", "ok",
     "aws-ofi-nccl 1.18.0 from /opt/aws-ofi-nccl/lib/libnccl-net.so, network Libfabric, provider efa (2 node(s))"),
    # The two-plugins failure: a copy other than the pinned one came first in the search path.
    ("efa-ofi-1.18.0-nccl-2.29.2-two-nodes.txt", "1.14.0", "fail",
     "NCCL loaded aws-ofi-nccl 1.18.0 from /opt/aws-ofi-nccl/lib/libnccl-net.so, but the image pins 1.14.0 "
     "(ami/versions.json): another plugin comes first in the library search path"),
    ("p4d-ofi-1.16.2-nccl-2.27.3.txt", "1.16.2", "ok",
     "aws-ofi-nccl 1.16.2 from libnccl-net.so, network Libfabric, provider efa (1 node(s))"),
    ("p4d-ofi-1.16.2-nccl-2.27.3.txt", None, "ok",
     "aws-ofi-nccl 1.16.2 from libnccl-net.so, network Libfabric, provider efa (1 node(s))"),
    ("p4d-ofi-1.4.0-nccl-2.9.9.txt", "1.4.0", "ok",          # the old "Using aws-ofi-nccl 1.4.0aws" form
     "aws-ofi-nccl 1.4.0aws, network AWS Libfabric, provider efa (1 node(s))"),
    ("no-plugin-sockets.txt", "1.14.0", "fail",
     "NCCL used network Socket on TUF-Node02, not EFA: NCCL found no plugin (libnccl-net.so)"),
    ("ofi-1.12.1-provider-tcp.txt", "1.12.1", "fail",
     "aws-ofi-nccl 1.12.1-aws on 6f2d8a82d208 chose libfabric's tcp provider, not efa"),
])  # fmt: skip
def test_the_plugin_nccl_loaded_is_read_from_real_info_lines(case, pinned, status, detail) -> None:
    from launcher.doctor.ncclnet import check_nccl_net

    check = check_nccl_net((NCCL_INFO / case).read_text(), P4D, pinned=pinned)
    assert (check.status, check.detail) == (status, detail)


def test_ranks_that_loaded_different_plugins_fail_and_no_info_lines_fail() -> None:
    from launcher.doctor.ncclnet import check_nccl_net

    two = (NCCL_INFO / "efa-ofi-1.18.0-nccl-2.29.2-two-nodes.txt").read_text()
    mixed = two.replace("gpu-st-ml-1:78499:78499 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.18.0",
                        "gpu-st-ml-1:78499:78499 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.14.0")
    check = check_nccl_net(mixed, P4D, pinned="1.14.0")
    assert (check.status, check.detail) == (
        "fail", "ranks loaded different aws-ofi-nccl plugins: 1.14.0 on gpu-st-ml-1; 1.18.0 on gpu-st-ml-2")
    bare = (DATA / "all_reduce_perf-p4d-2nodes-efa.txt").read_text()
    assert check_nccl_net(bare, P4D, pinned="1.14.0").status == "fail"
    assert check_nccl_net(bare, catalog.get("p3.16xlarge"), pinned="1.14.0").status == "skip"
    assert check_nccl_net(bare, P4D, pinned="1.14.0", efa_devices=0).status == "skip"


def test_launch_doctor_asks_nccl_which_plugin_it_loaded_and_checks_the_images_pin(monkeypatch) -> None:
    """The allreduce runs with NCCL_DEBUG=INFO (INIT, NET), and the verdict compares the plugin NCCL named with the
    image's scaletrain:aws-ofi-nccl tag (ami/versions.json)."""
    from test_aws_plans import cluster as aws_cluster

    from ami.render import load_versions
    from launcher.doctor import runner
    from launcher.execute import remote

    c = aws_cluster("p4d.24xlarge")
    argv = runner.nccl_test_argv(c, c.workers, P4D, "/tmp/hostfile")
    assert argv[argv.index("NCCL_DEBUG=INFO") - 1:argv.index("NCCL_DEBUG=INFO") + 1] == ["-x", "NCCL_DEBUG=INFO"]
    assert "NCCL_DEBUG_SUBSYS=INIT,NET" in argv
    pinned = load_versions().aws_ofi_nccl
    assert c.aws.software["aws-ofi-nccl"] == pinned
    info = (NCCL_INFO / "p4d-ofi-1.16.2-nccl-2.27.3.txt").read_text()
    perf = (DATA / "all_reduce_perf-p4d-2nodes-efa.txt").read_text()

    def run_all(cluster, nodes, command):
        return [remote.NodeResult(n.name, 0, "", "") for n in nodes]

    monkeypatch.setattr(remote, "run_all", run_all)
    monkeypatch.setattr(remote, "check", lambda cluster, node, command, **kw: (0, info + perf))
    (plugin,) = [ch for ch in runner.diagnose(c, storage="none") if ch.name == "nccl plugin"]
    assert plugin.status == "fail" and plugin.node == "all nodes"
    assert plugin.detail.startswith(f"NCCL loaded aws-ofi-nccl 1.16.2 from libnccl-net.so, but the image pins {pinned}")
