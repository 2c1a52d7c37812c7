"""The node check before a job's first step (launcher/plans/nodecheck.py decides): the ring of pairs measured over
the allocation, one task per node started with srun, and a node that falls short drained.

``refuse_short`` runs on the job's step; ``python -m launcher.execute.nodecheck --gpus N`` is one GPU node's
all_reduce_perf across its own GPUs (first, on GPU types with NVLink); ``python -m launcher.execute.nodecheck
--hosts ... --addresses ...`` is one node's part of the ring: it listens for its predecessor's bytes and counts
them, and sends its own to its successor for PAIR_SECONDS or PAIR_BYTES, printing one JSON line with what the
successor counted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.plans import nodecheck

PORT = 29417
CHUNK = 256 * 1024
# A small send buffer: after the time is up, what is still queued drains in well under a second even on a link shaped
# to a few Mbit/s (the kernel's default grows it to 4 MiB: 6 s at 5 Mbit/s).
SEND_BUFFER = 128 * 1024
SRUN_TIMEOUT_S = 30        # srun's start on every node, the pairs' PAIR_SECONDS, the last bytes' drain
CONNECT_WITHIN_S = 10.0    # the successor's task may start later than this one
GPU_TIMEOUT_S = 90         # all_reduce_perf on a node: CUDA contexts and NCCL's init on every GPU, 25 messages
HEALTH_CHECK = "/etc/slurm/healthcheck.sh"   # plans/slurm.HEALTH_CHECK: the node's own statement of its kind


def _receive(server: socket.socket, deadline: float) -> None:
    server.settimeout(max(1.0, deadline - time.monotonic()))
    conn, _ = server.accept()
    with conn:
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        count = 0
        while chunk := conn.recv(CHUNK):
            count += len(chunk)
        conn.sendall(struct.pack("!Q", count))


def _send(address: str, port: int, seconds: float, limit: int, deadline: float) -> tuple[int, float]:
    while True:
        try:
            conn = socket.create_connection((address, port), timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    with conn:
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
        conn.settimeout(max(1.0, deadline - time.monotonic()))
        buf = memoryview(bytes(CHUNK))
        start = time.monotonic()
        sent = 0
        while sent < limit and time.monotonic() - start < seconds:
            sent += conn.send(buf[:min(CHUNK, limit - sent)])
        conn.shutdown(socket.SHUT_WR)
        got = b""
        while len(got) < 8 and (more := conn.recv(8 - len(got))):
            got += more
        return struct.unpack("!Q", got)[0], time.monotonic() - start


def measure(argv: list[str] | None = None) -> int:
    """One node's part of the ring (run by srun, one task per node)."""
    p = argparse.ArgumentParser(prog="python -m launcher.execute.nodecheck")
    p.add_argument("--hosts", required=True)
    p.add_argument("--addresses", required=True)
    p.add_argument("--port", type=int, default=PORT)
    p.add_argument("--seconds", type=float, default=nodecheck.PAIR_SECONDS)
    p.add_argument("--bytes", type=int, default=nodecheck.PAIR_BYTES)
    a = p.parse_args(argv)
    hosts, addresses = a.hosts.split(","), a.addresses.split(",")
    me = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    successor = dict(nodecheck.ring(hosts)).get(me)
    if successor is None:
        print(json.dumps({"node": me, "error": "not in the ring"}), flush=True)
        return 1
    deadline = time.monotonic() + CONNECT_WITHIN_S + a.seconds + 5
    server = socket.create_server(("", a.port), reuse_port=False)
    failed: list[str] = []

    def receive() -> None:
        try:
            _receive(server, deadline)
        except OSError as e:
            failed.append(str(e))
    # With two nodes each is the other's successor and predecessor: one listener, one sender, as with more.
    receiver = threading.Thread(target=receive, daemon=True)
    receiver.start()
    try:
        count, seconds = _send(addresses[hosts.index(successor)], a.port, a.seconds, a.bytes, deadline)
        print(json.dumps({"sender": me, "receiver": successor, "bytes": count, "seconds": seconds}), flush=True)
    except (OSError, struct.error) as e:
        print(json.dumps({"sender": me, "receiver": successor, "error": str(e)}), flush=True)
    receiver.join(max(0.0, deadline - time.monotonic()))
    server.close()
    return 0


def singleton_env(env: dict[str, str]) -> dict[str, str]:
    """The environment in which an MPI program started as a plain child of an srun task initialises as a singleton.
    all_reduce_perf is built with MPI=1 (ami/components/nccl.sh, for the doctor's mpirun across nodes), and Open MPI
    4.1 takes a process that sees SLURM_NODELIST and SLURM_STEP_ID for one srun launched directly (ess pmi:
    orte/mca/schizo/slurm/schizo_slurm.c, check_launch_environment), which needs Slurm's PMI or PMIx; the cluster has
    neither (MpiDefault=none, Slurm without PMIx), so MPI_Init failed on every node and the check measured nothing.
    A build without Slurm support refuses SLURM_NODELIST alone ("direct launched using srun, but OMPI was not built
    with SLURM support"; Debian's 4.1.4, measured here). With no SLURM_, PMI_ or PMIX_ variable it is a singleton:
    one process, its own runtime, all the node's GPUs in it (-g)."""
    return {k: v for k, v in env.items() if not k.startswith(("SLURM_", "PMI_", "PMIX_"))}


def measure_gpus(gpus: int) -> int:
    """One GPU node's part (run by srun, one task per node): all_reduce_perf across its own GPUs, one JSON line."""
    from ami import paths

    me = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    argv = nodecheck.gpu_command(f"{paths.NCCL_TESTS}/all_reduce_perf", gpus)
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=GPU_TIMEOUT_S,
                              env=singleton_env(dict(os.environ)))
        busbw, why = nodecheck.gpu_figure(proc.returncode, proc.stdout + proc.stderr)
    except (OSError, subprocess.TimeoutExpired) as e:
        busbw, why = None, f"{argv[0]}: {type(e).__name__}"
    print(json.dumps({"node": me, "busbw": busbw, "why": why}), flush=True)
    return 0


def _types_here() -> tuple[str | None, str | None]:
    try:
        return nodecheck.node_kind(Path(HEALTH_CHECK).read_text())
    except OSError:
        return None, None


def expected_here() -> nodecheck.Expectation | None:
    """What a pair should reach on this cluster's nodes, from the node's health check script and the catalog."""
    backend, instance_type = _types_here()
    gbps = None
    if backend == "aws" and instance_type:
        from infra import catalog

        with contextlib.suppress(KeyError, ValueError):
            gbps = catalog.get(instance_type).network_gbps
    return nodecheck.expectation(backend, gbps, instance_type)


def gpus_expected_here() -> nodecheck.GpuExpectation | None:
    """What all_reduce_perf across one node's GPUs should reach on this cluster's nodes (AWS GPU types only)."""
    backend, instance_type = _types_here()
    if backend != "aws" or not instance_type:
        return None
    from infra import catalog

    try:
        t = catalog.get(instance_type)
    except (KeyError, ValueError):
        return None
    return nodecheck.gpu_expectation(instance_type, t.gpus, t.gpu_interconnect_gbps)


def on_each_node(hosts: list[str], job_id: str, args: list[str], timeout_s: float) -> list[dict]:
    """This module run once on every host of the allocation (`python -m launcher.execute.nodecheck ARGS`, one srun
    task per node), and the JSON lines the tasks printed; what a task printed before srun's time was up counts."""
    argv = ["srun", "--overlap", f"--jobid={job_id}", f"-N{len(hosts)}", f"-n{len(hosts)}", "--ntasks-per-node=1",
            f"--nodelist={','.join(hosts)}", sys.executable, "-m", "launcher.execute.nodecheck", *args]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        out = e.stdout.decode() if isinstance(e, subprocess.TimeoutExpired) and isinstance(e.stdout, bytes) else ""
    found = []
    for line in out.splitlines():
        with contextlib.suppress(ValueError):
            d = json.loads(line)
            if isinstance(d, dict):
                found.append(d)
    return found


def measure_gpu_nodes(hosts: list[str], gpus: int, job_id: str) -> dict[str, tuple[float | None, str]]:
    figures: dict[str, tuple[float | None, str]] = {}
    for d in on_each_node(hosts, job_id, ["--gpus", str(gpus)], GPU_TIMEOUT_S + SRUN_TIMEOUT_S):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            figures[str(d["node"])] = (float(d["busbw"]) if d["busbw"] is not None else None, str(d["why"]))
    return figures


def measure_ring(hosts: list[str], addresses: dict[str, str], job_id: str) -> list[nodecheck.Pair]:
    args = ["--hosts", ",".join(hosts), "--addresses", ",".join(addresses.get(h, h) for h in hosts)]
    pairs = []
    for d in on_each_node(hosts, job_id, args, SRUN_TIMEOUT_S):
        with contextlib.suppress(ValueError, KeyError, TypeError):
            if "error" not in d:
                pairs.append(nodecheck.Pair(d["sender"], d["receiver"], int(d["bytes"]), float(d["seconds"])))
    return pairs


def refuse_short(hosts: list[str], addresses: dict[str, str], job_id: str,
                 say: Callable[[str], None]) -> list:
    """Measure, decide, say, and drain every node that falls short; the nodes drained (nodecheck.Short for the
    ring, nodecheck.GpuShort for a node's GPUs; one per node)."""
    started = time.monotonic()
    shorts: list = []
    gpus = gpus_expected_here()
    if gpus is not None:  # first, alone: the ring's TCP flows would share the node's CPUs with NCCL's start
        verdict = nodecheck.decide_gpus(hosts, measure_gpu_nodes(hosts, gpus.gpus, job_id), gpus)
        for line in verdict.lines:
            say(line)
        shorts += verdict.short
    expected = expected_here()
    if expected is None or len(hosts) < 2:
        say("node check: ring skipped (" + ("one node" if len(hosts) < 2 else f"no node type in {HEALTH_CHECK}")
            + ")")
    else:
        verdict = nodecheck.decide(hosts, measure_ring(hosts, addresses, job_id), expected)
        for line in verdict.lines:
            say(line)
        shorts += [s for s in verdict.short if s.node not in {g.node for g in shorts}]
    say(f"node check: {time.monotonic() - started:.1f} s")
    for short in shorts:
        # scontrol(1): "State=DRAIN ... Reason=<reason>" (https://slurm.schedmd.com/scontrol.html#OPT_Reason)
        subprocess.run(["scontrol", "update", f"NodeName={short.node}", "State=DRAIN", f"Reason={short.reason()}"],
                       capture_output=True)
    return shorts


if __name__ == "__main__":
    if sys.argv[1:2] == ["--gpus"] and len(sys.argv) == 3 and sys.argv[2].isdigit():
        sys.exit(measure_gpus(int(sys.argv[2])))
    sys.exit(measure())
