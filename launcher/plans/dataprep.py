"""`launch data convert --cluster`: ImageNet to shards on every node of a cluster at once.

Every node reads SRC and writes to --out on shared storage (FSx, BeeGFS; the local cluster's nodes share the
machine's filesystem). Each computes the same plan (training.convert), and node i of N writes shards i, i+N, ...
and its own node manifest, with one worker process per core; when all have finished, the first node merges the
node manifests into manifest.json. Killed or failed part-way, the same command resumes: every node keeps the
shards it verifies and writes the rest.

The command lines are a pure function of the cluster and the spec; execution is launcher.remote's.
"""

from __future__ import annotations

import json
import shlex
from concurrent.futures import ThreadPoolExecutor

from pydantic import BaseModel, ConfigDict

from launcher import remote
from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError


class ConvertSpec(BaseModel):
    """What `launch data convert --cluster` asks every node to do (paths as the nodes see them)."""

    model_config = ConfigDict(frozen=True)

    src: str
    out: str
    shard_size: int = 1000
    seed: int = 0
    resize: int | None = None
    quality: int = 95
    workers: int | None = None  # per node; None: the node's cores


def convert_command(cluster: Cluster, spec: ConvertSpec, node: Node, index: int, count: int) -> str:
    """The shell line node `index` of `count` runs."""
    argv = [cluster.python, "-m", "launcher", "data", "convert", spec.src, "--out", spec.out,
            "--shard-size", str(spec.shard_size), "--seed", str(spec.seed), "--quality", str(spec.quality)]
    if spec.resize is not None:
        argv += ["--resize", str(spec.resize)]
    argv += ["--workers", str(spec.workers or node.cpus), "--node-index", str(index), "--node-count", str(count)]
    return shlex.join(argv) + " 2>&1"  # stderr too comes back prefixed by the node


def merge_command(cluster: Cluster, spec: ConvertSpec, count: int) -> str:
    argv = [cluster.python, "-m", "launcher", "data", "convert", "--out", spec.out, "--node-count", str(count),
            "--merge"]
    return shlex.join(argv) + " 2>&1"  # its one-line error comes back on stdout


def plan_convert(cluster: Cluster, spec: ConvertSpec) -> list[tuple[Node, str]]:
    """(node, command) for every node of the cluster, workers and reducers alike: conversion is CPU work."""
    return [(node, convert_command(cluster, spec, node, i, len(cluster.nodes))) for i, node in enumerate(cluster.nodes)]


def convert_on_cluster(cluster: Cluster, spec: ConvertSpec) -> dict:
    """Run the conversion on every node in parallel (output relayed, prefixed by node), merge, and return the
    manifest; LaunchError naming the nodes that failed."""
    steps = plan_convert(cluster, spec)

    def run_one(step: tuple[Node, str]) -> str | None:
        node, command = step
        try:
            code, _ = remote.stream(cluster, node, command, pty=False)
        except LaunchError as e:
            return f"{node.name} ({e})"
        return None if code == 0 else f"{node.name} (exit {code})"

    with ThreadPoolExecutor(len(steps)) as pool:
        failed = [f for f in pool.map(run_one, steps) if f]
    if failed:
        raise LaunchError(f"conversion failed on {', '.join(failed)} (output above); the same command resumes, "
                          f"keeping every finished shard")
    first = cluster.nodes[0]
    code, out = remote.check(cluster, first, merge_command(cluster, spec, len(steps)))
    if code != 0:
        last = (out.strip().splitlines() or [f"exit {code}"])[-1].removeprefix("error: ")
        raise LaunchError(f"merging the node manifests on {first.name} failed: {last}")
    code, text = remote.check(cluster, first, f"cat {shlex.quote(spec.out)}/manifest.json")
    if code != 0:
        raise LaunchError(f"no manifest.json in {spec.out} on {first.name} after merging")
    return json.loads(text)
