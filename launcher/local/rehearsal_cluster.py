"""The local cluster on rehearsal nodes: `launch local up` / `down` / `replace` when nodes are machines.

Each node is a network namespace on a bridge made for the cluster, booted from the root the image recipe built
(launcher/local/rehearsal_root.py). The launcher reaches the nodes as it reaches EC2 instances: by private address on
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
from launcher.cluster import Cluster, Node, RehearsalInfo, cluster_dir, load, save
from launcher.errors import LaunchError
from launcher.files import keygen, write_atomic
from launcher.local import keeper
from launcher.local import rehearsal_nodes as nodes_
from launcher.local import rehearsal_root as rh
from launcher.local.backend import cpus_per_node, node_names
from launcher.plans import rehearsal as plan
from launcher.plans import slurm

HEAD = "head"                   # the head node's name (and host name) on a local cluster with Slurm
MUNGE_KEY = "munge.key"         # the cluster's munge key on this machine, as the stack's secret on AWS

RECORD = "rehearsal.json"  # written before anything is made: what `down` removes


def _record(d: Path, *, bridge: str | None = None, node: plan.NodeNet | None = None,
            keeper: int | None = None) -> None:
    """Add what was just made to the record (made first: a name that was already taken, by another cluster, say,
    is never recorded, so never removed)."""
    rec = leftovers(d) or {"bridge": None, "nodes": {}}
    if bridge:
        rec["bridge"] = bridge
    if node:
        rec["nodes"][node.name] = {"netns": node.netns, "veth": node.veth}
    if keeper:
        rec["keeper"] = keeper
    write_atomic(d / RECORD, json.dumps(rec, indent=1))


def _start_keeper(d: Path, name: str) -> None:
    """Start the cluster's keeper (launcher/local/keeper.py) on this machine, detached from the launcher: it
    replaces a lost node as an Auto Scaling group would, with no launcher running."""
    import sys

    with open(d / keeper.LOG, "ab") as log:
        proc = subprocess.Popen([sys.executable, "-m", "launcher.local.keeper", name], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "SCALETRAIN_HOME": str(d.parent.parent.resolve())})
    _record(d, keeper=proc.pid)


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
    from concurrent.futures import ThreadPoolExecutor

    rec = leftovers(d)
    if rec.get("keeper") and rec["keeper"] != os.getpid():  # first: it would replace the nodes this stops
        keeper.stop(rec["keeper"])

    def one(name: str, made: dict) -> bool:
        pid = _pid(d / "nodes" / name)
        was_running = pid is not None and nodes_.is_ours(pid, made["netns"])
        if was_running:
            nodes_.stop(pid)
        nodes_.remove_node_net(made["netns"], made["veth"])
        return was_running

    # Every node at once, as instances terminate: one after another, 64 nodes took 129 s to come down.
    nodes = rec.get("nodes", {})
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(nodes)))) as pool:
        running = sum(pool.map(lambda item: one(*item), nodes.items()))
    if rec.get("bridge"):
        nodes_.remove_network(rec["bridge"])
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)
    return running


def _slurm_side(d: Path, head_address: str, *, role: str, cpus: int, address: str,
                conf: str | None = None) -> tuple[dict[str, tuple[bytes, int]], tuple[str, ...]]:
    """What a node of a cluster with Slurm gets from the cluster's side before it boots (the munge key; the head
    node also its slurm.conf) and the daemons it starts: the controller, or slurmd registering itself."""
    files = {slurm.MUNGE_KEY: ((d / MUNGE_KEY).read_bytes(), 0o400)}
    if role == "head":
        assert conf is not None
        files[slurm.CONF_PATH] = (conf.encode(), 0o644)
        # --teardown's epilog: the keeper takes the cluster down on this marker, as the TTL guard does on AWS.
        marker = f"{plan.SHARED_MOUNT}/{slurm.TEARDOWN_MARKER}"
        files[slurm.EPILOG_PATH] = (slurm.epilog_script(action=[f"date -u +%s > {marker}"]).encode(), 0o755)
        return files, tuple(slurm.controller_commands())
    health = slurm.health_check_argv(python=paths.PYTHON, backend="local", mpirun=paths.MPIRUN,
                                     shared_mount=plan.SHARED_MOUNT)
    return files, tuple(slurm.worker_commands(controller_addr=head_address, role=role, cpus=cpus, address=address,
                                              health_check=health))


def _boot_node(d: Path, netw: plan.Network, name: str, layers: rh.Layers, shared: Path, user_pub: str,
               address: str | None = None, *, slurm_role: tuple[str, str, int] | None = None,
               conf: str | None = None) -> nodes_.Booted:
    """``slurm_role``: (head node's address, this node's role, its cpus) on a cluster with Slurm."""
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
    files, services = {}, ()
    if slurm_role is not None:
        head_address, role, cpus = slurm_role
        files, services = _slurm_side(d, head_address, role=role, cpus=cpus, address=net.address, conf=conf)
    return nodes_.boot(name, net.netns, net.address, layers, node_dir, shared, user_pub, files=files,
                       services=services)


def _access_files(c: Cluster, keys: dict[str, list[str]]) -> None:
    """The launcher's ssh_config and known_hosts (each node's printed host keys, pinned), then the nodes' own."""
    from launcher.cluster.aws import access
    from launcher.cluster.aws import api as aws

    d = Path(c.ssh_config).parent
    every = [*c.nodes, *([c.head] if c.head else [])]
    write_atomic(Path(c.ssh_config), render.ssh_config(c.name, [(n.name, n.address, n.port) for n in every],
                                                        user=c.user, identity_file=str(d / "id_ed25519"),
                                                        known_hosts=c.known_hosts))
    write_atomic(Path(c.known_hosts), access.known_hosts_aws([([n.address], keys[n.name]) for n in every]))
    aws.write_node_access_files(c, keys)


def _install_access(c: Cluster) -> None:
    from launcher.execute import awsrun

    awsrun.install_node_access(c)


def up(nodes: int, reducers: int, name: str, subnet: str | None = None, *, with_slurm: bool = False) -> Cluster:
    """``with_slurm``: a head node running Slurm's controller besides the nodes, each node running slurmd, and the
    keeper (launcher/local/keeper.py) replacing a lost node by itself, as an Auto Scaling group does."""
    rh.check_host()
    if subnet is not None:
        plan.parse_subnet(subnet)
    roles = node_names(nodes, reducers)
    layers = rh.ensure_root()
    d = cluster_dir(name)
    netw = plan.network(str(d.resolve()), [n for n, _ in roles] + ([HEAD] if with_slurm else []),
                        subnet or plan.free_subnet(nodes_.host_routes()))
    d.mkdir(parents=True, mode=0o700)
    try:
        user = getpass.getuser()
        # Both public keys go on every node as it boots, as SSM installs them on EC2 (aws.install_keys): the
        # launcher's, and the nodes' own, which mpirun on node0 uses to start the others.
        user_pub = keygen(d / "id_ed25519", f"scaletrain-{name}") + keygen(d / "node_ed25519",
                                                                            f"scaletrain-nodes-{name}")
        shared = d / "shared"
        shared.mkdir(mode=0o755)
        (shared / "scaletrain").mkdir()
        (shared / "scaletrain").chmod(0o1777)  # mkdir's mode is masked by the umask: every user of the nodes writes
        nodes_.make_network(netw)
        _record(d, bridge=netw.bridge)
        cpus = cpus_per_node(os.cpu_count() or 1, len(roles))
        booted = {}
        head = None
        if with_slurm:  # the controller first: each slurmd registers with it as it starts
            head_addr = netw.node(HEAD).address
            fd = os.open(d / MUNGE_KEY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            os.write(fd, os.urandom(1024))  # munged wants at least 32 bytes (mungekey(8)); 1024 is its default
            os.close(fd)
            conf = slurm.slurm_conf(slurm.SlurmCluster(name=name, controller=HEAD, controller_addr=head_addr,
                                                       max_nodes=2 * len(roles), epilog_ctld=slurm.EPILOG_PATH,
                                                       health_check=slurm.HEALTH_CHECK,
                                                       health_check_interval_s=slurm.HEALTH_CHECK_INTERVAL_S))
            booted[HEAD] = _boot_node(d, netw, HEAD, layers, shared, user_pub, slurm_role=(head_addr, "head", 1),
                                      conf=conf)
            head = Node(name=HEAD, address=head_addr, port=22, role="head", slots=0, cpus=1,
                        workdir=plan.NODE_WORKDIR)
        for node, role in roles:
            booted[node] = _boot_node(d, netw, node, layers, shared, user_pub,
                                      slurm_role=(head.address, role, cpus) if head else None)
        info = RehearsalInfo(bridge=netw.bridge, subnet=netw.subnet, gateway=netw.gateway,
                             netns={n.name: n.netns for n in netw.nodes}, veth={n.name: n.veth for n in netw.nodes},
                             shared_host=str(shared), shared_mount=plan.SHARED_MOUNT, layers=layers.lowerdirs())
        c = Cluster(name=name, backend="local", user=user,
                    nodes=[Node(name=n, address=netw.node(n).address, port=22, role=role, slots=1, cpus=cpus,
                                workdir=plan.NODE_WORKDIR) for n, role in roles],
                    ssh_config=str(d / "ssh_config"), known_hosts=str(d / "known_hosts"),
                    python=paths.PYTHON, mpirun=paths.MPIRUN, mpi_prefix=paths.MPI_PREFIX,
                    mpi_interface=plan.NODE_INTERFACE, processes={n: b.pid for n, b in booted.items()},
                    rehearsal=info, node_ssh_config=f"{plan.NODE_STATE}/ssh_config", head=head)
        _access_files(c, {n: b.host_keys for n, b in booted.items()})
        save(c)
        _install_access(c)
        if head:
            _start_keeper(d, name)
    except BaseException:
        remove(d)
        raise
    return c


def down(cluster: Cluster) -> int:
    return remove(cluster_dir(cluster.name))


def replace(cluster: Cluster, names: list[str]) -> tuple[Cluster, dict[str, list[str]]]:
    """Boot dead nodes afresh from the image (new disk, new host keys pinned, the old ones gone), as an Auto
    Scaling group replaces an instance; every node gets the new known_hosts. Returns the new host keys. One
    replacement at a time: the keeper and a launcher may both see a node die; the second finds it replaced."""
    import fcntl

    d = cluster_dir(cluster.name)
    with open(d / ".replace.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        fresh = load(cluster.name)
        running = set(running_nodes(fresh))
        todo = [n for n in names if n not in running or fresh.node(n).address == cluster.node(n).address]
        return _replace(fresh, todo) if todo else (fresh, {})


def _replace(cluster: Cluster, names: list[str]) -> tuple[Cluster, dict[str, list[str]]]:
    assert cluster.rehearsal is not None
    d = cluster_dir(cluster.name)
    rh.check_host()
    layers = rh.recorded_layers(cluster.rehearsal.layers)
    info = cluster.rehearsal
    net = plan.parse_subnet(info.subnet)
    netw = plan.Network(info.bridge, info.subnet, info.gateway, net.prefixlen,
                        [plan.NodeNet(n.name, info.netns[n.name], info.veth[n.name], n.address) for n in cluster.nodes])
    every = [*cluster.nodes, *([cluster.head] if cluster.head else [])]
    keys: dict[str, list[str]] = {n.name: [] for n in every}
    for line in Path(cluster.known_hosts).read_text().splitlines():
        parts = line.split()
        for n in every:
            if len(parts) >= 3 and n.address in parts[0].split(",") and n.name not in names:
                keys[n.name].append(f"{parts[1]} {parts[2]}")
    user_pub = (d / "id_ed25519.pub").read_text() + (d / "node_ed25519.pub").read_text()
    pids = dict(cluster.processes)
    taken = set(cluster.rehearsal.addresses_used) | {n.address for n in every}  # the head node's too
    addresses = {n.name: n.address for n in cluster.nodes}
    for name in names:
        net = netw.node(name)
        nodes_.remove_node_net(net.netns, net.veth)
        addresses[name] = plan.replacement_address(cluster.rehearsal.subnet, taken)
        taken.add(addresses[name])
        node = cluster.node(name)
        b = _boot_node(d, netw, name, layers, Path(cluster.rehearsal.shared_host), user_pub, addresses[name],
                       slurm_role=(cluster.head.address, node.role, node.cpus) if cluster.head else None)
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
