"""`launch train`: plan on the launcher, execute on the first node, report, and tear down when asked.

Backend-agnostic: every step goes through the Cluster and launcher.execute.remote, so the same code drives the
local cluster and an AWS one.
"""

from __future__ import annotations

import contextlib
import json
import math
import queue
import shlex
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.execute import remote
from launcher.plans import efa, job, watchdog

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
    stopped: str | None = None  # why the watchdog stopped the job, when it did
    silent: tuple[str, ...] = ()  # the nodes it gave up on: nothing more is asked of them


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
        # --replace: these shards are the run's own, made from its own sample; another shard size (other ranks)
        # makes them again instead of being refused as another conversion.
        ("converting sample data", f"{launch} data convert {shlex.quote(raw)} --out {shlex.quote(shards)} "
                                   f"--shard-size {size} --replace"),
    ):
        print(f"[{node.name}] {what}", flush=True)
        code, _ = remote.stream(cluster, node, cmd, pty=False)
        if code != 0:
            raise LaunchError(f"{what} failed on {node.name} (exit {code})")
    return shards


# After SIGTERM, mpirun's time to take its ranks down before what is left of its process tree gets SIGKILL
# (with a node hung, mpirun may wait for that node's daemon for ever).
KILL_GRACE_S = 10.0


def stop_job_script(pidfile: str) -> str:
    """Shell that ends the mpirun whose pid is in `pidfile`: SIGTERM, then after KILL_GRACE_S, SIGKILL to it and
    every process it started on this node (local ranks, its ssh sessions to the other nodes)."""
    ticks = int(KILL_GRACE_S / 0.2)
    return (f"p=$(cat {shlex.quote(pidfile)} 2>/dev/null) && kill -0 \"$p\" 2>/dev/null || exit 0; "
            'tree() { for c in $(pgrep -P "$1"); do echo "$c"; tree "$c"; done; }; '
            'all="$p $(tree "$p")"; kill -TERM "$p"; '
            f'i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt {ticks} ]; do sleep 0.2; i=$((i+1)); done; '
            "kill -KILL $all 2>/dev/null; exit 0")


class Watchdog:
    """Probes every node of a running job and stops the job when watchdog.verdict says so.

    Each probe runs `true` in a daemon thread under remote's bounded timeouts; no reply within
    policy.answer_s is a miss, and a node whose last probe is still out is not probed again until it ends.
    Stopping: SIGTERM then SIGKILL to mpirun over a separate connection, then the stream is abandoned if it
    has not ended (the first node may be the hung one).
    """

    def __init__(self, cluster: Cluster, first: Node, nodes: list[Node], policy: watchdog.Watch, pidfile: str,
                 clock: Callable[[], float] = time.monotonic):
        self.cluster, self.first, self.nodes, self.policy, self.pidfile = cluster, first, nodes, policy, pidfile
        self.clock = clock
        self.reason: str | None = None
        self.silent: tuple[str, ...] = ()  # the nodes that missed policy.misses probes in a row, when it stopped
        self.hangup = remote.Hangup()
        self.last_output_at = clock()
        self._done = threading.Event()
        self._answers: queue.Queue[tuple[str, float, bool]] = queue.Queue()
        self._probes: dict[str, threading.Thread] = {}
        self._conns: dict[str, remote.Connection] = {}  # node -> the probes' open connection (see _probe)
        self._thread = threading.Thread(target=self._watch, name="watchdog", daemon=True)

    def heard(self, line: str) -> None:
        self.last_output_at = self.clock()

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()
        for t in self._probes.values():  # each ends within remote's timeouts; not left running behind us
            t.join(4 * self.policy.answer_s)
        for conn in list(self._conns.values()):
            with contextlib.suppress(Exception):
                conn.close()
        self._conns.clear()

    def _watch(self) -> None:
        history: list[watchdog.Probe] = []
        next_at = self.clock() + self.policy.interval_s
        while not self._done.wait(max(next_at - self.clock(), 0.0)):
            sent = self.clock()
            next_at = sent + self.policy.interval_s
            answers = self._round(sent)
            if answers is None:
                return
            # Only the last `misses` rounds can decide anything: a long run does not grow the history.
            history = [*history, *(watchdog.Probe(n, sent, ok) for n, ok in answers.items())][
                -self.policy.misses * len(self.nodes):]
            why = watchdog.verdict(history, self.last_output_at, self.clock(), self.policy)
            if why:
                self.silent = tuple(n for n, ps in watchdog.unanswered(history).items()
                                    if len(ps) >= self.policy.misses)
                self._stop(why)
                return

    def _round(self, sent: float) -> dict[str, bool] | None:
        """Each node: did it answer within policy.answer_s. None when the job ended meanwhile."""
        asked = []
        for node in self.nodes:
            t = self._probes.get(node.name)
            if t is None or not t.is_alive():
                t = threading.Thread(target=self._probe, args=(node, sent), name=f"probe {node.name}", daemon=True)
                self._probes[node.name] = t
                t.start()
                asked.append(node.name)
        answered: dict[str, bool] = {}
        deadline = sent + self.policy.answer_s
        while len(answered) < len(asked) and self.clock() < deadline:
            if self._done.is_set():
                return None
            try:
                name, at, ok = self._answers.get(timeout=min(max(deadline - self.clock(), 0.0), 0.5))
            except queue.Empty:
                continue
            if at == sent:  # a late reply to an earlier round says nothing about now
                answered[name] = ok
        return {n.name: answered.get(n.name, False) for n in self.nodes}

    def _probe(self, node: Node, sent: float) -> None:
        # One connection per node, kept while it answers: over SSM a new connection is a new session (an AWS CLI
        # process and a StartSession call) every interval for every node; a channel on a live one is one round trip.
        conn = self._conns.pop(node.name, None)
        try:
            conn = conn or remote.connect(self.cluster, node, timeout_s=self.policy.answer_s)
            ok = conn.run("true", hide=True, warn=True, in_stream=False, timeout=self.policy.answer_s).exited == 0
        except Exception:  # refused, timed out, frozen: a miss either way
            ok = False
        if ok:
            self._conns[node.name] = conn
        elif conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
        self._answers.put((node.name, sent, ok))

    def _stop(self, why: str) -> None:
        self.reason = why
        sys.stdout.write(f"[watchdog] {why}; stopping the job\n")
        sys.stdout.flush()
        # When the first node is the one that does not answer, there is nothing to stop mpirun with there.
        with contextlib.suppress(LaunchError):
            remote.check(self.cluster, self.first, stop_job_script(self.pidfile),
                         timeout_s=self.policy.answer_s + KILL_GRACE_S)
        if not self._done.wait(KILL_GRACE_S):  # mpirun gone, the stream should end by itself
            self.hangup()


def fabric_settings(cluster: Cluster, first: Node) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """launcher.plans.efa's env and MPI settings for a run: the image's versions from its tags, else read on the first
    node (efa.VERSION_PROBE: an AMI copied to another region or account has no tags); what nobody could read counts as
    current software, and a warning says so. GPU workers also keep NCCL's flight recorder
    (launcher/plans/flightrec.py), for a stalled run's summary."""
    from launcher.plans import flightrec

    env, mca = _fabric(cluster, first)
    return env | flightrec.for_cluster(cluster), mca


def _fabric(cluster: Cluster, first: Node) -> tuple[dict[str, str], list[tuple[str, str]]]:
    if not efa.uses_efa(cluster):
        return {}, []
    versions = efa.versions_of(cluster.aws.software if cluster.aws else {})
    if efa.unknown_versions(versions):
        code, text = remote.check(cluster, first, efa.VERSION_PROBE)
        versions = efa.merge(versions, efa.parse_version_probe(text if code == 0 else ""))
        unknown = efa.unknown_versions(versions)
        if unknown:
            print(f"warning: the image has no scaletrain:* tags and {first.name} shows no {' or '.join(unknown)} "
                  "version; using the EFA settings for current software (aws-ofi-nccl >= 1.7, libfabric >= 1.18), "
                  "without FI_PROVIDER=efa NCCL_PROTO=simple, which only aws-ofi-nccl <= 1.5 needs "
                  "(https://github.com/aws/aws-ofi-nccl/blob/master/doc/efa-env-var.md)", file=sys.stderr, flush=True)
        else:
            print(f"[launch] image versions read on {first.name}: aws-ofi-nccl {versions.aws_ofi_nccl}, "
                  f"libfabric {versions.libfabric}", flush=True)
    return efa.for_cluster(cluster, versions)


def train(cluster: Cluster, nodes: list[Node], spec: job.TrainSpec, *, make_data: bool,
          reducers: list[Node] | None = None, watch: watchdog.Watch | None = None) -> RunResult:
    """`reducers`: reducer nodes for the reducer tier (spec.engine 'reducer'); one MPMD mpirun starts both.
    `watch`: when to give up on a node that stops answering or a job that stops printing (see Watchdog)."""
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
    hosts = job.mpmd_hostfile(nodes, reducers) if reducers else job.hostfile(nodes)
    _on_first(cluster, first, f"printf %s {shlex.quote(hosts)} > {shlex.quote(hostfile_path)}",
              "writing the hostfile")
    fabric_env, mca = fabric_settings(cluster, first)  # EFA / NCCL settings on AWS; none on the local cluster
    argv = job.launch_argv(cluster, nodes, reducers or [], spec, hostfile_path, fabric_env=fabric_env, mca=mca)
    tier = f", {len(reducers)} reducer node(s)" if reducers else ""
    print(f"[launch] {len(nodes)} node(s), {sum(n.slots for n in nodes)} rank(s){tier}: {job.command_line(argv)}",
          flush=True)
    pidfile = f"{spec.output}/mpirun.pid"  # the shell execs mpirun: its pid is mpirun's, for the watchdog to stop
    with Watchdog(cluster, first, [*nodes, *(reducers or [])], watch or watchdog.Watch(), pidfile) as dog:
        code, lines = remote.stream(cluster, first, f"echo $$ > {shlex.quote(pidfile)} && exec "
                                    f"{job.command_line(argv)}", on_line=dog.heard, hangup=dog.hangup)
    if dog.reason:  # the first node may be the one that hung: ask it nothing more
        return RunResult(code or 1, spec.output, train_images, None, lines, stopped=dog.reason,
                         silent=dog.silent)

    rc, text = remote.check(cluster, first, f"cat {out}/summary.json 2>/dev/null")
    summary = json.loads(text) if rc == 0 and text.strip() else None
    return RunResult(code, spec.output, train_images, summary, lines)


def local_output(path: str | None, stamp: str) -> str:
    return str(Path(path or f"runs/{stamp}").expanduser().resolve())
