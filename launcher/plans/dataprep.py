"""`launch data convert --cluster`: ImageNet to shards on every node of a cluster at once.

Every node reads SRC and writes to --out on shared storage (FSx, BeeGFS; the local cluster's nodes share the
machine's filesystem). Each computes the same plan (training.convert), and node i of N writes shards i, i+N, ...
and its own node manifest, with one worker process per core; when all have finished, the first node merges the
node manifests into manifest.json. Killed or failed part-way, the same command resumes: every node keeps the
shards it verifies and writes the rest.

The command lines are a pure function of the cluster and the spec; launcher.execute.dataprep runs them.
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict

from launcher.cluster import Cluster, Node


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
    replace: bool = False  # --out may hold another conversion, which the nodes then delete


# The conversion runs on a pty, so that hanging up (Ctrl-C here) ends it and its workers there by SIGHUP; a pty would
# also give it rich's progress bars, which relayed line by line are noise: rich takes TTY_COMPATIBLE=0 as "not a
# terminal" (https://rich.readthedocs.io/en/latest/console.html#environment-variables), and the converter then
# prints a plain progress line every 30 s.
PLAIN_OUTPUT = "TTY_COMPATIBLE=0"


def convert_command(cluster: Cluster, spec: ConvertSpec, node: Node, index: int, count: int) -> str:
    """The shell line node `index` of `count` runs."""
    argv = [cluster.python, "-m", "launcher", "data", "convert", spec.src, "--out", spec.out,
            "--shard-size", str(spec.shard_size), "--seed", str(spec.seed), "--quality", str(spec.quality)]
    if spec.resize is not None:
        argv += ["--resize", str(spec.resize)]
    argv += ["--workers", str(spec.workers or node.cpus), "--node-index", str(index), "--node-count", str(count)]
    argv += ["--replace"] if spec.replace else []
    return f"{PLAIN_OUTPUT} {shlex.join(argv)} 2>&1"  # stderr too comes back prefixed by the node


def merge_command(cluster: Cluster, spec: ConvertSpec, count: int) -> str:
    argv = [cluster.python, "-m", "launcher", "data", "convert", "--out", spec.out, "--node-count", str(count),
            "--merge"]
    return shlex.join(argv) + " 2>&1"  # its one-line error comes back on stdout


def plan_convert(cluster: Cluster, spec: ConvertSpec) -> list[tuple[Node, str]]:
    """(node, command) for every node of the cluster, workers and reducers alike: conversion is CPU work."""
    return [(node, convert_command(cluster, spec, node, i, len(cluster.nodes))) for i, node in enumerate(cluster.nodes)]
