"""`launch train`: plan on the launcher, execute on the first node, report, and tear down when asked.

Backend-agnostic: every step goes through the Cluster and launcher.remote, so the same code drives the
local cluster and an AWS one.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from launcher import efa, plan, remote
from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError

# Data made when `launch train` gets no --data: a small ILSVRC-layout set, converted to shards.
SAMPLE_CLASSES = 10
SAMPLE_PER_CLASS = 100
SAMPLE_VAL_PER_CLASS = 20


def sample_shard_size(samples: int, ranks: int, shards_per_rank: int = 4) -> int:
    """Shard size that gives every rank several shards of the sample set."""
    return max(1, math.ceil(samples / (ranks * shards_per_rank)))


@dataclass
class RunResult:
    exit_code: int
    output: str
    train_images: int           # training samples in the shards' manifest
    summary: dict | None
    lines: list[str] = field(default_factory=list)  # what mpirun printed, for faults.diagnose


def _on_first(cluster: Cluster, node: Node, command: str, what: str) -> str:
    code, out = remote.check(cluster, node, command)
    if code != 0:
        raise LaunchError(f"{what} failed on {node.name} (exit {code})")
    return out


def prepare_sample_data(cluster: Cluster, node: Node, output: str, ranks: int) -> str:
    """Make sample data and convert it on the first node (shared storage makes it visible to all)."""
    raw, shards = f"{output}/sample-ilsvrc", f"{output}/shards"
    launch = f"{shlex.quote(cluster.python)} -m launcher"
    size = sample_shard_size(SAMPLE_CLASSES * SAMPLE_PER_CLASS, ranks)
    for what, cmd in (
        ("making sample data", f"{launch} data sample --out {shlex.quote(raw)} --classes {SAMPLE_CLASSES} "
                               f"--per-class {SAMPLE_PER_CLASS} --val-per-class {SAMPLE_VAL_PER_CLASS}"),
        ("converting sample data", f"{launch} data convert {shlex.quote(raw)} --out {shlex.quote(shards)} "
                                   f"--shard-size {size}"),
    ):
        print(f"[{node.name}] {what}", flush=True)
        code, _ = remote.stream(cluster, node, cmd, pty=False)
        if code != 0:
            raise LaunchError(f"{what} failed on {node.name} (exit {code})")
    return shards


def train(cluster: Cluster, nodes: list[Node], spec: plan.TrainSpec, *, make_data: bool,
          reducers: list[Node] | None = None) -> RunResult:
    """`reducers`: reducer nodes for the reducer tier (spec.engine 'reducer'); one MPMD mpirun starts both."""
    first = nodes[0]
    out = shlex.quote(spec.output)
    _on_first(cluster, first, f"mkdir -p {out}", "creating the output directory")
    if make_data:
        spec = spec.model_copy(update={"data": prepare_sample_data(cluster, first, spec.output,
                                                                   sum(n.slots for n in nodes))})
    code, text = remote.check(cluster, first, f"cat {shlex.quote(spec.data)}/manifest.json")
    if code != 0:
        raise LaunchError(f"no manifest.json in {spec.data} on {first.name}; make shards with "
                          f"`launch data convert SRC --out {spec.data}` or leave out --data")
    train_images = sum(s["count"] for s in json.loads(text)["shards"] if s["split"] == "train")

    hostfile_path = f"{spec.output}/hostfile"
    hosts = plan.mpmd_hostfile(nodes, reducers) if reducers else plan.hostfile(nodes)
    _on_first(cluster, first, f"printf %s {shlex.quote(hosts)} > {shlex.quote(hostfile_path)}",
              "writing the hostfile")
    fabric_env, mca = efa.for_cluster(cluster)  # EFA / NCCL settings on AWS; none on the local cluster
    argv = plan.launch_argv(cluster, nodes, reducers or [], spec, hostfile_path, fabric_env=fabric_env, mca=mca)
    tier = f", {len(reducers)} reducer node(s)" if reducers else ""
    print(f"[launch] {len(nodes)} node(s), {sum(n.slots for n in nodes)} rank(s){tier}: {plan.command_line(argv)}",
          flush=True)
    code, lines = remote.stream(cluster, first, plan.command_line(argv))

    rc, text = remote.check(cluster, first, f"cat {out}/summary.json 2>/dev/null")
    summary = json.loads(text) if rc == 0 and text.strip() else None
    return RunResult(code, spec.output, train_images, summary, lines)


def local_output(path: str | None, stamp: str) -> str:
    return str(Path(path or f"runs/{stamp}").expanduser().resolve())
