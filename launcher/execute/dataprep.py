"""`launch data convert --cluster`, carried out: launcher.plans.dataprep's command on every node at once over SSH,
then the merge on the first node. Ctrl-C hangs up every node, which ends their conversions.
"""

from __future__ import annotations

import json
import shlex
from concurrent.futures import ThreadPoolExecutor

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.execute import remote
from launcher.plans.dataprep import ConvertSpec, merge_command, plan_convert


def convert_on_cluster(cluster: Cluster, spec: ConvertSpec) -> dict:
    """Run the conversion on every node in parallel (output relayed, prefixed by node), merge, and return the
    manifest; LaunchError naming the nodes that failed."""
    steps = plan_convert(cluster, spec)
    hangups = [remote.Hangup() for _ in steps]

    def run_one(step: tuple[Node, str], hangup: remote.Hangup) -> str | None:
        node, command = step
        try:
            code, _ = remote.stream(cluster, node, command, pty=True, hangup=hangup)
        except LaunchError as e:
            return f"{node.name} ({e})"
        return None if code == 0 else f"{node.name} (exit {code})"

    pool = ThreadPoolExecutor(len(steps))
    try:
        failed = [f for f in pool.map(run_one, steps, hangups) if f]
    except KeyboardInterrupt:
        # Ctrl-C: hang up every node (their pty's SIGHUP ends each conversion and its workers, which leaves what
        # the same command resumes) instead of waiting for every node to finish converting.
        for hangup in hangups:
            hangup()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
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
