"""Rehearsal nodes as pure plans: the root the image recipe builds, the private network, and each node's boot.

A rehearsal node is what `launch local up` makes: its own network namespace on a bridge made for the cluster, its
own hostname, ``sshd`` on port 22, and a copy-on-write view of a root built by the image recipe itself
(``ami/components/*.sh``, in the recipe's order, with ``SCALETRAIN_REHEARSAL=1``: the layers that need GPUs, EFA
or vendor repositories skip themselves, and ``ami/rehearsal/openmpi.sh`` puts Debian's Open MPI at the image's
prefix in place of the EFA installer's). Nothing of the launcher's machine is visible on a node except one shared
directory, mounted where the stack mounts FSx for Lustre. So a node lacks whatever a real node would lack, and a
launcher that relies on the launcher's own filesystem, PATH or tools fails here as it would on AWS.

Everything here is pure: launcher/local/rehearsal_root.py executes it.
"""

from __future__ import annotations

import hashlib
import ipaddress
import shlex
from dataclasses import dataclass

from ami import paths, render
from infra.layout import FSX_MOUNT_POINT
from launcher.errors import LaunchError

SWITCH = "SCALETRAIN_REHEARSAL"          # the one switch the component scripts honour
STANDIN = "openmpi.sh"                   # ami/rehearsal/: Open MPI where the EFA installer puts it
STANDIN_AFTER = "efa"                    # ... run where the efa component runs in the recipe
INSTANCE = "instance.sh"                 # ami/rehearsal/: what the Ubuntu AMI is and minbase is not
PROJECT_COMPONENT = "scaletrain"         # the project's own layer, rebuilt when the source changes
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
# What the Ubuntu AMI the recipe starts from ships and debootstrap's minbase lacks: the component scripts assume
# them (apt over https, python3 for the venv, sshd for the launcher, ip and ps for the doctor).
BASE_PACKAGES = ("openssh-server", "iproute2", "procps", "ca-certificates", "curl", "gnupg", "unzip", "python3",
                 "python3-venv", "less", "kmod", "psmisc")
# The image takes a CUDA build of versions.json's torch from PyTorch's CUDA index. A rehearsal node has no GPU, and
# that index is not a package registry this project may assume: it takes the CPU build of the release this
# project's own venv runs (the Makefile's TORCH_VERSION; tests/test_rehearsal_plan.py holds them equal), which is
# also the release scripts/build-horovod.sh's cached Horovod wheel was built against.
REHEARSAL_TORCH = "2.13.0"
SHARED_MOUNT = FSX_MOUNT_POINT           # where the stack mounts shared storage on every node
NODE_HOME = "/root"
NODE_WORKDIR = f"{NODE_HOME}/scaletrain"
NODE_STATE = f"{NODE_HOME}/.scaletrain/cluster"  # the nodes' ssh files, as discovery's NODE_STATE on AWS
NODE_INTERFACE = "eth0"
DEFAULT_SUBNET = "10.213.0.0/24"     # the first free 10.213.N.0/24 is taken when --subnet is not given
SERVICES = "services"                    # the services namespace's name
STORAGE = "storage"                      # the storage host's
STORAGE_EXPORT = "/"                     # what it serves: the shared directory, its sftp root (ChrootDirectory)
AWS_CONFIG = "/etc/scaletrain/rehearsal-aws-config"  # read by the rehearsal's AWS CLI (ami/components/aws-cli.sh)
STORAGE_KEY = "/root/.ssh/storage_ed25519"          # the node's key for it, and its pinned host key
STORAGE_KNOWN_HOSTS = "/root/.ssh/storage_known_hosts"
IMDS_ADDRESS = "169.254.169.254"         # as on every EC2 instance
IMDS_PORT = 80
ACCOUNT_PORT = 5000                      # the moto server standing in for the AWS account
REGION = "us-east-1"                     # the account's region and the nodes' zone, as IMDS reports them
ZONE = "us-east-1a"
INSTANCE_TYPE = "rehearsal"               # what the nodes' EC2 instances and IMDS say they are: no catalog type
SCRIPT_DIR = paths.SCRIPT_DIR            # where the image keeps its component scripts
BUILD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Step:
    """One script run in the root being built: ``script`` names a file in ami/components or ami/rehearsal."""

    script: str
    source: str                              # "components" or "rehearsal"
    env: dict[str, str]


def build_steps(versions: render.Versions, *, horovod_wheel: str | None = None) -> tuple[list[Step], Step | None]:
    """(the system layer's steps in recipe order, the project layer's step). Every component runs, the switch set;
    the stand-in runs right after the efa component it stands in for. ``horovod_wheel``: a path in the root of a
    wheel built from the same source with the same patch (scripts/build-horovod.sh), so that the build does not
    compile Horovod again. A recipe without the project's component gives no project step: nodes without the
    trainer, as the image would be."""
    system: list[Step] = [Step(INSTANCE, "rehearsal", {SWITCH: "1"})]
    project: Step | None = None
    for component in render.components_for(versions, "ubuntu"):
        if "build" not in component.phases:  # the image test runs on a launched instance, not in the build
            continue
        env = {**render.component_env(versions, component), SWITCH: "1"}
        if component.key == "pytorch":
            env["TORCH_VERSION"] = REHEARSAL_TORCH
        if component.key == "horovod" and horovod_wheel:
            env["SCALETRAIN_HOROVOD_WHEEL"] = horovod_wheel
        step = Step(component.script, "components", env)
        if component.key == PROJECT_COMPONENT:
            project = step
            continue
        system.append(step)
        if component.key == STANDIN_AFTER:
            system.append(Step(STANDIN, "rehearsal", {SWITCH: "1", "SCALETRAIN_MPI_PREFIX": paths.MPI_PREFIX}))
    return system, project


def step_command(step: Step) -> list[str]:
    """The command that runs ``step`` in the root (under chroot): a clean environment, as Image Builder gives."""
    env = {"PATH": BUILD_PATH, "HOME": "/root", "LANG": "C.UTF-8", "DEBIAN_FRONTEND": "noninteractive", **step.env}
    return ["/usr/bin/env", "-i", *(f"{k}={v}" for k, v in env.items()), "bash", f"{SCRIPT_DIR}/{step.script}",
            "build"]


def digest(parts: dict[str, bytes]) -> str:
    """A key for a layer: the sha256 of its named inputs, in name order."""
    h = hashlib.sha256()
    for name in sorted(parts):
        h.update(name.encode() + b"\0" + hashlib.sha256(parts[name]).digest())
    return h.hexdigest()[:16]


def system_inputs(steps: list[Step], scripts: dict[str, bytes], extra: dict[str, bytes]) -> dict[str, bytes]:
    """What the system layer is made from: the debootstrap line, each step's script and environment, in order."""
    parts = {"debootstrap": f"{SUITE} {MIRROR} {' '.join(BASE_PACKAGES)}".encode(), **extra}
    for i, step in enumerate(steps):
        parts[f"{i:02d}-{step.script}"] = scripts[step.script] + b"\0" + repr(sorted(step.env.items())).encode()
    return parts


# -- the network ----------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NodeNet:
    name: str
    netns: str                               # ip netns name
    veth: str                                # the host end; the node's end is eth0 in its namespace
    address: str


@dataclass(frozen=True)
class Network:
    bridge: str
    subnet: str
    gateway: str                             # the bridge's address: how the launcher reaches the nodes
    prefixlen: int
    nodes: list[NodeNet]
    services: NodeNet | None = None          # the instance's world: IMDS and the account's stand-in
    storage: NodeNet | None = None           # the storage host: the nodes' shared file system's server

    def node(self, name: str) -> NodeNet:
        return next(n for n in self.nodes if n.name == name)


def tag(key: str) -> str:
    """A short, stable tag of a cluster's key for interface names (IFNAMSIZ: at most 15 characters)."""
    return hashlib.sha256(key.encode()).hexdigest()[:5]


def parse_subnet(subnet: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.IPv4Network(subnet, strict=True)
    except ValueError as e:
        raise LaunchError(f"--subnet {subnet}: not an IPv4 network in CIDR form ({e}); e.g. {DEFAULT_SUBNET}") from None
    if not net.is_private or net.prefixlen > 28 or net.prefixlen < 16:
        raise LaunchError(f"--subnet {subnet}: must be a private IPv4 network of /16 to /28 (RFC 1918), "
                          f"e.g. {DEFAULT_SUBNET}")
    return net


def free_subnet(routes: list[str]) -> str:
    """The default subnet: the first 10.213.N.0/24 that no route of this machine overlaps (another rehearsal
    cluster's bridge included), so that two clusters, or two users' clusters, do not collide."""
    for n in range(256):
        candidate = f"10.213.{n}.0/24"
        if not overlapping(candidate, routes):
            return candidate
    raise LaunchError("every 10.213.N.0/24 is routed on this machine; choose a free private subnet with --subnet")


def network(key: str, names: list[str], subnet: str = DEFAULT_SUBNET) -> Network:
    """The bridge, the gateway (the bridge's own address, first in the subnet) and one address per node after it.
    ``key``: what makes the cluster unique on this machine (its state directory), for interface names."""
    net = parse_subnet(subnet)
    hosts = list(net.hosts())
    if len(names) + 3 > len(hosts):  # the gateway first, the storage host and the services last
        raise LaunchError(f"--subnet {subnet} has room for {len(hosts) - 3} nodes, not {len(names)}; "
                          f"choose a larger one")
    t = tag(key)
    nodes = [NodeNet(name, f"st-{t}-{name}", f"st{t}v{i}", str(hosts[i + 1])) for i, name in enumerate(names)]
    return Network(f"st{t}br", str(net), str(hosts[0]), net.prefixlen, nodes, services_net(key, subnet),
                   storage_net(key, subnet))


def services_net(key: str, subnet: str) -> NodeNet:
    """The namespace serving what an EC2 instance reaches besides its peers: IMDS at 169.254.169.254 and the
    account's APIs (a moto server). It takes the subnet's last address, which no node is ever given."""
    net = parse_subnet(subnet)
    t = tag(key)
    return NodeNet(SERVICES, f"st-{t}-{SERVICES}", f"st{t}vs", str(list(net.hosts())[-1]))


def storage_net(key: str, subnet: str) -> NodeNet:
    """The storage host's namespace (the file server FSx for Lustre is on AWS): the subnet's last address but one."""
    net = parse_subnet(subnet)
    t = tag(key)
    return NodeNet(STORAGE, f"st-{t}-{STORAGE}", f"st{t}vf", str(list(net.hosts())[-2]))


def replacement_address(subnet: str, taken: set[str]) -> str:
    """A replaced node's new address: the first of the subnet that no node has had in this cluster's life. An Auto
    Scaling replacement is a new instance with a new private address, and the other nodes must learn it from the
    rewritten ssh_config and known_hosts, not find the old one answering (nor an old ARP entry pointing nowhere)."""
    net = parse_subnet(subnet)
    for host in list(net.hosts())[1:-2]:  # the last two are the storage host's and the services' (storage_net)
        if str(host) not in taken:
            return str(host)
    raise LaunchError(f"--subnet {subnet} has no address left for a replacement; bring the cluster up again "
                      f"with a larger --subnet")


def overlapping(subnet: str, routes: list[str]) -> list[str]:
    """Which of the host's routed networks (``ip route`` destinations) overlap ``subnet``."""
    net = ipaddress.IPv4Network(subnet)
    found = []
    for dest in routes:
        if dest == "default":
            continue
        try:
            other = ipaddress.IPv4Network(dest, strict=False)
        except ValueError:
            continue
        if net.overlaps(other):
            found.append(dest)
    return found


def network_commands(netw: Network) -> list[list[str]]:
    """`ip` commands that make the bridge and give it the gateway address."""
    return [["ip", "link", "add", netw.bridge, "type", "bridge"],
            ["ip", "addr", "add", f"{netw.gateway}/{netw.prefixlen}", "dev", netw.bridge],
            ["ip", "link", "set", netw.bridge, "up"]]


def node_net_commands(netw: Network, node: NodeNet) -> list[list[str]]:
    """`ip` commands that give one node its namespace, its end of a veth pair as eth0, and its address."""
    ns = ["ip", "-n", node.netns]
    return [["ip", "netns", "add", node.netns],
            ["ip", "link", "add", node.veth, "type", "veth", "peer", "name", NODE_INTERFACE, "netns", node.netns],
            ["ip", "link", "set", node.veth, "master", netw.bridge, "up"],
            [*ns, "addr", "add", f"{node.address}/{netw.prefixlen}", "dev", NODE_INTERFACE],
            [*ns, "link", "set", NODE_INTERFACE, "up"],
            [*ns, "link", "set", "lo", "up"],
            # IMDS is on-link from every instance (169.254.169.254, link-local); here the services namespace holds
            # that address on the same bridge and answers ARP for it.
            [*ns, "route", "add", f"{IMDS_ADDRESS}/32", "dev", NODE_INTERFACE]]


def services_net_commands(netw: Network) -> list[list[str]]:
    """The services namespace: a node's network, plus IMDS's address on its interface."""
    assert netw.services is not None
    ns = ["ip", "-n", netw.services.netns]
    return [*node_net_commands(netw, netw.services)[:-1],
            [*ns, "addr", "add", f"{IMDS_ADDRESS}/32", "dev", NODE_INTERFACE]]


def storage_mount(server: str) -> dict:
    """The rehearsal's storage, in the shape :func:`launcher.plans.storage.fstab_line` takes (the one named
    difference for storage: sshfs from the storage host where AWS mounts FSx for Lustre)."""
    return {"type": "sshfs", "server": server, "path": STORAGE_EXPORT, "mount_point": SHARED_MOUNT,
            "identity_file": STORAGE_KEY, "known_hosts_file": STORAGE_KNOWN_HOSTS}


def storage_sshd_config(*, address: str, host_key: str, authorized_keys: str, pid_file: str, export: str) -> str:
    """The storage host's sshd: SFTP only, into the exported directory (ChrootDirectory: "all components of the
    pathname must be root-owned directories that are not writable by any other user or group", sshd_config(5)),
    keys only, for root (the nodes' boot mounts as root)."""
    return "\n".join([
        f"ListenAddress {address}:22", f"HostKey {host_key}", f"PidFile {pid_file}",
        f"AuthorizedKeysFile {authorized_keys}", "PermitRootLogin prohibit-password", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "UsePAM no", "AllowTcpForwarding no", "X11Forwarding no",
        "Subsystem sftp internal-sftp", "ForceCommand internal-sftp", f"ChrootDirectory {export}",
        "MaxSessions 64", "MaxStartups 200:30:400", ""])


def aws_config(endpoint: str, region: str) -> str:
    """The AWS CLI's configuration on a rehearsal node (:data:`AWS_CONFIG`): the one named difference for the
    account. Every call the boot and the epilog make goes to ``endpoint`` (the moto server standing in for the
    account) through the CLI's own setting ("endpoint_url", https://docs.aws.amazon.com/sdkref/latest/guide/
    feature-ss-endpoints.html), with the role's credentials from IMDS, as on EC2. On AWS the nodes have no
    configuration at all."""
    return f"[default]\nregion = {region}\nendpoint_url = {endpoint}\n"


# -- a node's boot ----------------------------------------------------------------------------------------------------

HOST_KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"   # what cloud-init prints on an EC2 console
HOST_KEYS_END = "-----END SSH HOST KEY KEYS-----"


# What booting one node costs this machine, in seconds of one core: systemd, cloud-init's four stages, the user data
# (the AWS CLI, sshfs, munge, slurmd) and slurmd's first health check (its one torch import). Measured 2026-11-27 in
# the node's cgroup (cpu.stat usage_usec, docs/benchmarks.md): 8.7-9.6 s for a node with Slurm. A node booting
# beside others is given their CPU time over this machine's cores.
BOOT_CPU_S = 12.0
BOOT_SLACK_S = 60.0
# At most this many nodes a core boot at once; the rest wait their turn. Instances boot on CPUs of their own; here
# they share this machine's, and 64 nodes booted at once on 2 cores (load 31) each took over 450 s and node10 timed
# out while none had finished: every boot crawled at 1/32 of a core till the end. In turns each node boots in
# seconds, the cluster's boot stays its nodes' CPU time over the cores, and the first nodes are ready early.
BOOTS_PER_CPU = 2


# inotify instances a running node holds: its systemd 5, dbus-daemon 1, systemd-logind 1 (counted on a booted node,
# /proc/PID/fd -> anon_inode:inotify), and one spare for a unit that watches while it starts. They count against one
# limit for every root process of this machine, fs.inotify.max_user_instances (inotify(7), "/proc interfaces"; 128
# by default), because the nodes are root without a user namespace of their own. A systemd that finds none left
# hangs or exits before it says a word: 64 nodes on this machine's 128 stopped at the 18th to 21st node, each time
# with an empty console. kind meets the same with its systemd nodes and raises the limit
# (https://kind.sigs.k8s.io/docs/user/known-issues/#pod-errors-due-to-too-many-open-files).
INOTIFY_PER_NODE = 8
INOTIFY_LIMIT = "/proc/sys/fs/inotify/max_user_instances"


def inotify_shortfall(nodes: int, limit: int, in_use: int) -> str | None:
    """The one line refusing to boot `nodes` nodes when root's inotify instances would run out, else None."""
    need = nodes * INOTIFY_PER_NODE
    if in_use + need <= limit:
        return None
    enough = 1 << (in_use + need - 1).bit_length()
    return (f"{nodes} rehearsal node(s) need about {need} inotify instances ({INOTIFY_PER_NODE} each, for systemd) "
            f"and root has {max(0, limit - in_use)} of its {limit} left (fs.inotify.max_user_instances); a node's "
            f"systemd finding none hangs without a word. Raise it for the cluster's life: "
            f"sysctl fs.inotify.max_user_instances={enough} (restore {limit} afterwards), or boot fewer nodes")


def boot_parallelism(nodes: int, cpus: int) -> int:
    """How many of a cluster's `nodes` boot at once on `cpus` cores."""
    return max(1, min(nodes, BOOTS_PER_CPU * max(1, cpus)))


def boot_timeout(nodes: int, cpus: int) -> float:
    """Seconds a node booting beside `nodes` - 1 others on `cpus` cores has to finish its first boot."""
    return BOOT_SLACK_S + BOOT_CPU_S * max(1, nodes) / max(1, cpus)


CGROUP_PARENT = "scaletrain"             # the nodes' cgroups, under this machine's cgroup2 hierarchy
CLOUD_RESULT = "/run/cloud-init/result.json"   # written by cloud-init's final stage at every boot
CLOUD_OUTPUT_LOG = "/var/log/cloud-init-output.log"  # the user data's output (Ubuntu's and Debian's cloud.cfg)
SEED_DIR = "/var/lib/cloud/seed/nocloud"
SERVICES_LOG = "services.log"            # the services' output, in the cluster's directory (rehearsal_services)


def boot_script(*, node: str, lowerdirs: list[str], upper: str, work: str, merged: str) -> str:
    """The node's first process, run as PID 1 of new mount, UTS, IPC, PID and cgroup namespaces inside its network
    namespace: mount its root (an overlay of the built layers with the node's own upper directory, its disk), the
    kernel's file systems an instance has (proc, sysfs, cgroup2 at /sys/fs/cgroup as on Ubuntu 22.04, a /dev with
    the node's console), take its host name as EC2's DHCP gives one, pivot into the root so nothing else of the
    launcher's machine is reachable, and become systemd, the image's init. Everything after that is the image's
    own boot: systemd starts cloud-init, which runs the instance's user data once (its seed: :func:`seed_files`)
    and prints the host keys on the console, where the launcher pins them as it does from an EC2 console; the
    units the user data enabled come back at every later boot. Killing it ends every process of the node at once.
    Nothing of this machine is bound in: the node's own boot mounts the shared storage from the storage host."""
    q = shlex.quote
    lower = ":".join(lowerdirs)
    return "\n".join([
        "#!/bin/bash",
        "set -euo pipefail",
        "mount --make-rprivate /",
        f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {q(merged)}",
        f"mount -t proc proc {q(merged + '/proc')}",
        f"mount -t sysfs -o ro sysfs {q(merged + '/sys')}",
        # This process was put in the node's own cgroup before it unshared its cgroup namespace, so cgroup2 mounted
        # here shows that cgroup as the root: systemd and slurmd see a cgroup v2 host of their own, as on Ubuntu
        # 22.04 ("unified hierarchy"; cgroup_namespaces(7)).
        f"mount -t cgroup2 cgroup2 {q(merged + '/sys/fs/cgroup')}",
        f"mount -t tmpfs -o mode=0755,size=64k tmpfs {q(merged + '/dev')}",
        *(f"touch {q(merged + '/dev/' + d)} && mount --bind /dev/{d} {q(merged + '/dev/' + d)}"
          for d in ("null", "zero", "full", "random", "urandom", "tty", "fuse")),
        # The console: what the node's systemd and cloud-init write there lands in the node's console log (this
        # process's standard output), as an EC2 instance's serial console does in GetConsoleOutput.
        f"touch {q(merged + '/dev/console')} && mount --bind /proc/self/fd/1 {q(merged + '/dev/console')}",
        f"install -d {q(merged + '/dev/pts')} {q(merged + '/dev/shm')}",
        f"mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts {q(merged + '/dev/pts')}",
        f"ln -s pts/ptmx {q(merged + '/dev/ptmx')}",
        f"mount -t tmpfs -o mode=1777 tmpfs {q(merged + '/dev/shm')}",
        f"hostname {q(node)}",
        f"cd {q(merged)}",
        "install -d .oldroot",
        "pivot_root . .oldroot",
        "cd /",
        "umount -l /.oldroot",
        "rmdir /.oldroot",
        # systemd's interface for containers: `container` names the manager (systemd's CONTAINER_INTERFACE).
        # The node is root on this machine's kernel, where the clock and the loaded modules are not namespaced
        # (time_namespaces(7) offsets only the monotonic and boot clocks): without CAP_SYS_TIME and CAP_SYS_MODULE
        # in its bounding set no process of the node can set this machine's clock or load a module into its kernel,
        # which a container runtime refuses the same way (Docker's default capabilities leave both out:
        # https://docs.docker.com/engine/containers/run/#runtime-privilege-and-linux-capabilities). The image's
        # chrony.service then skips itself (ConditionCapability=CAP_SYS_TIME), as in a container; on an instance
        # it keeps the clock (capabilities(7); setpriv(1) --bounding-set).
        "exec setpriv --bounding-set=-sys_time,-sys_module env -i container=scaletrain-rehearsal /sbin/init",
        ""])


def clock_offsets(boottime_s: float, monotonic_s: float) -> tuple[int, int]:
    """The node's time namespace offsets (time_namespaces(7): /proc/PID/timens_offsets, `unshare --boottime
    --monotonic`) for this machine's CLOCK_BOOTTIME and CLOCK_MONOTONIC now: both clocks start about a second into
    the node's boot, as on an instance that has just booted, never below zero (the kernel refuses a negative clock).
    A node's uptime is then its own: slurmd reports it (sysinfo(2)) and Slurm records the node's BootTime from it,
    and a replacement's first boot tells its own boot from its predecessor's by it (/proc/uptime,
    plans/slurm_rejoin.lost_batch_requeue). With this machine's uptime every node had booted hours before it did.
    (Slurm 22.05's _purge_missing_jobs, which requeues a batch job its batch node no longer has, reads the job's start
    and last activity, not the node's boot: that a replacement under its predecessor's name left such a job
    "running" was the registration's timing, which lost_batch_requeue addresses.)"""
    return -max(0, int(boottime_s) - 1), -max(0, int(monotonic_s) - 1)


def boot_command(netns: str, cgroup: str, script: str, offsets: tuple[int, int] = (0, 0)) -> list[str]:
    """What this machine runs to boot a node: move into the node's cgroup (first: `ip netns exec` remounts /sys,
    where this machine's cgroup2 hierarchy is no longer mounted), then into its network namespace, then unshare the
    rest (the cgroup namespace among them, so its root is the node's cgroup; a time namespace with `offsets`, from
    :func:`clock_offsets`) and run :func:`boot_script`."""
    boottime, monotonic = offsets
    inner = shlex.join(["ip", "netns", "exec", netns, "unshare", "--cgroup", "--mount", "--uts", "--ipc", "--pid",
                        "--time", f"--boottime={boottime}", f"--monotonic={monotonic}",
                        "--fork", "--kill-child", "--", "bash", script])
    return ["bash", "-c", f"echo $$ > {shlex.quote(cgroup + '/cgroup.procs')} && exec {inner}"]


def seed_files(*, instance_id: str, hostname: str, user_data: str,
               public_keys: list[str]) -> dict[str, tuple[bytes, int]]:
    """NoCloud's seed on the node's disk, read by cloud-init at the first boot as the Ec2 datasource reads IMDS on
    EC2: the instance id (cloud-init runs per-instance modules, the user data among them, once per id), the host
    name, the key pair's public keys (installed in authorized_keys by cloud-init's ssh module) and the user data
    (https://cloudinit.readthedocs.io/en/22.4/topics/datasources/nocloud.html).

    Why not the Ec2 datasource against the nodes' IMDS (which serves the same user data, EC2's dated versions too):
    cloud-init 22.4 asks IMDS for a token only where it has identified the platform as AWS
    (DataSourceEc2._maybe_fetch_api_token), from /sys/hypervisor/uuid or DMI's product_uuid and serial beginning
    "ec2" (identify_aws), and it reads no DMI in a container (dmi.read_dmi_data). This kernel has neither file and a
    node's sysfs cannot gain one, so cloud-init would read IMDS without a token (IMDSv1), which HttpTokens=required
    refuses with 401 for its whole 120 s wait."""
    import json

    meta = "\n".join([f"instance-id: {json.dumps(instance_id)}", f"local-hostname: {json.dumps(hostname)}",
                      "public-keys:", *(f"  - {json.dumps(k.strip())}" for k in public_keys if k.strip()), ""])
    return {f"{SEED_DIR}/meta-data": (meta.encode(), 0o600), f"{SEED_DIR}/user-data": (user_data.encode(), 0o600)}


def root_required(euid: int) -> None:
    if euid != 0:
        raise LaunchError("rehearsal nodes need root (network namespaces, a bridge and overlay mounts): run "
                          "`launch local up` as root, or `launch local up --loopback` for sshd processes on "
                          "127.0.0.1 without isolation")


MISSING_TOOL = {
    "ip": "install iproute2",
    "unshare": "install util-linux",
    "debootstrap": "install debootstrap (`make setup` does)",
    "chroot": "install coreutils",
    "mount": "install mount",
}


def missing_tools(found: dict[str, bool]) -> str | None:
    """One line naming the tools not found and the fix, or None."""
    missing = [t for t, ok in found.items() if not ok]
    if not missing:
        return None
    return ("rehearsal nodes need " + ", ".join(missing) + ": "
            + "; ".join(MISSING_TOOL.get(t, f"install {t}") for t in missing))
