"""Rehearsal nodes for real: `launch local up` makes two machines (namespaces on a bridge, roots built by the image
recipe), the launcher reaches them as EC2 instances, trains across them, and `down` leaves nothing.

Each check here is one a real node makes fail when the launcher relies on its own machine: the nodes do not see
the checkout or the launcher's Python, find mpirun only where the image puts it, and share only /fsx.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterutil import assert_one_line_error, cluster_state, launch, tiny_shards

from launcher.plans import bootlog
from launcher.plans import rehearsal as plan

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(os.geteuid() != 0, reason="rehearsal nodes need root (namespaces, mounts)")]
REPO = Path(__file__).resolve().parents[1]


def netns_list() -> list[str]:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()


def links() -> str:
    return subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    home = tmp_path_factory.mktemp("rehearsal") / "home"
    proc = launch(home, "local", "up", "--no-slurm", "--nodes", "2", timeout=3600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    yield home
    launch(home, "local", "down")


def on_nodes(home: Path, command: str) -> dict[str, str]:
    proc = launch(home, "exec", "--", command)
    assert proc.returncode == 0, proc.stderr
    out: dict[str, list[str]] = {}
    for line in proc.stdout.splitlines():
        node, _, text = line.partition("] ")
        out.setdefault(node.lstrip("["), []).append(text)
    return {k: "\n".join(v) for k, v in out.items()}


def test_each_node_is_a_machine_with_its_own_hostname_and_address(home):
    state = cluster_state(home)
    assert state["rehearsal"]["shared_mount"] == "/fsx"
    addresses = {n["name"]: n["address"] for n in state["nodes"]}
    assert len(set(addresses.values())) == 2 and all(n["port"] == 22 for n in state["nodes"])
    seen = on_nodes(home, "hostname; ip -4 -o addr show eth0 | awk '{print $4}'")
    for name, address in addresses.items():
        assert seen[name].splitlines() == [name, f"{address}/24"]
    assert state["rehearsal"]["subnet"].startswith("10.213.")
    # each node made its own host keys at boot (none shared from the image), and those are what is pinned
    pinned: dict[str, set[str]] = {}
    for line in Path(state["known_hosts"]).read_text().splitlines():
        host, kind, key = line.split()[:3]
        pinned.setdefault(host, set()).add(f"{kind} {key}")
    assert set(pinned) == set(addresses.values())
    assert not pinned[addresses["node0"]] & pinned[addresses["node1"]]
    own = on_nodes(home, "cat /etc/ssh/ssh_host_ed25519_key.pub | cut -d' ' -f1,2")
    for name, address in addresses.items():
        assert own[name] in pinned[address]


def test_a_node_sees_neither_the_checkout_nor_the_launchers_python(home):
    seen = on_nodes(home, f"test -e {REPO}/pyproject.toml && echo checkout; test -e {sys.executable} && echo python;"
                          f" test -e {home} && echo state; echo checked")
    assert set(seen.values()) == {"checked"}


def test_mpirun_is_only_where_the_image_puts_it_and_the_image_has_its_tools(home):
    seen = on_nodes(home, "command -v mpirun || echo no-mpirun-on-path; "
                          "/opt/amazon/openmpi/bin/mpirun --version | head -1; "
                          "/usr/local/bin/aws --version 2>&1 | cut -d' ' -f1 | cut -d/ -f1; "
                          "/opt/scaletrain/venv/bin/python -c 'import training.train, horovod.torch, simplejpeg; "
                          "print(\"trainer imports\")'")
    for text in seen.values():
        lines = text.splitlines()
        assert lines[0] == "no-mpirun-on-path"
        assert lines[1].startswith("mpirun (Open MPI)")
        assert lines[2] == "aws-cli"
        assert lines[3] == "trainer imports"


def test_only_the_shared_mount_is_common_to_the_nodes(home):
    launch(home, "exec", "--", 'echo "$(hostname)" > /root/mine; echo "$(hostname)" > /fsx/scaletrain/$(hostname)',
           check=True)
    seen = on_nodes(home, "cat /root/mine; ls /fsx/scaletrain | sort | tr '\\n' ' '")
    assert seen["node0"].splitlines()[0] == "node0" and seen["node1"].splitlines()[0] == "node1"
    assert all("node0 node1" in text for text in seen.values())
    shared = Path(cluster_state(home)["rehearsal"]["shared_host"])
    assert (shared / "scaletrain" / "node1").read_text() == "node1\n"


def test_train_runs_across_the_nodes_and_its_record_comes_back(home):
    proc = launch(home, "train", "--nodes", "2", "--epochs", "1", "--model", "resnet18", "--image-size", "32",
                  "--batch-per-gpu", "16", "--warmup-epochs", "0", "--workers", "1", "--output",
                  "/fsx/scaletrain/runs/t1", timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "/opt/amazon/openmpi/bin/mpirun --prefix /opt/amazon/openmpi" in proc.stdout
    fetched = home / "runs" / "local" / "t1"
    summary = json.loads((fetched / "summary.json").read_text())
    assert summary["ranks"] == 2 if "ranks" in summary else summary
    shared = Path(cluster_state(home)["rehearsal"]["shared_host"])
    assert (shared / "scaletrain" / "runs" / "t1" / "metrics.jsonl").is_file()


def test_data_the_launcher_made_locally_and_did_not_ship_fails_the_run(home, tmp_path):
    shards = tiny_shards(home, tmp_path)
    proc = launch(home, "train", "--nodes", "2", "--epochs", "1", "--data", str(shards), timeout=300)
    assert_one_line_error(proc, f"no manifest.json in {shards} on node0")


def test_a_subnet_in_use_is_refused_and_nothing_is_left_behind(home):
    before_ns, before_links = netns_list(), links()
    used = cluster_state(home)["rehearsal"]["subnet"]
    proc = launch(home, "local", "up", "--nodes", "1", "--name", "other", "--subnet", used, timeout=600)
    assert_one_line_error(proc, f"--subnet {used} overlaps {used}", "choose a free private subnet")
    assert netns_list() == before_ns and links().count("\n") == before_links.count("\n")
    assert not (home / "clusters" / "other").exists()


def test_launch_ssh_runs_on_the_named_node_and_refuses_unknown_ones(home):
    proc = launch(home, "ssh", "node1", "--", "echo", "on", "$(hostname)", "at", "$(hostname -I)", timeout=60)
    assert proc.returncode == 0, proc.stderr
    address = cluster_state(home)["nodes"][1]["address"]
    assert proc.stdout.split() == ["on", "node1", "at", address]  # each rehearsal node has its own hostname
    # The remote command's exit status comes back as launch's own.
    assert launch(home, "ssh", "node0", "--", "exit", "7", timeout=60).returncode == 7
    assert_one_line_error(launch(home, "ssh", "node9", "--", "true", timeout=60), "node9")


def _banner(address: str, timeout_s: float) -> bytes:
    """What the node's sshd says first, within timeout_s: a node that runs answers at once; a frozen one never."""
    import socket

    with socket.create_connection((address, 22), timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        try:
            return sock.recv(64)
        except TimeoutError:
            return b""


def test_fault_drills_throttle_shape_and_freeze_one_node_and_clear_undoes_them(home):
    from launcher.local import faults
    from launcher.plans import faultdrill

    state = cluster_state(home)
    netns, veth = state["rehearsal"]["netns"]["node1"], state["rehearsal"]["veth"]["node1"]
    node1 = next(n for n in state["nodes"] if n["name"] == "node1")
    cg = faults._cpu_cgroup(netns)
    assert cg is not None and not cg.exists()

    proc = launch(home, "local", "fault", "node1", "--cpu", "0.3")
    assert proc.returncode == 0 and "node1's CPU throttled to 30% of its vCPUs" in proc.stdout, proc.stderr
    quota, period = faultdrill.cpu_bandwidth(0.3, node1["cpus"])
    assert (int((cg / "cpu.cfs_quota_us").read_text()), int((cg / "cpu.cfs_period_us").read_text())) == (quota, period)
    members = {int(p) for p in (cg / "cgroup.procs").read_text().split()}
    assert set(faults.node_pids(netns)) <= members  # every process of node1 ...
    assert not members & set(faults.node_pids(state["rehearsal"]["netns"]["node0"]))  # ... and none of node0's
    # A process node1 starts after the drill (here over SSH) is held to the quota too: it runs into the throttle.
    launch(home, "ssh", "node1", "--", "timeout 1 sh -c 'while :; do :; done'; true", timeout=120, check=True)
    stat = dict(line.split() for line in (cg / "cpu.stat").read_text().splitlines())
    assert int(stat["nr_throttled"]) > 0

    proc = launch(home, "local", "fault", "node1", "--net", "5mbit")
    assert proc.returncode == 0 and "shaped to 5mbit each way" in proc.stdout, proc.stderr
    host_end = subprocess.run(["tc", "qdisc", "show", "dev", veth], capture_output=True, text=True).stdout
    node_end = subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "show", "dev", "eth0"],
                              capture_output=True, text=True).stdout
    assert "tbf" in host_end and "rate 5Mbit" in host_end, host_end
    assert "tbf" in node_end and "rate 5Mbit" in node_end, node_end

    assert _banner(node1["address"], 5).startswith(b"SSH-")
    proc = launch(home, "local", "fault", "node1", "--freeze")
    assert proc.returncode == 0 and "frozen" in proc.stdout, proc.stderr
    from launcher.local import rehearsal_nodes

    assert "frozen 1" in (rehearsal_nodes.node_cgroup(netns) / "cgroup.events").read_text().splitlines()
    assert _banner(node1["address"], 3) == b""  # a hung instance: the kernel takes the connection, sshd says nothing
    node0 = next(n for n in state["nodes"] if n["name"] == "node0")
    assert _banner(node0["address"], 5).startswith(b"SSH-")  # the other node runs on

    proc = launch(home, "local", "fault", "node1", "--clear")
    assert proc.returncode == 0 and "node1's faults cleared (cpu, freeze, net)" in proc.stdout, proc.stderr
    assert not cg.exists() and not cg.parent.exists()
    assert "tbf" not in subprocess.run(["tc", "qdisc", "show", "dev", veth], capture_output=True, text=True).stdout
    assert _banner(node1["address"], 5).startswith(b"SSH-")
    assert launch(home, "ssh", "node1", "--", "true", timeout=120).returncode == 0
    proc = launch(home, "local", "fault", "node1", "--clear")
    assert proc.returncode == 0 and "(none was in force)" in proc.stdout


@pytest.mark.parametrize(("args", "said"), [
    (("node1", "--cpu", "0"), "--cpu is the share of its vCPUs the node keeps, above 0 and below 1"),
    (("node1", "--cpu", "1"), "above 0 and below 1 (0.3: 30%), got 1"),
    (("node1", "--cpu", "2"), "got 2"),
    (("node1", "--cpu", "nan"), "got nan"),
    (("node1", "--net", "5mbps"), "--net takes a rate such as 5mbit"),
    (("node1", "--net", "7999bit"), "--net must be between 8kbit and 100gbit"),
    (("node1",), "exactly one of --cpu FRACTION, --net RATE, --freeze or --clear"),
    (("node1", "--freeze", "--cpu", "0.5"), "got --cpu and --freeze"),
    (("node7", "--freeze"), "no node 'node7' in this cluster; its nodes that train are node0, node1"),
])  # fmt: skip
def test_a_bad_fault_drill_is_one_line_and_changes_nothing(home, args, said):
    from launcher.local import faults

    proc = launch(home, "local", "fault", *args)
    assert proc.returncode == 2
    assert_one_line_error(proc, said)
    assert faults._cpu_cgroup(cluster_state(home)["rehearsal"]["netns"]["node1"]).exists() is False


def test_a_killed_node_is_its_namespace_going_away_and_replace_boots_it_from_the_image(home):
    launch(home, "exec", "--", "touch /root/mine", check=True)
    state = cluster_state(home)
    pid = state["processes"]["node1"]
    inside = subprocess.run(["ip", "netns", "pids", state["rehearsal"]["netns"]["node1"]], capture_output=True,
                            text=True).stdout.split()
    assert inside  # sshd and the node's init
    proc = launch(home, "local", "kill", "node1")
    assert proc.returncode == 0 and "node1 of cluster 'local' killed" in proc.stdout, proc.stderr
    assert not Path(f"/proc/{pid}").exists()
    assert_one_line_error(launch(home, "local", "kill", "node1"), "node1 of cluster 'local' is not running",
                          "launch local replace node1")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in inside):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{p}").exists() for p in inside)
    assert_one_line_error(launch(home, "exec", "--", "true"), "node1")
    old_keys = Path(state["known_hosts"]).read_text()
    proc = launch(home, "local", "replace", "node1", timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert Path(state["known_hosts"]).read_text() != old_keys
    after = cluster_state(home)
    # a new instance, a new address: the old one is neither pinned nor used
    old_address = next(n["address"] for n in state["nodes"] if n["name"] == "node1")
    new_address = next(n["address"] for n in after["nodes"] if n["name"] == "node1")
    assert new_address != old_address and old_address not in Path(state["known_hosts"]).read_text()
    seen = on_nodes(home, "test -e /root/mine && echo kept || echo fresh")
    assert seen == {"node0": "kept", "node1": "fresh"}
    # mpirun on node0 reaches the new node1 with the nodes' known_hosts, rewritten on every node
    out = launch(home, "exec", "--", "ssh -F /root/.scaletrain/cluster/ssh_config node1 hostname")
    assert out.returncode == 0 and "[node0] node1" in out.stdout, out.stderr


def test_down_removes_namespaces_bridge_and_processes(tmp_path):
    home = tmp_path / "home"
    launch(home, "local", "up", "--no-slurm", "--nodes", "1", "--name", "gone", check=True, timeout=3600)
    state = cluster_state(home, "gone")
    netns, bridge = state["rehearsal"]["netns"]["node0"], state["rehearsal"]["bridge"]
    pid = state["processes"]["node0"]
    assert netns in netns_list() and bridge in links()
    # A drill in force is undone with the node: a frozen node still stops, and its CPU quota's cgroup goes.
    from launcher.local import faults

    for drill in (("--cpu", "0.5"), ("--freeze",)):
        launch(home, "local", "fault", "node0", *drill, "--cluster", "gone", check=True)
    proc = launch(home, "local", "down", "--cluster", "gone")
    assert proc.returncode == 0 and "1 node(s) were running" in proc.stdout
    assert netns not in netns_list() and f" {bridge}:" not in links() and not Path(f"/proc/{pid}").exists()
    assert not (home / "clusters" / "gone").exists()
    assert not faults._cpu_cgroup(netns).exists()


def test_the_plan_names_the_stacks_mount_point():
    from infra.layout import FSX_MOUNT_POINT

    assert plan.SHARED_MOUNT == FSX_MOUNT_POINT


def test_a_node_whose_user_data_fails_is_one_line_and_up_keeps_only_its_logs(tmp_path, monkeypatch):
    """A user data that fails as the stack's fails where /fsx does not mount (set -e, mount's exit 32): cloud-init's
    own status says error, `up` names the node, the output's last lines and that status in one line, removes the
    cluster whole, and keeps the node's console and cloud-init output where the line says (it named a file it had
    just removed before)."""
    from launcher.errors import LaunchError
    from launcher.local import rehearsal_cluster as rc

    home = tmp_path / "home"
    monkeypatch.setenv("SCALETRAIN_HOME", str(home))
    monkeypatch.setattr(rc, "_user_data", lambda *a, **k: "#!/bin/bash\nset -e\necho 'mount: /fsx: mount failed'"
                        " >&2\nexit 32\n")
    before_ns, before_links = netns_list(), links()
    with pytest.raises(LaunchError) as raised:
        rc.up(1, 0, "baduser")
    said = str(raised.value)
    kept = home / bootlog.FAILED_DIR / "baduser"
    output = kept / "nodes/node0/upper/var/log/cloud-init-output.log"
    assert "\n" not in said and said.startswith("node0's user data failed: "), said
    assert "mount: /fsx: mount failed" in said and "cloud-init status: error" in said and "scripts-user" in said, said
    assert f"output: {output}" in said and said.endswith(f"(logs kept in {kept})"), said
    assert "mount: /fsx: mount failed" in output.read_text()
    assert "-----BEGIN SSH HOST KEY KEYS-----" in (kept / "nodes/node0/console.log").read_text(errors="replace")
    assert (kept / "services.log").is_file()
    assert not (home / "clusters" / "baduser").exists()
    assert netns_list() == before_ns and links().count("\n") == before_links.count("\n")
