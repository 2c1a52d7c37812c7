"""The local cluster's Auto Scaling group: a small process on this machine that replaces a lost node by itself.

On AWS a worker's Auto Scaling group launches a new instance when one is terminated or fails its health check, and
the new instance registers with Slurm's controller from its own boot (slurmd -Z), with nobody attached. `launch local
up` starts this keeper for a local cluster with Slurm, so that recovery there needs no launcher either: every
second it looks at each node's first process, and when one has ended it boots the node afresh (new address, new
host keys, the others told: launcher/local/rehearsal_cluster.replace), whose slurmd then registers again. A node
that Slurm holds drained with one of scaletrain's reasons (a straggler, --on-straggler drain; a node that fell short
of the node check) is replaced too, once no job is left on it (launcher/plans/draining.to_replace decides): on AWS
that node's health check marks its instance Unhealthy and its Auto Scaling group replaces it. The head node is not
replaced, as ParallelCluster's head node is in no Auto Scaling group. `launch local down` stops it first.

It logs one line per event to the cluster's keeper.log. Run as ``python -m launcher.local.keeper NAME``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

LOG = "keeper.log"
INTERVAL_S = 1.0
TEARDOWN_GRACE_S = 20.0


def is_keeper(pid: int) -> bool:
    try:
        return b"launcher.local.keeper" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def stop(pid: int, timeout_s: float = 10.0) -> None:
    """Stop the keeper whose pid was recorded (never another process that reuses its pid); it finishes a replacement
    under way first."""
    if not is_keeper(pid):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while is_keeper(pid) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.05)
    if is_keeper(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def say(line: str) -> None:
    print(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {line}", flush=True)


TTL_POLL_S = 5.0   # how often the keeper asks the account for the TTL (the TTL guard itself runs every few minutes)
_SSM: dict = {}
_ASKED: dict = {}


def torn_down(c) -> bool:
    """A job submitted with --teardown has ended: its epilog on the head node moved the cluster's TTL parameter to
    now in the account (infra/boot.py, teardown_argv_line; here the moto server standing in for it). After a grace
    period, in which a launcher still attached reads the run's summary, take the cluster down, as the TTL guard
    deletes a stack whose expiry has passed (infra/ttl.py)."""
    from infra import ttl
    from launcher.local import rehearsal_cluster as local_rehearsal
    from launcher.local import rehearsal_services as services_

    assert c.rehearsal is not None
    if not c.rehearsal.services:
        return False
    now = time.monotonic()
    if now - _ASKED.get("at", -TTL_POLL_S) < TTL_POLL_S:
        return False
    _ASKED["at"] = now
    try:
        if c.rehearsal.services not in _SSM:  # one client for the keeper's life: making one costs a tenth of a second
            _SSM[c.rehearsal.services] = services_.account(c.rehearsal.services, "ssm", c.rehearsal.account_key,
                                                           c.rehearsal.account_secret)
        value = _SSM[c.rehearsal.services].get_parameter(Name=ttl.parameter_name(c.name))["Parameter"]["Value"]
        expiry = ttl.parse_expiry(value).timestamp()
    except Exception:  # no parameter yet (no --teardown job has ended), or the account is gone with the cluster
        return False
    if time.time() - expiry < TEARDOWN_GRACE_S:
        return False
    say("a --teardown job has ended (its epilog moved the cluster's TTL to now); taking the cluster down")
    local_rehearsal.remove(local_rehearsal.cluster_dir(c.name))
    say("the cluster is down")
    return True


DRAINED_POLL_S = 5.0   # how often the keeper asks the controller for drained nodes (an ssh to the head node)
_REPLACED: dict[str, str] = {}   # node -> the SlurmdStartTime of the drained instance replaced (draining.to_replace)


def drained(c) -> list[str]:
    """The nodes Slurm holds drained with a scaletrain reason and no job on them, to replace as the Auto Scaling
    group replaces an instance marked Unhealthy; [] when the head node does not answer (asked again later)."""
    import subprocess

    from launcher import cluster as clusters
    from launcher.plans import draining, slurm

    if c.head is None:
        return []
    now = time.monotonic()
    if now - _ASKED.get("drained", -DRAINED_POLL_S) < DRAINED_POLL_S:
        return []
    _ASKED["drained"] = now
    try:
        out = subprocess.run(["ssh", "-F", str(clusters.cluster_dir(c.name) / "ssh_config"), "-o", "BatchMode=yes",
                              "-o", "ConnectTimeout=5", c.head.name, "scontrol --oneliner show node"],
                             capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    records = {f["NodeName"]: f for f in map(slurm.fields, out.splitlines()) if "NodeName" in f}
    found = [n for n in draining.to_replace(records, _REPLACED) if n in c.names()]
    for n in found:
        _REPLACED[n] = records[n].get("SlurmdStartTime", "")
        say(f"{n} is drained ({records[n].get('Reason', '')}); replacing it, as its Auto Scaling group would")
    return found


def main(name: str) -> int:
    from launcher import cluster as clusters
    from launcher.errors import LaunchError
    from launcher.local import rehearsal_cluster as local_rehearsal
    from launcher.local import rehearsal_nodes

    stopping = False

    def on_term(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    say(f"keeper of cluster '{name}' started (pid {os.getpid()})")
    while not stopping:
        time.sleep(INTERVAL_S)
        try:
            c = clusters.load(name)
        except LaunchError:
            say("the cluster is gone; stopping")
            return 0
        if torn_down(c):
            return 0
        running = local_rehearsal.running_nodes(c)
        lost = [n for n in c.names() if n not in running]
        for n in drained(c):  # as the group terminates the unhealthy instance, then launches its replacement
            if n in running:
                rehearsal_nodes.stop(c.processes[n])
            lost.append(n)
        if not lost or stopping:
            continue
        started = time.monotonic()
        say(f"lost: {', '.join(lost)} (its first process ended); replacing")
        try:
            new, _ = local_rehearsal.replace(c, lost)
        except Exception as e:  # noqa: BLE001 -- an Auto Scaling group keeps trying; so does the keeper
            say(f"replacing {', '.join(lost)} failed: {type(e).__name__}: {e}; trying again")
            time.sleep(INTERVAL_S)
            continue
        for n in lost:  # a replacement is a new instance at a new address; the same address is the node itself,
            # back from a reboot (`launch local reboot`) before its replacement began
            if new.node(n).address != c.node(n).address:
                say(f"{n} replaced: {new.node(n).address}, in {time.monotonic() - started:.1f} s")
            else:
                say(f"{n} is back by itself (rebooted): not replaced")
    say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
