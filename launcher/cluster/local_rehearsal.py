"""The local cluster on rehearsal nodes: `launch local up` / `down` / `replace` when nodes are machines.

Each node is a network namespace on a bridge made for the cluster, booted from the root the image recipe built
(launcher/cluster/rehearsal.py). The launcher reaches the nodes as it reaches EC2 instances: by private address on
port 22, host keys pinned from what each node printed at boot (its console), the nodes' own key pair, ssh_config and
known_hosts installed on them by the code that installs them on AWS (awsrun.install_node_access), runs on shared
storage at the stack's mount point, and the run's record fetched back over SSH.

What `up` makes is recorded (cluster.json's ``rehearsal``, and each node's unshare.pid as it boots) before it is
made, so `down` removes exactly that, after a crash too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import json
import os
import shutil
import subprocess
from pathlib import Path

from ami import paths
from launcher import render
from launcher.cluster import Cluster, Node, RehearsalInfo, cluster_dir, save
from launcher.cluster import rehearsal as rh
from launcher.cluster import rehearsal_nodes as nodes_
from launcher.cluster.local import _keygen, _write_atomic, cpus_per_node, node_names
from launcher.errors import LaunchError
from launcher.plans import rehearsal as plan

RECORD = "rehearsal.json"  # written before anything is made: what `down` removes


def _record(d: Path, *, bridge: str | None = None, node: plan.NodeNet | None = None) -> None:
    """Add what was just made to the record (made first: a name that was already taken, by another cluster, say,
    is never recorded, so never removed)."""
    rec = leftovers(d) or {"bridge": None, "nodes": {}}
    if bridge:
        rec["bridge"] = bridge
    if node:
        rec["nodes"][node.name] = {"netns": node.netns, "veth": node.veth}
    _write_atomic(d / RECORD, json.dumps(rec, indent=1))


def leftovers(d: Path) -> dict:
    try:
        return json.loads((d / RECORD).read_text())
    except (OSError, ValueError):
        return {}


def running_nodes(cluster: Cluster) -> list[str]:
    d = cluster_dir(cluster.name)
    assert cluster.rehearsal is not None
    return [n for n, pid in cluster.processes.items() if nodes_.is_ours(pid, cluster.rehearsal.netns.get(n, ""))
            and (d / "nodes" / n).is_dir()]


def _pid(node_dir: Path) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int((node_dir / "unshare.pid").read_text())
    return None


def remove(d: Path) -> int:
    """Stop every node recorded in ``d`` and remove its namespace, its veth, the bridge and the state. Returns how
    many nodes were running."""
    rec = leftovers(d)
    running = 0
    for name, made in rec.get("nodes", {}).items():
        pid = _pid(d / "nodes" / name)
        if pid is not None and nodes_.is_ours(pid, made["netns"]):
            running += 1
            nodes_.stop(pid)
        nodes_.remove_node_net(made["netns"], made["veth"])
    if rec.get("bridge"):
        nodes_.remove_network(rec["bridge"])
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)
    return running


def _boot_node(d: Path, netw: plan.Network, name: str, layers: rh.Layers, shared: Path, user_pub: str,
               address: str | None = None) -> nodes_.Booted:
    node_dir = d / "nodes" / name
    if node_dir.exists():
        subprocess.run(["rm", "-rf", "--one-file-system", str(node_dir)], check=False)
    node_dir.mkdir(parents=True)
    net = netw.node(name)
    if address:
        net = dataclasses.replace(net, address=address)
    if nodes_.netns_exists(net.netns):
        raise LaunchError(f"network namespace {net.netns} already exists and is not this cluster's; remove it "
                          f"with `ip netns del {net.netns}` or give the cluster another --name")
    try:
        nodes_.make_node_net(netw, net)
    finally:  # whatever part of it was made (the namespace before the veth) is ours to remove
        if nodes_.netns_exists(net.netns):
            _record(d, node=net)
    return nodes_.boot(name, net.netns, net.address, layers, node_dir, shared, user_pub)


def _access_files(c: Cluster, keys: dict[str, list[str]]) -> None:
    """The launcher's ssh_config and known_hosts (each node's printed host keys, pinned), then the nodes' own."""
    from launcher.cluster.aws import access
    from launcher.cluster.aws import api as aws

    d = Path(c.ssh_config).parent
    _write_atomic(Path(c.ssh_config), render.ssh_config(c.name, [(n.name, n.address, n.port) for n in c.nodes],
                                                        user=c.user, identity_file=str(d / "id_ed25519"),
                                                        known_hosts=c.known_hosts))
    _write_atomic(Path(c.known_hosts), access.known_hosts_aws([([n.address], keys[n.name]) for n in c.nodes]))
    aws.write_node_access_files(c, keys)


def _install_access(c: Cluster) -> None:
    from launcher.execute import awsrun

    awsrun.install_node_access(c)


def up(nodes: int, reducers: int, name: str, subnet: str | None = None) -> Cluster:
    rh.check_host()
    if subnet is not None:
        plan.parse_subnet(subnet)
    roles = node_names(nodes, reducers)
    layers = rh.ensure_root()
    d = cluster_dir(name)
    netw = plan.network(str(d.resolve()), [n for n, _ in roles], subnet or plan.free_subnet(nodes_.host_routes()))
    d.mkdir(parents=True, mode=0o700)
    try:
        user = getpass.getuser()
        # Both public keys go on every node as it boots, as SSM installs them on EC2 (aws.install_keys): the
        # launcher's, and the nodes' own, which mpirun on node0 uses to start the others.
        user_pub = _keygen(d / "id_ed25519", f"scaletrain-{name}") + _keygen(d / "node_ed25519",
                                                                            f"scaletrain-nodes-{name}")
        shared = d / "shared"
        shared.mkdir(mode=0o755)
        (shared / "scaletrain").mkdir(mode=0o1777)
        nodes_.make_network(netw)
        _record(d, bridge=netw.bridge)
        cpus = cpus_per_node(os.cpu_count() or 1, len(roles))
        booted = {}
        for node, _ in roles:
            booted[node] = _boot_node(d, netw, node, layers, shared, user_pub)
        info = RehearsalInfo(bridge=netw.bridge, subnet=netw.subnet, gateway=netw.gateway,
                             netns={n.name: n.netns for n in netw.nodes}, veth={n.name: n.veth for n in netw.nodes},
                             shared_host=str(shared), shared_mount=plan.SHARED_MOUNT, layers=layers.lowerdirs())
        c = Cluster(name=name, backend="local", user=user,
                    nodes=[Node(name=n, address=netw.node(n).address, port=22, role=role, slots=1, cpus=cpus,
                                workdir=plan.NODE_WORKDIR) for n, role in roles],
                    ssh_config=str(d / "ssh_config"), known_hosts=str(d / "known_hosts"),
                    python=paths.PYTHON, mpirun=paths.MPIRUN, mpi_prefix=paths.MPI_PREFIX,
                    mpi_interface=plan.NODE_INTERFACE, processes={n: b.pid for n, b in booted.items()},
                    rehearsal=info, node_ssh_config=f"{plan.NODE_STATE}/ssh_config")
        _access_files(c, {n: b.host_keys for n, b in booted.items()})
        save(c)
        _install_access(c)
    except BaseException:
        remove(d)
        raise
    return c


def down(cluster: Cluster) -> int:
    return remove(cluster_dir(cluster.name))


def replace(cluster: Cluster, names: list[str]) -> tuple[Cluster, dict[str, list[str]]]:
    """Boot dead nodes afresh from the image (new disk, new host keys pinned, the old ones gone), as an Auto
    Scaling group replaces an instance; every node gets the new known_hosts. Returns the new host keys."""
    assert cluster.rehearsal is not None
    d = cluster_dir(cluster.name)
    rh.check_host()
    layers = rh.recorded_layers(cluster.rehearsal.layers)
    info = cluster.rehearsal
    net = plan.parse_subnet(info.subnet)
    netw = plan.Network(info.bridge, info.subnet, info.gateway, net.prefixlen,
                        [plan.NodeNet(n.name, info.netns[n.name], info.veth[n.name], n.address) for n in cluster.nodes])
    keys: dict[str, list[str]] = {n.name: [] for n in cluster.nodes}
    for line in Path(cluster.known_hosts).read_text().splitlines():
        parts = line.split()
        for n in cluster.nodes:
            if len(parts) >= 3 and n.address in parts[0].split(",") and n.name not in names:
                keys[n.name].append(f"{parts[1]} {parts[2]}")
    user_pub = (d / "id_ed25519.pub").read_text() + (d / "node_ed25519.pub").read_text()
    pids = dict(cluster.processes)
    taken = set(cluster.rehearsal.addresses_used) | {n.address for n in cluster.nodes}
    addresses = {n.name: n.address for n in cluster.nodes}
    for name in names:
        net = netw.node(name)
        nodes_.remove_node_net(net.netns, net.veth)
        addresses[name] = plan.replacement_address(cluster.rehearsal.subnet, taken)
        taken.add(addresses[name])
        b = _boot_node(d, netw, name, layers, Path(cluster.rehearsal.shared_host), user_pub, addresses[name])
        keys[name], pids[name] = b.host_keys, b.pid
    new = cluster.model_copy(update={
        "processes": pids,
        "nodes": [n.model_copy(update={"address": addresses[n.name]}) for n in cluster.nodes],
        "rehearsal": cluster.rehearsal.model_copy(update={"addresses_used": sorted(taken)})})
    _access_files(new, keys)
    save(new)
    _install_access(new)
    return new, {n: keys[n] for n in names}


def shared_host_path(cluster: Cluster, node_path: str) -> Path | None:
    """Where a path under the nodes' shared mount is on this machine (tests and `make demo` read results there)."""
    assert cluster.rehearsal is not None
    mount = cluster.rehearsal.shared_mount
    if node_path == mount or node_path.startswith(mount + "/"):
        return Path(cluster.rehearsal.shared_host) / node_path[len(mount):].lstrip("/")
    return None


def clean(d: Path) -> None:
    """Remove what a crashed `up` left in ``d`` (nothing if there is no record)."""
    if (d / RECORD).exists():
        remove(d)
    elif d.exists():
        shutil.rmtree(d, ignore_errors=True)
