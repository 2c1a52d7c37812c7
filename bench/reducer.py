"""Reducer tier against a ring allreduce: bytes each worker sends and receives per step, and step times.

N worker processes and K reducer processes on this machine, under one MPMD `mpirun` on loopback (each worker its
own node, so every worker is a node leader, as one GPU node is). Each step reduces the same gradients twice: through
the reducer tier (training/reducer.py's engine) and through a ring allreduce written here from point-to-point sends
(reduce-scatter then allgather, 2(n-1) hops), whose sends are counted the same way. Prints a table and `ratio=` last:
per-worker bytes sent, ring / reducer tier; the ideal is 2(n-1)/n, 1.5 at 4 workers.

The times are one-machine figures: every process shares this machine's cores and loopback, so they say nothing
about C5n reducers on a 100 Gbps network; the byte counts are what carries over.

    .venv/bin/python bench/reducer.py [--workers 4] [--reducers 4] [--numel 4000000] [--steps 5] [--fp16]
    .venv/bin/python bench/reducer.py --model bert-large --fp16 ...   # BERT-large's own 335M-element gradient

`--model bert-tiny|bert-base|bert-large`: the gradient is that model's (examples/bert/bert.py), one tensor per
parameter in its order, instead of 8 tensors of `--numel` elements in all.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def ring_allreduce(flat, n: int, rank: int):
    """Sum of `flat` over ranks 0..n-1 (the workers) in place; returns the bytes this rank sent."""
    import torch.distributed as dist

    from training.reducer import shard_bounds

    chunks = [flat[a:b] for a, b in shard_bounds(flat.numel(), n)]
    right, left, sent = (rank + 1) % n, (rank - 1) % n, 0
    for s in range(n - 1):  # reduce-scatter: after n-1 hops rank r holds the sum of chunk r+1
        out, into = chunks[(rank - s) % n], chunks[(rank - s - 1) % n]
        buf = into.clone()
        works = [dist.isend(out.clone(), dst=right, tag=s), dist.irecv(buf, src=left, tag=s)]
        for w in works:
            w.wait()
        into += buf
        sent += out.numel() * out.element_size()
    for s in range(n - 1):  # allgather: pass the summed chunks around
        out, into = chunks[(rank + 1 - s) % n], chunks[(rank - s) % n]
        works = [dist.isend(out.clone(), dst=right, tag=n + s), dist.irecv(into, src=left, tag=n + s)]
        for w in works:
            w.wait()
        sent += out.numel() * out.element_size()
    return sent


def model_numels(model: str) -> list[int]:
    """The element count of each parameter of examples/bert's model `bert-SIZE`, built on the meta device (no
    memory); [] for no model."""
    if not model:
        return []
    import torch

    sys.path.insert(0, str(ROOT / "examples" / "bert"))
    from bert import SIZES, BertMLM

    with torch.device("meta"):
        net = BertMLM(SIZES[model.removeprefix("bert-")])
    return [p.numel() for p in net.parameters()]


def worker(args) -> None:
    import torch
    import torch.distributed as dist

    from training.reducer import ReducerEngine

    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    torch.set_num_threads(1)
    engine = ReducerEngine(args.reducers, node=f"node{rank}", bucket_bytes=args.bucket_mb * 2**20)
    sizes = model_numels(args.model) or [args.numel // 8] * 7 + [args.numel - 7 * (args.numel // 8)]  # 8 tensors
    params = [torch.nn.Parameter(torch.empty(s)) for s in sizes]  # never read: only the gradients are
    engine.setup(params, fp16_allreduce=args.fp16)
    wire = torch.float16 if args.fp16 else torch.float32
    rows = []
    for step in range(args.steps + 1):  # step 0 warms up connections and buffers
        g = torch.Generator().manual_seed(rank * 100 + step)
        for p in params:
            p.grad = None  # freed before its successor is made
            p.grad = torch.rand(p.shape, generator=g)
        # What the ring reduces: this rank's gradient as it goes on the wire (before the tier overwrites .grad).
        flat = torch.cat([p.grad for p in params]).div_(engine.size).to(wire)
        sent0, recv0 = engine.bytes_sent, engine.bytes_received
        dist.barrier(group=engine.world.worker_group)
        t = time.perf_counter()
        engine.finish()
        tier_s = time.perf_counter() - t
        tier_sent, tier_recv = engine.bytes_sent - sent0, engine.bytes_received - recv0

        dist.barrier(group=engine.world.worker_group)
        t = time.perf_counter()
        ring_sent = ring_allreduce(flat, engine.size, rank)
        ring_s = time.perf_counter() - t
        # The two reductions agree (fp16: the ring adds in fp16, the reducers in fp32); one parameter at a time,
        # so a BERT-large gradient needs no whole-size temporaries.
        worst, offset = 0.0, 0
        for p in params:
            ring = flat[offset:offset + p.numel()].float().view(p.shape)
            offset += p.numel()
            worst = max(worst, float((ring - p.grad).abs().max()) if p.numel() else 0.0)
            assert torch.allclose(ring, p.grad, rtol=1e-2 if args.fp16 else 1e-5, atol=1e-3 if args.fp16
                                  else 1e-6), "the ring and the reducer tier disagree"
        if step:
            rows.append({"max_abs_diff": worst, "numel": flat.numel(),
                         "tier_s": tier_s, "tier_sent": tier_sent, "tier_recv": tier_recv, "ring_s": ring_s,
                         "ring_sent": ring_sent, "ring_recv": ring_sent})
    gathered = [None] * engine.size
    dist.all_gather_object(gathered, rows, group=engine.world.worker_group)
    if rank == 0:
        Path(args.out).write_text(json.dumps(gathered))
    engine.shutdown()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--reducers", type=int, default=4)
    p.add_argument("--numel", type=int, default=4_000_000, help="gradient elements per worker (fp32: 4 bytes each)")
    p.add_argument("--model", choices=["bert-tiny", "bert-base", "bert-large"], default="",
                   help="the gradient of this model's parameters instead of --numel elements")
    p.add_argument("--bucket-mb", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--fp16", action="store_true", help="fp16 on the wire (both ways of reducing)")
    p.add_argument("--role", default="main", help=argparse.SUPPRESS)
    p.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.role == "worker":
        return worker(args)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = Path(f"/tmp/scaletrain-bench-reducer-{os.getpid()}.json")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    xs = ["-x", "PYTHONPATH", "-x", "MASTER_ADDR", "-x", "MASTER_PORT", "-x", "OMP_NUM_THREADS=1",
          "-x", "GLOO_SOCKET_IFNAME=lo"]
    me = [sys.executable, str(Path(__file__).resolve()), "--role", "worker", "--out", str(out),
          "--reducers", str(args.reducers), "--numel", str(args.numel), "--bucket-mb", str(args.bucket_mb),
          "--steps", str(args.steps)] + (["--fp16"] if args.fp16 else []) + (["--model", args.model] if args.model
                                                                               else [])
    argv = ["mpirun", *(["--allow-run-as-root"] if os.geteuid() == 0 else []), "--oversubscribe", "--bind-to",
            "none", "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include",
            "lo", "-np", str(args.workers), *xs, *me, ":", "-np", str(args.reducers), *xs,
            sys.executable, "-m", "training.reducer", "--workers", str(args.workers), "--threads", "1"]
    subprocess.run(argv, check=True, env=env, cwd=ROOT)
    per_rank = json.loads(out.read_text())
    out.unlink()

    n, elem = args.workers, 2 if args.fp16 else 4
    numel = per_rank[0][0]["numel"]
    grad_mb = numel * elem / 1e6
    what = f"{args.model}'s " if args.model else ""
    print(f"reducer tier vs ring allreduce: {n} workers, {args.reducers} reducers, {what}{numel:,}-element "
          f"{grad_mb:.1f} MB gradient "
          f"({'fp16' if args.fp16 else 'fp32'}), {args.steps} steps; one machine: {os.cpu_count()} cores, "
          f"{platform.processor() or platform.machine()}")
    print(f"{'':14}{'sent MB/step':>14}{'recv MB/step':>14}{'step s (median)':>17}")
    for name in ("ring", "tier"):
        sent = statistics.mean(r[f"{name}_sent"] for rows in per_rank for r in rows) / 1e6
        recv = statistics.mean(r[f"{name}_recv"] for rows in per_rank for r in rows) / 1e6
        step = statistics.median(max(rows[i][f"{name}_s"] for rows in per_rank) for i in range(args.steps))
        label = "ring allreduce" if name == "ring" else "reducer tier"
        print(f"{label:14}{sent:14.2f}{recv:14.2f}{step:17.3f}")
    ideal = 2 * (n - 1) / n
    print(f"ideal volume ratio 2(n-1)/n = {ideal:.3f}; step times are one-machine figures (shared cores, loopback)")
    worst = max(r["max_abs_diff"] for rows in per_rank for r in rows)
    print(f"tier vs ring: largest difference of any gradient element {worst:.3g} (ring adds in the wire's type, "
          f"the reducers in fp32)")
    ring_total = sum(r["ring_sent"] for rows in per_rank for r in rows)
    ratio = ring_total / sum(r["tier_sent"] for rows in per_rank for r in rows)
    print(f"ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
