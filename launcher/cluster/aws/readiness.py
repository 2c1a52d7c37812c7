"""Is every node really ready? Pure verdicts over gathered facts, and the wait loop around them.

The facts come from launcher.cluster.aws.api (EC2 state, the SSM agent's ping) and from one probe over SSH
(cloud-init status, GPUs, EFA devices); the clock and the sleep are the caller's (launcher.execute.awsrun passes
time's), so nothing here reads the clock and the timeout path runs in tests in no time. A node is ready when it is
running, reachable (SSM agent online and SSH answering through it), cloud-init has finished, and it shows the
catalog's GPUs and the EFA devices the stack gave its node group (its ``NodeGroups`` output, recorded on each node by
discovery): none for reducers beside P4d/P5 (EFA traffic does not cross those families, so their group is on TCP)
or for any node of an ``-c efa=false`` stack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from launcher.cluster import Cluster
from launcher.errors import LaunchError

__all__ = ["NodeFacts", "PROBE", "STAGES", "Verdict", "expected_devices", "parse_probe", "verdict", "wait_ready"]

# In order; a node's stage is the first one it has not passed.
STAGES = ("instance", "agent", "ssh", "cloud-init", "gpus", "efa", "ready")

# One SSH round trip; each line is KEY=VALUE.
PROBE = "; ".join([
    "echo cloud_init=$(cloud-init status 2>/dev/null | sed -n 's/^status: //p')",
    "echo gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')",
    "echo efa=$(ls -d /sys/class/infiniband/*/device 2>/dev/null | wc -l)",
])


@dataclass(frozen=True)
class NodeFacts:
    name: str
    state: str                     # EC2 state name
    agent_online: bool             # SSM ping (SSM is the only way in)
    ssh_ok: bool = False
    cloud_init: str | None = None  # 'done', 'running', 'error', ...; None before SSH answers
    gpus: int | None = None
    efa: int | None = None
    ssh_error: str = ""


@dataclass(frozen=True)
class Verdict:
    node: str
    stage: str                     # one of STAGES
    detail: str

    @property
    def ready(self) -> bool:
        return self.stage == "ready"


def parse_probe(text: str) -> dict[str, str]:
    """PROBE's output -> {'cloud_init': 'done', 'gpus': '8', 'efa': '4'}."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def expected_devices(c: Cluster) -> dict[str, tuple[int, int]]:
    """Per node, (GPUs, EFA devices) it must show: its GPUs (the catalog's, as discovery recorded them) and the EFA
    devices of its node group's interfaces (the stack's NodeGroups output), never more than the group was given. The
    head node is waited for too (running, agent, SSH, cloud-init: its boot starts Slurm's controller) and must show
    neither: it runs no rank, and discovery records it with no GPU, on TCP."""
    return {n.name: (n.gpus, n.efa_devices if n.transport == "efa" else 0) for n in c.machines}


def verdict(facts: NodeFacts, *, gpus: int, efa: int) -> Verdict:
    """Where this node stands; ``gpus``/``efa`` are what it must show (the catalog's GPUs, the stack's EFA devices)."""
    def at(stage: str, detail: str) -> Verdict:
        return Verdict(facts.name, stage, detail)

    if facts.state != "running":
        return at("instance", f"instance {facts.state}")
    if not facts.agent_online:
        return at("agent", "SSM agent not online yet")
    if not facts.ssh_ok:
        return at("ssh", f"SSH not answering{': ' + facts.ssh_error if facts.ssh_error else ''}")
    if facts.cloud_init == "error":
        return at("cloud-init", "cloud-init finished with an error (see /var/log/cloud-init-output.log)")
    if facts.cloud_init not in ("done", "disabled"):
        return at("cloud-init", f"cloud-init {facts.cloud_init or 'not reporting'}")
    if (facts.gpus or 0) < gpus:
        return at("gpus", f"{facts.gpus or 0} of {gpus} GPUs visible")
    if (facts.efa or 0) < efa:
        return at("efa", f"{facts.efa or 0} of {efa} EFA devices visible")
    return at("ready", f"{gpus} GPU(s), " + (f"{efa} EFA device(s)" if efa else "TCP (no EFA device expected)"))


def wait_ready(gather: Callable[[], list[NodeFacts]], expected: dict[str, tuple[int, int]], *, timeout_s: float,
               interval_s: float = 10.0, clock: Callable[[], float], sleep: Callable[[float], None],
               on_progress: Callable[[list[Verdict]], None] | None = None) -> list[Verdict]:
    """Gather facts until every node in ``expected`` (name -> (gpus, efa)) is ready, or raise naming the stuck ones.

    A node that is expected but not reported (not launched yet) counts as stuck at 'instance'.
    """
    deadline = clock() + timeout_s
    while True:
        facts = {f.name: f for f in gather()}
        verdicts = [verdict(facts[name], gpus=g, efa=e) if name in facts else Verdict(name, "instance", "not launched")
                    for name, (g, e) in expected.items()]
        if on_progress:
            on_progress(verdicts)
        if all(v.ready for v in verdicts):
            return verdicts
        if clock() >= deadline:
            stuck = [v for v in verdicts if not v.ready]
            raise LaunchError(f"{len(stuck)} of {len(verdicts)} node(s) not ready after {timeout_s:.0f} s: "
                              + "; ".join(f"{v.node} ({v.detail})" for v in stuck))
        sleep(interval_s)
