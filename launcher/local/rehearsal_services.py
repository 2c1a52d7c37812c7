"""The instance's world for rehearsal nodes: IMDSv2 at 169.254.169.254 (launcher/local/imds.py) and a moto server
standing in for the AWS account, both in one namespace the cluster makes on its own bridge.

The nodes reach IMDS on-link as on EC2, and the account through the AWS CLI's endpoint setting
(launcher/plans/rehearsal.py: aws_config). This machine reaches the account at the same address, through the
bridge, to do what the stack does before any node boots (the munge key's secret).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from launcher.errors import LaunchError
from launcher.local import rehearsal_nodes as nodes_
from launcher.plans import rehearsal as plan

INSTANCES = "instances.json"             # IMDS's map of address -> instance, rewritten as nodes come and go
LOG = plan.SERVICES_LOG
START_TIMEOUT_S = 20.0


def endpoint(address: str) -> str:
    """The stand-in account's URL, at the services namespace's ``address``."""
    return f"http://{address}:{plan.ACCOUNT_PORT}"


def _processes(d: Path, svc: plan.NodeNet, instances: Path) -> dict[str, list[str]]:
    py = sys.executable
    return {"imds": ["ip", "netns", "exec", svc.netns, py, "-m", "launcher.local.imds", "--instances",
                     str(instances), "--bind", plan.IMDS_ADDRESS, "--port", str(plan.IMDS_PORT)],
            "account": ["ip", "netns", "exec", svc.netns, py, "-m", "launcher.local.account_server", "-H", svc.address,
                        "-p", str(plan.ACCOUNT_PORT)]}


def _answers(address: str, port: int) -> bool:
    try:
        with socket.create_connection((address, port), timeout=0.5):
            return True
    except OSError:
        return False


def start(d: Path, netw: plan.Network, record) -> dict[str, int]:
    """Make the services namespace and start IMDS and the account in it; returns their pids (recorded by
    ``record(name, pid)`` as each starts, so `down` stops exactly them). A service that does not answer within
    :data:`START_TIMEOUT_S` is a named failure."""
    svc = netw.services
    assert svc is not None
    if nodes_.netns_exists(svc.netns):
        raise LaunchError(f"network namespace {svc.netns} already exists; `launch local down` removes it")
    try:
        for cmd in plan.services_net_commands(netw):
            nodes_.run_tool(cmd, "making the services' network")
    finally:
        if nodes_.netns_exists(svc.netns):
            record("netns", svc)
    instances = d / INSTANCES
    if not instances.exists():
        instances.write_text("[]\n")
    pids = {}
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PYTHONUNBUFFERED": "1",
           "MOTO_PORT": str(plan.ACCOUNT_PORT)}
    with open(d / LOG, "ab") as log:
        for name, cmd in _processes(d, svc, instances).items():
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True, env=env)
            pids[name] = proc.pid
            record(name, proc.pid)
    deadline = time.monotonic() + START_TIMEOUT_S
    waiting = {"imds": (plan.IMDS_ADDRESS, plan.IMDS_PORT), "account": (svc.address, plan.ACCOUNT_PORT)}
    # This machine reaches 169.254.169.254 only through the namespace: ask from inside it.
    while waiting and time.monotonic() < deadline:
        for name, (address, port) in list(waiting.items()):
            ok = (_answers(address, port) if name == "account" else
                  subprocess.run(["ip", "netns", "exec", svc.netns, "curl", "-s", "-o", "/dev/null", "-m", "1",
                                  f"http://{address}:{port}/latest/api/token", "-X", "PUT",
                                  "-H", "X-aws-ec2-metadata-token-ttl-seconds: 60"],
                                 capture_output=True).returncode == 0)
            if ok:
                del waiting[name]
        time.sleep(0.1)
    if waiting:
        raise LaunchError(f"the rehearsal's {' and '.join(waiting)} did not answer within {START_TIMEOUT_S:.0f} s; "
                          f"log: {d / LOG}")
    return pids


STORAGE_DIR = "storage"                  # the storage host's keys and sshd configuration, in the cluster's directory
SSHD = "/usr/sbin/sshd"


def start_storage(d: Path, netw: plan.Network, shared: Path, record) -> dict[str, tuple[bytes, int]]:
    """The storage host: its namespace on the bridge, and sshd serving ``shared`` over SFTP only, chrooted to it.
    The export is seen through a private mount namespace (a tmpfs over /mnt holding a bind of ``shared``), so the
    chroot's path is root-owned all the way down wherever the cluster's directory lives. Returns the files a node
    needs to mount it (its key and the server's pinned host key), put on each node's disk before it boots, as the
    FSx client needs none on AWS: the one named difference for storage besides the mount line."""
    from launcher.files import keygen

    stor = netw.storage
    assert stor is not None
    if nodes_.netns_exists(stor.netns):
        raise LaunchError(f"network namespace {stor.netns} already exists; `launch local down` removes it")
    try:
        for cmd in plan.node_net_commands(netw, stor):
            nodes_.run_tool(cmd, "making the storage host's network")
    finally:
        if nodes_.netns_exists(stor.netns):
            record("storage_netns", stor)
    sd = d / STORAGE_DIR
    sd.mkdir(mode=0o700)
    keygen(sd / "ssh_host_ed25519_key", "scaletrain-storage")
    node_pub = keygen(sd / "node_ed25519", "scaletrain-storage-client")
    (sd / "authorized_keys").write_text(node_pub)
    cfg = sd / "sshd_config"
    export = "/mnt/scaletrain-export"
    cfg.write_text(plan.storage_sshd_config(address=stor.address, host_key=str(sd / "ssh_host_ed25519_key"),
                                            authorized_keys=str(sd / "authorized_keys"), pid_file=str(sd / "sshd.pid"),
                                            export=export) + "StrictModes no\n")
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation directory
    q = shlex.quote
    inner = "; ".join(["set -e", "mount --make-rprivate /", "mount -t tmpfs -o mode=0755,size=64k tmpfs /mnt",
                       f"install -d -m 0755 {export}", f"mount --bind {q(str(shared))} {export}",
                       f"exec {SSHD} -D -e -f {q(str(cfg))}"])
    with open(d / LOG, "ab") as log:
        proc = subprocess.Popen(["ip", "netns", "exec", stor.netns, "unshare", "--mount", "--", "bash", "-c", inner],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    record("storage", proc.pid)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not nodes_._banner(stor.address):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise LaunchError(f"the rehearsal's storage host did not answer on {stor.address}:22; log: {d / LOG}")
        time.sleep(0.1)
    return storage_files(d, stor.address)


def storage_files(d: Path, address: str) -> dict[str, tuple[bytes, int]]:
    """What a node needs on its disk to mount the storage host: its key, and the server's host key pinned."""
    sd = d / STORAGE_DIR
    key_type, key_blob = (sd / "ssh_host_ed25519_key.pub").read_text().split()[:2]
    return {plan.STORAGE_KEY: ((sd / "node_ed25519").read_bytes(), 0o600),
            plan.STORAGE_KNOWN_HOSTS: (f"{address} {key_type} {key_blob}\n".encode(), 0o644)}


def is_ours(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return ("launcher.local.imds" in cmdline or "launcher.local.account_server" in cmdline
            or f"{STORAGE_DIR}/sshd_config" in cmdline)


def stop(pid: int) -> None:
    if not is_ours(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, 0)


def account(address: str, service: str, key: str, secret: str):
    """A boto3 client of the stand-in account, from this machine, with the launcher's own key (RehearsalInfo's
    account_key and account_secret: IAM is enforced there, launcher/local/rehearsal_account.py)."""
    from launcher.local import rehearsal_account

    return rehearsal_account.client(endpoint(address), service, key, secret)
