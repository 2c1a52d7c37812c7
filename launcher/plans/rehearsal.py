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
import re
import shlex
from dataclasses import dataclass

from ami import paths, render
from infra.layout import FSX_MOUNT_POINT
from launcher.errors import LaunchError

SWITCH = "SCALETRAIN_REHEARSAL"          # the one switch the component scripts honour
STANDIN = "openmpi.sh"                   # ami/rehearsal/: Open MPI where the EFA installer puts it
STANDIN_AFTER = "efa"                    # ... run where the efa component runs in the recipe
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
    system: list[Step] = []
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
    if len(names) + 1 > len(hosts):
        raise LaunchError(f"--subnet {subnet} has room for {len(hosts) - 1} nodes, not {len(names)}; "
                          f"choose a larger one")
    t = tag(key)
    nodes = [NodeNet(name, f"st-{t}-{name}", f"st{t}v{i}", str(hosts[i + 1])) for i, name in enumerate(names)]
    return Network(f"st{t}br", str(net), str(hosts[0]), net.prefixlen, nodes)


def replacement_address(subnet: str, taken: set[str]) -> str:
    """A replaced node's new address: the first of the subnet that no node has had in this cluster's life. An Auto
    Scaling replacement is a new instance with a new private address, and the other nodes must learn it from the
    rewritten ssh_config and known_hosts, not find the old one answering (nor an old ARP entry pointing nowhere)."""
    net = parse_subnet(subnet)
    for host in list(net.hosts())[1:]:
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
            [*ns, "link", "set", "lo", "up"]]


# -- a node's boot ----------------------------------------------------------------------------------------------------

HOST_KEYS_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"   # what cloud-init prints on an EC2 console
HOST_KEYS_END = "-----END SSH HOST KEY KEYS-----"


def boot_script(*, node: str, lowerdirs: list[str], upper: str, work: str, merged: str, shared: str,
                services: tuple[str, ...] = ()) -> str:
    """The node's first process, run as pid 1 of new mount, UTS, IPC and PID namespaces inside its network
    namespace: mount its root (an overlay of the built layers with the node's own upper directory) and the shared
    directory, pivot into it so nothing else of the launcher's machine is reachable, take its hostname, make its
    host keys and print them between cloud-init's markers (the launcher pins them from this output, as it does
    from an EC2 console), start ``services`` (each a command that daemonizes: munge and Slurm's daemon,
    launcher/plans/slurm.py), then become sshd. Killing it ends every process of the node at once."""
    q = shlex.quote
    lower = ":".join(lowerdirs)
    return "\n".join([
        "#!/bin/bash",
        "set -euo pipefail",
        "mount --make-rprivate /",
        f"mount -t overlay overlay -o lowerdir={lower},upperdir={upper},workdir={work} {q(merged)}",
        f"install -d {q(merged + SHARED_MOUNT)}",
        f"mount --bind {q(shared)} {q(merged + SHARED_MOUNT)}",
        f"mount -t proc proc {q(merged + '/proc')}",
        f"mount -t sysfs sysfs {q(merged + '/sys')}",
        # slurmd initializes its cgroup plugin even with proctrack/linuxproc and task/none, and fails with "No
        # filesystem mounted on /sys/fs/cgroup" (`ip netns exec` gives the node a fresh sysfs without this
        # machine's cgroup mounts). A tmpfs there with a v1 systemd hierarchy under it is what Slurm's autodetection
        # takes for cgroup v1, whose plugin then needs no controller for those two plugins.
        *([f"mount -t tmpfs -o mode=0755 cgroup {q(merged + '/sys/fs/cgroup')}",
           f"install -d {q(merged + '/sys/fs/cgroup/systemd')}",
           f"mount -t cgroup -o none,name=systemd cgroup {q(merged + '/sys/fs/cgroup/systemd')}"]
          if services else []),
        f"mount -t tmpfs -o mode=0755,size=64k tmpfs {q(merged + '/dev')}",
        *(f"touch {q(merged + '/dev/' + d)} && mount --bind /dev/{d} {q(merged + '/dev/' + d)}"
          for d in ("null", "zero", "full", "random", "urandom", "tty")),
        f"install -d {q(merged + '/dev/pts')} {q(merged + '/dev/shm')}",
        f"mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts {q(merged + '/dev/pts')}",
        f"ln -s pts/ptmx {q(merged + '/dev/ptmx')}",
        f"mount -t tmpfs -o mode=1777 tmpfs {q(merged + '/dev/shm')}",
        f"mount -t tmpfs -o mode=0755 tmpfs {q(merged + '/run')}",
        f"mount -t tmpfs -o mode=1777 tmpfs {q(merged + '/tmp')}",
        f"hostname {q(node)}",
        f"cd {q(merged)}",
        "install -d .oldroot",
        "pivot_root . .oldroot",
        "cd /",
        "umount -l /.oldroot",
        "rmdir /.oldroot",
        f"echo {q(node)} > /etc/hostname",
        "export PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        # A node's host keys are its own, made at its first boot: cloud-init deletes any the image carries and makes
        # new ones (cc_ssh, ``ssh_deletekeys``: "prevents re-use of a private host key from an image with keys",
        # https://cloudinit.readthedocs.io/en/latest/reference/modules.html#ssh). Debian's openssh-server package
        # made a set when the root was built; without this every node would present the same keys.
        "test -e /etc/ssh/.scaletrain-node-keys || rm -f /etc/ssh/ssh_host_*",
        "ssh-keygen -A >/dev/null",
        "touch /etc/ssh/.scaletrain-node-keys",
        f"echo {q(HOST_KEYS_BEGIN)}",
        "cat /etc/ssh/ssh_host_ed25519_key.pub /etc/ssh/ssh_host_ecdsa_key.pub",
        f"echo {q(HOST_KEYS_END)}",
        *services,
        "install -d -m 0755 /run/sshd",
        "exec /usr/sbin/sshd -D -e",
        ""])


def sshd_listening(log: str) -> bool:
    return re.search(r"Server listening on \S+ port 22", log) is not None


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


def last_lines(text: str, count: int = 5) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(lines[-count:]) or "(no output)"
