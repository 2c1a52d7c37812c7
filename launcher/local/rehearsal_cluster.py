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
import threading
from pathlib import Path

from ami import paths
from infra import policies
from launcher import render
from launcher.cluster import Cluster, Node, RehearsalInfo, cluster_dir, load, save, state_root
from launcher.errors import LaunchError
from launcher.files import keygen, write_atomic
from launcher.local import faults, keeper
from launcher.local import rehearsal_account as account_
from launcher.local import rehearsal_nodes as nodes_
from launcher.local import rehearsal_root as rh
from launcher.local import rehearsal_services as services_
from launcher.local.backend import cpus_per_node, node_names
from launcher.plans import bootlog, imds, slurm
from launcher.plans import rehearsal as plan

HEAD = "head"                   # the head node's name (and host name) on a local cluster with Slurm

RECORD = "rehearsal.json"  # written before anything is made: what `down` removes
_RECORD_LOCK = threading.Lock()  # nodes boot in parallel threads


def _record(d: Path, *, bridge: str | None = None, node: plan.NodeNet | None = None,
            keeper: int | None = None, service: tuple[str, object] | None = None) -> None:
    """Add what was just made to the record (made first: a name that was already taken, by another cluster, say,
    is never recorded, so never removed)."""
    with _RECORD_LOCK:
        rec = leftovers(d) or {"bridge": None, "nodes": {}}
        if bridge:
            rec["bridge"] = bridge
        if node:
            rec["nodes"][node.name] = {"netns": node.netns, "veth": node.veth}
        if keeper:
            rec["keeper"] = keeper
        if service:
            what, value = service
            if isinstance(value, plan.NodeNet):
                value = {"netns": value.netns, "veth": value.veth}
            rec.setdefault("services", {})[what] = value
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
        faults.release(made["netns"], made["veth"])  # thawed first: a frozen node would not stop
        if was_running:
            nodes_.stop(pid)
        nodes_.remove_node_net(made["netns"], made["veth"])
        nodes_.remove_cgroup(made["netns"])
        return was_running

    # Every node at once, as instances terminate: one after another, 64 nodes took 129 s to come down.
    nodes = rec.get("nodes", {})
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(nodes)))) as pool:
        running = sum(pool.map(lambda item: one(*item), nodes.items()))
    services = rec.get("services", {})
    for what in ("imds", "account", "storage"):
        if isinstance(services.get(what), int):
            services_.stop(services[what])
    for what in ("netns", "storage_netns"):
        if isinstance(services.get(what), dict):
            nodes_.remove_node_net(services[what]["netns"], services[what]["veth"])
    if rec.get("bridge"):
        nodes_.remove_network(rec["bridge"])
    nodes_.remove_cgroup_parent()  # when no other cluster's nodes are in it
    subprocess.run(["rm", "-rf", "--one-file-system", str(d)], check=False)
    return running


def _user_data(name: str, role: str, *, head_address: str | None, secret_arn: str | None, cpus: int,
               workers: int, reducers: int, storage: str) -> str:
    """The user data the synthesized stack gives this role's launch template (infra/boot.py), CloudFormation's
    tokens resolved to this cluster's values: the head node's address, the munge key's secret ARN, the region, the
    shared storage's mount (the one named difference: sshfs from the storage host for FSx for Lustre,
    plan.storage_mount). Besides those, the node's health check's arguments differ (the local backend's checks,
    not a GPU instance type's). A cluster without Slurm runs only the storage part, the stack's first lines."""
    from infra import boot

    mount = plan.storage_mount(storage)
    if secret_arn is None:
        return boot.storage_script(storage=mount)
    if role == "head":
        return boot.head_script(cluster_name=name, region=plan.REGION, secret_id=secret_arn,
                                max_nodes=boot.max_nodes(workers=workers, reducers=reducers), storage=mount,
                                cgroup_plugin=slurm.REHEARSAL_CGROUP_PLUGIN, slurm_version=slurm.REHEARSAL_SLURM)
    assert head_address is not None
    health = slurm.health_check_argv(python=paths.PYTHON, backend="local", mpirun=paths.MPIRUN,
                                     shared_mount=plan.SHARED_MOUNT)
    return boot.node_script(region=plan.REGION, secret_id=secret_arn, controller_addr=head_address, role=role,
                            cpus=cpus, health_check=health, storage=mount, slurm_version=slurm.REHEARSAL_SLURM)


def _instance(launched: account_.Launched, acct: account_.Account, name: str, address: str, public_keys: list[str],
              user_data: str, role: str) -> imds.Instance:
    """IMDS's description of a node: what the account's RunInstances answered for it (its id, MAC and launch time),
    its instance profile's role name and that role's session in the stand-in account."""
    return imds.Instance(instance_id=launched.instance_id, instance_type=plan.INSTANCE_TYPE, local_ipv4=address,
                         hostname=name, region=plan.REGION, availability_zone=plan.ZONE, role=acct.role_names[role],
                         credentials=acct.roles[role], public_keys=tuple(public_keys), ami_id=acct.image_id,
                         mac=launched.mac, launch_time=launched.launch_time, user_data=user_data or None)


def _publish(d: Path, instances: dict[str, imds.Instance]) -> None:
    """IMDS's map of the nodes (by address), rewritten whole and atomically as nodes come and go."""
    write_atomic(d / services_.INSTANCES, imds.instances_json(list(instances.values())))


def _boot_node(d: Path, netw: plan.Network, name: str, layers: rh.Layers, storage_files: dict, instances: dict,
               *, acct: account_.Account, user_data: str, public_keys: list[str], address: str | None = None,
               timeout_s: float = 60.0) -> nodes_.Booted:
    """Make a node's network, launch its instance in the account, publish it to IMDS, put its seed on its new disk
    and boot it."""
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
    # The head's instance profile is the head role's, every other node's the node role's, as in the stack.
    role = policies.HEAD_ROLE if name == HEAD else policies.NODE_ROLE
    assert netw.services is not None
    endpoint = services_.endpoint(netw.services.address)
    try:
        launched = account_.run_instance(endpoint, acct, cluster=d.name, node=name, role=role, address=net.address,
                                         user_data=user_data)
    except Exception as e:  # botocore's errors: one line
        raise LaunchError(f"the rehearsal's account at {endpoint} did not launch {name}'s instance: "
                          f"{str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
    inst = _instance(launched, acct, name, net.address, public_keys, user_data, role)
    with _RECORD_LOCK:
        instances[net.address] = inst
        _publish(d, instances)
    files = plan.seed_files(instance_id=inst.instance_id, hostname=name, user_data=user_data,
                            public_keys=public_keys)
    files[plan.AWS_CONFIG] = (plan.aws_config(services_.endpoint(netw.services.address), plan.REGION).encode(),
                                  0o644)  # no secret in it; every user of the node reads it
    files.update(storage_files)
    return nodes_.boot(name, net.netns, net.address, layers, node_dir, timeout_s, files=files)


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
    from concurrent.futures import ThreadPoolExecutor

    rh.check_host()
    nodes_.cgroup_root()
    if subnet is not None:
        plan.parse_subnet(subnet)
    roles = node_names(nodes, reducers)
    nodes_.check_inotify(len(roles) + (1 if with_slurm else 0))
    layers = rh.ensure_root()
    d = cluster_dir(name)
    key = str(d.resolve())
    d.mkdir(parents=True, mode=0o700)
    try:
        user = getpass.getuser()
        # Both public keys go on every node as it boots, as EC2 hands the launch's key pair to cloud-init: the
        # launcher's, and the nodes' own, which mpirun on node0 uses to start the others.
        user_pub = keygen(d / "id_ed25519", f"scaletrain-{name}") + keygen(d / "node_ed25519",
                                                                            f"scaletrain-nodes-{name}")
        public_keys = [k for k in user_pub.splitlines() if k.strip()]
        shared = d / "shared"
        shared.mkdir(mode=0o755)
        (shared / "scaletrain").mkdir()
        (shared / "scaletrain").chmod(0o1777)  # mkdir's mode is masked by the umask: every user of the nodes writes
        netw = nodes_.claim_network(key, [n for n, _ in roles] + ([HEAD] if with_slurm else []), subnet)
        _record(d, bridge=netw.bridge)
        assert netw.services is not None and netw.storage is not None
        def record(what: str, value: object) -> None:
            _record(d, service=(what, value))

        services_.start(d, netw, record)
        storage_files = services_.start_storage(d, netw, shared, record)
        cpus = cpus_per_node(os.cpu_count() or 1, len(roles))
        workers = sum(1 for _, r in roles if r == "worker")
        # The account as the stack leaves it: the munge key's secret (every stack makes one), the two roles with
        # the stack's statements and a session each for IMDS, the launcher's own user; then IAM on.
        endpoint = services_.endpoint(netw.services.address)
        try:
            made_secret = _munge_secret(endpoint, name)
            acct = account_.bootstrap(endpoint, name, secret_arn=made_secret, subnet=netw.subnet)
        except Exception as e:  # botocore's and urllib's errors: one line, then the cluster comes down
            raise LaunchError(f"the rehearsal's account at {endpoint} failed while made as the stack makes it: "
                              f"{str(e).splitlines()[0] if str(e) else type(e).__name__}; log: "
                              f"{d / services_.LOG}") from None
        account_.save(d, acct)
        secret_arn = made_secret if with_slurm else None
        instances: dict[str, imds.Instance] = {}
        booted = {}
        head = None
        at_once = plan.boot_parallelism(len(roles), os.cpu_count() or 1)
        timeout = plan.boot_timeout(at_once + (1 if with_slurm else 0), os.cpu_count() or 1)
        if with_slurm:  # the controller first: each slurmd registers with it as it starts
            head_addr = netw.node(HEAD).address
            booted[HEAD] = _boot_node(d, netw, HEAD, layers, storage_files, instances, acct=acct,
                                      public_keys=public_keys,
                                      user_data=_user_data(name, "head", head_address=None, secret_arn=secret_arn,
                                                           cpus=1, workers=workers, reducers=reducers,
                                                           storage=netw.storage.address))
            head = Node(name=HEAD, address=head_addr, port=22, role="head", slots=0, cpus=1,
                        workdir=plan.NODE_WORKDIR)

        def one(item: tuple[str, str]) -> nodes_.Booted:
            node, role = item
            return _boot_node(d, netw, node, layers, storage_files, instances, acct=acct, public_keys=public_keys,
                              timeout_s=timeout,
                              user_data=_user_data(name, role, head_address=head.address if head else None,
                                                   secret_arn=secret_arn, cpus=cpus, workers=workers,
                                                   reducers=reducers, storage=netw.storage.address))

        with ThreadPoolExecutor(max_workers=at_once) as pool:
            booted.update(zip([n for n, _ in roles], pool.map(one, roles), strict=True))
        info = RehearsalInfo(bridge=netw.bridge, subnet=netw.subnet, gateway=netw.gateway,
                             netns={n.name: n.netns for n in netw.nodes}, veth={n.name: n.veth for n in netw.nodes},
                             shared_host=str(shared), shared_mount=plan.SHARED_MOUNT, layers=layers.lowerdirs(),
                             services=netw.services.address, storage=netw.storage.address,
                             secret=secret_arn or "", account_key=acct.key, account_secret=acct.secret)
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
    except BaseException as e:
        kept = _keep_logs(d, name)
        remove(d)
        if isinstance(e, LaunchError) and kept is not None:
            raise LaunchError(f"{bootlog.kept_path(str(e), str(d), str(kept))} (logs kept in {kept})") from None
        raise
    return c


def _keep_logs(d: Path, name: str) -> Path | None:
    """Copy what says why `up` failed (bootlog.KEPT_LOGS) out of the cluster's directory before it is removed, into
    FAILED_DIR/NAME (an earlier failure's there replaced); None when there was nothing to keep."""
    found = [p for pattern in bootlog.KEPT_LOGS for p in d.glob(pattern) if p.is_file()]
    if not found:
        return None
    kept = state_root() / bootlog.FAILED_DIR / name
    try:
        shutil.rmtree(kept, ignore_errors=True)
        for p in found:
            target = kept / p.relative_to(d)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(p, target)
    except OSError:
        return None  # the failure itself is what the user needs; the copy is a courtesy
    return kept


def _munge_secret(endpoint: str, name: str) -> str:
    """The cluster's munge key as the stack makes it (infra/head.py, MungeKey: a generated Secrets Manager secret of
    letters and digits), in the stand-in account; its ARN, which the user data reads it by."""
    from infra.boot import MUNGE_KEY_LENGTH

    sm = account_.client(endpoint, "secretsmanager")  # before IAM is on: any caller, as CloudFormation's own
    key = sm.get_random_password(PasswordLength=MUNGE_KEY_LENGTH, ExcludePunctuation=True)["RandomPassword"]
    return sm.create_secret(Name=f"scaletrain-{name}-munge", SecretString=key)["ARN"]


def reboot(cluster: Cluster, name: str) -> None:
    """Reboot a node as EC2 does: every process ends, the disk stays, systemd boots again; cloud-init does not run
    the user data again, and the units it enabled bring the daemons back."""
    assert cluster.rehearsal is not None
    d = cluster_dir(cluster.name)
    every = {n.name: n for n in [*cluster.nodes, *([cluster.head] if cluster.head else [])]}
    if name not in every:
        raise LaunchError(f"no node named {name} in cluster {cluster.name}; its nodes: {', '.join(every)}")
    pid = cluster.processes.get(name)
    netns = cluster.rehearsal.netns[name]
    if pid is None or not nodes_.is_ours(pid, netns):
        raise LaunchError(f"{name} is not running; `launch local replace {name}` boots a new instance in its place")
    import fcntl

    with open(d / ".replace.lock", "w") as lock:  # the keeper must not take the rebooting node for lost
        fcntl.flock(lock, fcntl.LOCK_EX)
        nodes_.shutdown(pid)
        layers = rh.recorded_layers(cluster.rehearsal.layers)
        b = nodes_.boot(name, netns, every[name].address, layers, d / "nodes" / name, first=False)
        fresh = load(cluster.name)
        save(fresh.model_copy(update={"processes": {**fresh.processes, name: b.pid}}))


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
        # A node running again under a new pid (rebooted, or replaced by the other) is not lost any more.
        todo = [n for n in names if n not in running or (fresh.node(n).address == cluster.node(n).address
                                                         and fresh.processes.get(n) == cluster.processes.get(n))]
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
    public_keys = [k for k in ((d / "id_ed25519.pub").read_text() + (d / "node_ed25519.pub").read_text()).splitlines()
                   if k.strip()]
    pids = dict(cluster.processes)
    taken = set(cluster.rehearsal.addresses_used) | {n.address for n in every}  # the head node's too
    addresses = {n.name: n.address for n in cluster.nodes}
    instances = imds.load_instances((d / services_.INSTANCES).read_text())
    netw = dataclasses.replace(netw, services=plan.services_net(str(d.resolve()), info.subnet))
    workers = sum(1 for n in cluster.nodes if n.role == "worker")
    acct = account_.load(d)
    assert acct is not None and netw.services is not None
    for name in names:
        net = netw.node(name)
        faults.release(net.netns, net.veth)
        nodes_.remove_node_net(net.netns, net.veth)
        nodes_.remove_cgroup(net.netns)
        with _RECORD_LOCK:
            gone = {instances.pop(net.address, None), instances.pop(cluster.node(name).address, None)} - {None}
        for old in gone:  # as the Auto Scaling group terminates the instance it replaces
            with contextlib.suppress(Exception):  # the account's own errors: the node is replaced all the same
                account_.terminate(services_.endpoint(netw.services.address), acct, old.instance_id)
        addresses[name] = plan.replacement_address(cluster.rehearsal.subnet, taken)
        taken.add(addresses[name])
        node = cluster.node(name)
        user_data = _user_data(cluster.name, node.role, head_address=cluster.head.address if cluster.head else None,
                               secret_arn=info.secret or None, cpus=node.cpus, workers=workers,
                               reducers=len(cluster.nodes) - workers, storage=info.storage)
        b = _boot_node(d, netw, name, layers, services_.storage_files(d, info.storage), instances, acct=acct,
                       user_data=user_data, public_keys=public_keys, address=addresses[name])
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
