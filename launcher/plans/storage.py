"""Shared storage set-up as pure plans: BeeGFS on RAM disks, or the FSx for Lustre mount.

A plan is a list of phases; each phase maps node names to one shell script run as root (via sudo). Phases run
in order, the nodes of a phase in parallel. Golden-tested per family (tests/golden/storage-*.txt).

BeeGFS (https://doc.beegfs.io/latest/quick_start_guide/quick_start_guide.html, BeeGFS 7.4 as on the image):
management and metadata on node0 (the StorageMount output's ``worker:0``), one tmpfs storage target on every
worker, clients on every node mounted at the same path. Connection authentication (required since 7.3) uses one
shared secret the launcher makes per cluster. The metadata service keeps its attributes in file contents
(``storeUseExtendedAttribs = false``): tmpfs has no user.* extended attributes before Linux 6.6.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError

__all__ = ["Phase", "beegfs_plan", "boot_mount_commands", "fstab_line", "fsx_plan", "render_plan", "resolve_roles",
           "restarts_problem", "storage_plan"]

BEEGFS_SBIN = "/opt/beegfs/sbin"
CONN_AUTH_FILE = "/etc/beegfs/connauthfile"


@dataclass(frozen=True)
class Phase:
    name: str
    scripts: dict[str, str]          # node name -> script (run as root)


def resolve_roles(entries: Sequence[str], workers: Sequence[Node], reducers: Sequence[Node]) -> list[Node]:
    """``worker:0``, ``worker:*``, ``reducer:*`` -> the nodes, in cluster order, each once."""
    by_role = {"worker": list(workers), "reducer": list(reducers)}
    chosen: list[Node] = []
    for entry in entries:
        role, _, index = entry.partition(":")
        if role not in by_role or not index:
            raise LaunchError(f"StorageMount role entry '{entry}' is not worker:N, worker:*, reducer:N or reducer:*")
        pool = by_role[role]
        if index == "*":
            picked = pool
        elif index.isdigit() and int(index) < len(pool):
            picked = [pool[int(index)]]
        else:
            raise LaunchError(f"StorageMount names {entry} but the cluster has {len(pool)} {role} node(s)")
        chosen += [n for n in picked if n not in chosen]
    return chosen


def _conf_set(path: str, key: str, value: str) -> str:
    return f"sed -i 's|^{key}[[:space:]]*=.*|{key} = {value}|' {path}"


def beegfs_plan(layout: dict, workers: Sequence[Node], reducers: Sequence[Node], *, secret: str) -> list[Phase]:
    """BeeGFS on RAM disks for this cluster, from the StorageMount output (infra.layout.beegfs_layout)."""
    roles = layout["roles"]
    mgmt_nodes = resolve_roles(roles["management"], workers, reducers)
    meta_nodes = resolve_roles(roles["metadata"], workers, reducers)
    storage_nodes = resolve_roles(roles["storage"], workers, reducers)
    clients = resolve_roles(roles["client"], workers, reducers)
    if len(mgmt_nodes) != 1:
        raise LaunchError(f"BeeGFS needs exactly one management node, StorageMount names {len(mgmt_nodes)}")
    mgmt = mgmt_nodes[0]
    ramdisk, mount = layout["ramdisk_path"], layout["mount_point"]
    size = f"{int(layout['ramdisk_gib_per_node'])}g"
    q = shlex.quote
    auth = (f"install -d -m 755 /etc/beegfs && umask 077 && printf %s {q(secret)} > {CONN_AUTH_FILE} && "
            f"chmod 400 {CONN_AUTH_FILE}")
    servers = {n.name for n in [mgmt, *meta_nodes, *storage_nodes]}

    def ramdisk_script() -> str:
        return "\n".join(["set -eu", auth, f"install -d {ramdisk}",
                          f"mountpoint -q {ramdisk} || mount -t tmpfs -o size={size},mode=0755 tmpfs {ramdisk}"])

    phases = [Phase("ramdisk and auth", {n.name: ramdisk_script() if n.name in servers else
                                         "\n".join(["set -eu", auth])
                                         for n in [*workers, *reducers] if n.name in servers or n in clients})]
    mgmt_conf = "/etc/beegfs/beegfs-mgmtd.conf"
    phases.append(Phase("management", {mgmt.name: "\n".join([
        "set -eu",
        f"{BEEGFS_SBIN}/beegfs-setup-mgmtd -p {ramdisk}/mgmtd -f",
        _conf_set(mgmt_conf, "connAuthFile", CONN_AUTH_FILE),
        "systemctl restart beegfs-mgmtd"])}))
    meta_conf = "/etc/beegfs/beegfs-meta.conf"
    phases.append(Phase("metadata", {n.name: "\n".join([
        "set -eu",
        f"{BEEGFS_SBIN}/beegfs-setup-meta -p {ramdisk}/meta -s {i + 1} -m {mgmt.address} -f",
        _conf_set(meta_conf, "connAuthFile", CONN_AUTH_FILE),
        _conf_set(meta_conf, "storeUseExtendedAttribs", "false"),
        "systemctl restart beegfs-meta"]) for i, n in enumerate(meta_nodes)}))
    storage_conf = "/etc/beegfs/beegfs-storage.conf"
    phases.append(Phase("storage targets", {n.name: "\n".join([
        "set -eu",
        f"{BEEGFS_SBIN}/beegfs-setup-storage -p {ramdisk}/storage -s {i + 1} -i {(i + 1) * 100 + 1} "
        f"-m {mgmt.address} -f",
        _conf_set(storage_conf, "connAuthFile", CONN_AUTH_FILE),
        "systemctl restart beegfs-storage"]) for i, n in enumerate(storage_nodes)}))
    client_conf = "/etc/beegfs/beegfs-client.conf"
    phases.append(Phase("clients", {n.name: "\n".join([
        "set -eu",
        f"{BEEGFS_SBIN}/beegfs-setup-client -m {mgmt.address}",
        _conf_set(client_conf, "connAuthFile", CONN_AUTH_FILE),
        _conf_set("/etc/beegfs/beegfs-helperd.conf", "connAuthFile", CONN_AUTH_FILE),
        f"echo '{mount} {client_conf}' > /etc/beegfs/beegfs-mounts.conf",
        f"install -d {mount}",
        "systemctl restart beegfs-helperd beegfs-client",
        f"mountpoint -q {mount}"]) for n in clients}))
    phases.append(Phase("verify", {mgmt.name: "\n".join([
        "set -eu",
        f"test \"$(beegfs-ctl --listtargets --nodetype=storage --state | grep -c 'Online.*Good')\" "
        f"-eq {len(storage_nodes)}",
        f"install -d -m 1777 {mount}/scaletrain"])}))
    return phases


def fsx_plan(mount: dict, nodes: Sequence[Node]) -> list[Phase]:
    """Mount FSx for Lustre at the same path on every node (the StorageMount output's fsx fields).

    The stack's instances mount it themselves in their boot, from /etc/fstab (:func:`boot_mount_commands`, put in
    their user data by infra/stack.py), before Slurm's daemons start; so on them this finds it mounted and only
    makes sure of the project's directory. It stays for a stack deployed before the boot mounted it, and is harmless
    where it is redundant: ``mountpoint -q || mount`` mounts nothing twice."""
    point = mount["mount_point"]
    source = f"{mount['dns_name']}@tcp:/{mount['mount_name']}"
    script = "\n".join([
        "set -eu",
        f"install -d {point}",
        f"mountpoint -q {point} || mount -t lustre -o {mount.get('mount_options') or 'relatime,flock'} "
        f"{source} {point}",
        f"install -d -m 1777 {point}/scaletrain",
    ])
    return [Phase("mount fsx", {n.name: script for n in nodes})]


def storage_plan(storage: dict, workers: Sequence[Node], reducers: Sequence[Node], *, secret: str) -> list[Phase]:
    """The set-up for the stack's ``Storage`` type; ``none`` needs nothing."""
    kind = storage.get("type", "none")
    if kind == "beegfs":
        return beegfs_plan(storage, workers, reducers, secret=secret)
    if kind == "fsx":
        return fsx_plan(storage, [*workers, *reducers])
    if kind == "none":
        return []
    raise LaunchError(f"unknown storage type '{kind}' in the stack's outputs; expected fsx, beegfs or none")


def render_plan(phases: Sequence[Phase]) -> str:
    """A plan as text (golden files, `--dry-run` style output)."""
    out = []
    for i, phase in enumerate(phases, 1):
        for node, script in phase.scripts.items():
            out.append(f"### phase {i}: {phase.name} on {node}\n{script}\n")
    return "\n".join(out)


def head_storage_plan(c: Cluster, *, secret: str) -> list[Phase]:
    """The head node mounts the shared storage as one more client, at the same path: Slurm's jobs keep their batch
    script and output in the run directory there, which `launch train` and `launch logs` read on the head node. A
    client only (no BeeGFS server: the StorageMount output's roles place those on workers), so its scripts are the
    nodes' plan's with the head among the clients, taken for the head alone. None without a head node or storage."""
    if c.head is None or c.aws is None:
        return []
    head, mount = c.head, c.aws.storage
    if mount.get("type") == "fsx":
        return fsx_plan(mount, [head])
    if mount.get("type") != "beegfs":
        return []
    # beegfs_plan places clients by ROLE:INDEX over workers and reducers; the head goes after the reducers, so no
    # entry the stack wrote shifts, and "reducer:*" among the clients takes it in.
    roles = mount["roles"]
    with_head = {**mount, "roles": {**roles, "client": [*roles["client"], "reducer:*"]}}
    phases = beegfs_plan(with_head, c.workers, [*c.reducers, head], secret=secret)
    return [Phase(p.name, {head.name: p.scripts[head.name]}) for p in phases if head.name in p.scripts]


def restarts_problem(storage_type: str, max_restarts: int) -> str | None:
    """Why ``--max-restarts`` cannot be kept on an AWS cluster with this storage, or None. A restart runs on a
    replacement instance, which has only what its own boot sets up: FSx it mounts from /etc/fstab
    (:func:`boot_mount_commands`), but BeeGFS's servers are the launcher's, on the old nodes' RAM disks, and the
    lost node's storage target (a stripe of every file, the checkpoints too) went with it."""
    if max_restarts > 0 and storage_type == "beegfs":
        return ("--max-restarts needs storage a replacement node mounts by its own boot (fsx); this cluster's beegfs "
                "lives on the nodes' RAM disks, which a replacement does not join; deploy with -c storage=fsx or run "
                "without --max-restarts")
    return None


# -- the mount a node's own boot makes -------------------------------------------------------------------------------

# FSx for Lustre, mounted at every boot from /etc/fstab, as AWS documents it: "file_system_dns_name@tcp:/mountname
# /fsx lustre defaults,relatime,flock,_netdev,x-systemd.automount,x-systemd.requires=network.service 0 0"
# (https://docs.aws.amazon.com/fsx/latest/LustreGuide/mount-fs-auto-mount-onreboot.html). x-systemd.automount is
# left out: slurmd must not start before the file system is there (the units order after remote-fs.target, which a
# _netdev mount is part of), and an automount point is "there" before the server answers; so is
# x-systemd.requires=network.service, a unit Ubuntu 22.04 does not have (_netdev orders the mount after the network).
FSX_FSTAB_OPTIONS = "defaults,relatime,flock,_netdev"
# Rehearsal nodes: this kernel has no Lustre (nor NFS) client, and FUSE's sshfs stands in, served by the local
# cluster's storage host. Coherence as Lustre gives it across nodes: no attribute, entry or directory caching
# (libfuse's attr_timeout/entry_timeout/negative_timeout, sshfs's dir_cache), so a file one node renames into place
# is what another node reads next; reconnect and keep-alives as a network file system needs; allow_other, since
# jobs run as other users than the one that mounted it.
SSHFS_FSTAB_OPTIONS = ("_netdev,allow_other,reconnect,ServerAliveInterval=5,ServerAliveCountMax=3,dir_cache=no,"
                       "attr_timeout=0,entry_timeout=0,negative_timeout=0,StrictHostKeyChecking=yes,"
                       "BatchMode=yes")
MOUNT_TRIES, MOUNT_RETRY_S = 30, 2   # a new file system's DNS name, or the server, may lag the first boot


def fstab_line(storage: dict) -> str:
    """The /etc/fstab line of the nodes' shared storage: ``storage`` is the StorageMount output's fsx fields
    (type fsx: dns_name, mount_name, mount_point) or the rehearsal's storage host (type sshfs: server, path,
    mount_point, identity_file, known_hosts_file)."""
    point = storage["mount_point"]
    if storage["type"] == "fsx":
        return f"{storage['dns_name']}@tcp:/{storage['mount_name']} {point} lustre {FSX_FSTAB_OPTIONS} 0 0"
    if storage["type"] == "sshfs":
        options = (f"{SSHFS_FSTAB_OPTIONS},IdentityFile={storage['identity_file']},"
                   f"UserKnownHostsFile={storage['known_hosts_file']}")
        return f"root@{storage['server']}:{storage['path']} {point} fuse.sshfs {options} 0 0"
    raise LaunchError(f"storage type {storage['type']!r} is not mounted by a node's boot; fsx or sshfs are")


def boot_mount_commands(storage: dict) -> list[str]:
    """What a node's boot runs to mount the shared storage itself, before its Slurm daemon starts: the fstab line
    (so every later boot mounts it too, before remote-fs.target), then the mount, retried for a while, and the
    project's directory on it. A replacement instance runs the same, so it has the storage before it takes a job."""
    line = fstab_line(storage)
    point = storage["mount_point"]
    return [
        f"install -d {shlex.quote(point)}",
        f"grep -qsF {shlex.quote(line)} /etc/fstab || echo {shlex.quote(line)} >> /etc/fstab",
        "tries=0",
        f"until mountpoint -q {shlex.quote(point)} || mount {shlex.quote(point)}; do",
        f'  tries=$((tries + 1)); if [ "$tries" -ge {MOUNT_TRIES} ]; then',
        f'    echo "scaletrain: could not mount {point}" >&2; exit 1',
        "  fi",
        f"  sleep {MOUNT_RETRY_S}",
        "done",
        f"install -d -m 1777 {shlex.quote(point + '/scaletrain')}",
    ]
