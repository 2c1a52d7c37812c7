"""The reducer tier (training/reducer.py): pure helpers, then real worker and reducer processes under one MPMD
`mpirun` on loopback (no sshd): the reduced gradients against an allreduce, the trainer with `--engine reducer`
against DDP, and a reducer that dies.

Run as a script, this file is the worker program of those runs (see `worker_main`).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
if __name__ == "__main__":  # the worker program, started by mpirun
    sys.path.insert(0, str(ROOT))

from training.reducer import buckets, node_groups, nodes_of, shard_bounds  # noqa: E402

# Parameter shapes with awkward sizes: 1-element tensors, primes, one larger than a small bucket.
SHAPES = [(7, 3), (5,), (1,), (13, 11), (2, 3, 5), (97,), (1, 1), (31, 17), (3,)]


# ---------------------------------------------------------------------------------------------- pure helpers

@pytest.mark.parametrize("n,k", [(0, 1), (0, 3), (1, 4), (10, 3), (10, 10), (11, 4), (100, 7), (5, 1)])
def test_shard_bounds_cover_the_bucket_contiguously_and_evenly(n, k):
    bounds = shard_bounds(n, k)
    assert len(bounds) == k
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:], strict=False))
    sizes = [stop - start for start, stop in bounds]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_shard_bounds_uneven_example_and_bad_input():
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    with pytest.raises(ValueError):
        shard_bounds(4, 0)


def test_buckets_run_in_reverse_parameter_order_and_close_at_the_size():
    numels = [10, 20, 30, 40, 1000, 5]
    # 4-byte elements, 100-byte buckets: [5, 1000] closes at once (4020 B), then 40 (160 B) and 30 (120 B) alone,
    # then 20 + 10 (80 B, then 120 B).
    assert buckets(numels, 4, 100) == [[5, 4], [3], [2], [1, 0]]
    assert buckets(numels, 4, 10**9) == [[5, 4, 3, 2, 1, 0]]
    assert buckets(numels, 2, 1) == [[5], [4], [3], [2], [1], [0]]
    flat = sorted(i for b in buckets(numels, 4, 64) for i in b)
    assert flat == list(range(len(numels)))


def test_node_groups_put_the_leader_first():
    assert node_groups(["a", "a", "b", "a", "c"]) == [[0, 1, 3], [2], [4]]


def test_nodes_follow_openmpi_local_ranks():
    assert nodes_of([0, 1, 2, 0, 1, 2]) == ["node0"] * 3 + ["node1"] * 3  # 2 nodes of 3 slots
    assert nodes_of([0, 0]) == ["node0", "node1"]                         # the local cluster: 1 slot each
    assert nodes_of([0, 1, 2, 3]) == ["node0"] * 4                        # one machine, mpirun without sshd


# ---------------------------------------------------------------------------------------------- mpirun

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


MPI_FLAGS = ["--oversubscribe", "--bind-to", "none", "--mca", "pml", "ob1", "--mca", "btl", "self,tcp",
             "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]
MPI_ENV = ["-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS=1", "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
           "-x", "GLOO_SOCKET_IFNAME=lo"]


def mpmd(workers: list[str], reducers: list[str], w: int, k: int) -> list[str]:
    """One mpirun: W copies of `workers`, then K of `reducers` (OpenMPI's colon syntax)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    return ["mpirun", *root, *MPI_FLAGS, "-np", str(w), *MPI_ENV, *workers,
            ":", "-np", str(k), *MPI_ENV, *reducers]


def run_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def reducer_argv(w: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "training.reducer", "--workers", str(w), *extra]


def rank_grads(rank: int, step: int, micro: int) -> list[torch.Tensor]:
    """The gradient each worker produces: different per rank, step and micro-batch, values in [-1, 1]."""
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return [torch.rand(s, generator=g) * 2 - 1 for s in SHAPES]


def worker_main() -> None:
    """One worker of the matrix: backward produces rank_grads, the engine reduces; writes what it got."""
    import torch.distributed as dist

    from training.reducer import ReducerEngine

    p = argparse.ArgumentParser()
    p.add_argument("--reducers", type=int, required=True)
    p.add_argument("--per-node", type=int, default=1)
    p.add_argument("--bucket-bytes", type=int, required=True)
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    engine = ReducerEngine(args.reducers, bucket_bytes=args.bucket_bytes, node=f"n{rank // args.per_node}",
                           timeout_s=60)
    params = [torch.nn.Parameter(torch.zeros(s)) for s in SHAPES]
    engine.prepare(torch.nn.ParameterList(params), None, fp16_allreduce=args.fp16, backward_passes_per_step=2)
    result = {"rank": rank, "local_rank": engine.local_rank, "local_size": engine.local_size,
              "size": engine.size, "buckets": len(engine.plan), "steps": []}
    for step in range(args.steps):
        for p_ in params:
            p_.grad = None
        for micro in range(2):  # two micro-batches: the first only accumulates
            grads = rank_grads(rank, step, micro)
            loss = sum((p_ * g).sum() for p_, g in zip(params, grads, strict=True))
            with engine.accumulate(None) if micro == 0 else _nothing():
                loss.backward()
        # This rank's own gradients (the sum of its micro-batches' rank_grads), taken from the source: the
        # engine's comm thread may already be writing reduced buckets into .grad while backward runs on.
        local = [a + b for a, b in zip(rank_grads(rank, step, 0), rank_grads(rank, step, 1), strict=True)]
        engine.finish()
        # The same local gradients through gloo's allreduce over the workers, for comparison.
        ring = [engine.allreduce(t, "mean", name="check") for t in local]
        result["steps"].append({"reduced": [p_.grad.tolist() for p_ in params], "allreduce": [t.tolist() for t in ring],
                                "sent": engine.bytes_sent, "received": engine.bytes_received})
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier(group=engine.world.worker_group)
    engine.shutdown()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_matrix(tmp_path: Path, w: int, k: int, per_node: int, bucket_bytes: int, fp16: bool,
               reducer_extra: tuple[str, ...] = (), timeout: float = 120) -> subprocess.CompletedProcess:
    workers = [sys.executable, str(Path(__file__).resolve()), "--reducers", str(k), "--per-node", str(per_node),
               "--bucket-bytes", str(bucket_bytes), "--out", str(tmp_path)] + (["--fp16"] if fp16 else [])
    return subprocess.run(mpmd(workers, reducer_argv(w, "--timeout-s", "60", *reducer_extra), w, k),
                          capture_output=True, text=True, env=run_env(), timeout=timeout, cwd=ROOT)


# W workers, K reducers, workers per node, bucket bytes, fp16 on the wire.
MATRIX = [
    (2, 1, 1, 10**6, False),    # the smallest tier; one bucket
    (3, 2, 1, 64, False),       # uneven shards, many buckets
    (4, 3, 2, 200, False),      # two nodes of two workers: intra-node reduce, then the leaders
    (3, 4, 3, 128, True),       # one node of three, more reducers than some shards have elements; fp16
    (4, 4, 1, 10**6, True),     # the bench's shape; fp16
]


@pytest.mark.mpi
@pytest.mark.parametrize("w,k,per_node,bucket_bytes,fp16", MATRIX)
def test_reduced_gradients_equal_the_allreduce_mean(tmp_path, w, k, per_node, bucket_bytes, fp16):
    proc = run_matrix(tmp_path, w, k, per_node, bucket_bytes, fp16)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(w)]
    assert [r["size"] for r in results] == [w] * w
    assert [(r["local_rank"], r["local_size"]) for r in results] == \
        [(r % per_node, min(per_node, w - r // per_node * per_node)) for r in range(w)]
    assert results[0]["buckets"] > 1 if bucket_bytes < 1000 else results[0]["buckets"] == 1
    atol, rtol = (2e-3, 1e-2) if fp16 else (1e-6, 1e-5)
    total_bytes = sum(torch.Size(s).numel() for s in SHAPES) * (2 if fp16 else 4)
    for step in range(2):
        # The exact mean, in float64 from the same seeds, of both micro-batches' gradients of every rank.
        exact = [sum(rank_grads(r, step, 0)[i].double() + rank_grads(r, step, 1)[i].double() for r in range(w)) / w
                 for i in range(len(SHAPES))]
        for res in results:
            reduced = [torch.tensor(t) for t in res["steps"][step]["reduced"]]
            ring = [torch.tensor(t) for t in res["steps"][step]["allreduce"]]
            for i, shape in enumerate(SHAPES):
                assert reduced[i].shape == torch.Size(shape)
                assert torch.allclose(reduced[i].double(), exact[i], atol=atol, rtol=rtol), (res["rank"], i)
                assert torch.allclose(reduced[i], ring[i], atol=atol, rtol=rtol), (res["rank"], i)
            # Every worker holds the same bytes: the reducers answered all leaders alike.
            assert res["steps"][step]["reduced"] == results[0]["steps"][step]["reduced"]
        # Node leaders send and receive the gradient once per step; other workers talk to no reducer.
        for res in results:
            leader = res["rank"] % per_node == 0
            assert res["steps"][step]["sent"] == (step + 1) * total_bytes * leader
            assert res["steps"][step]["received"] == res["steps"][step]["sent"]


@pytest.mark.mpi
def test_a_reducer_that_dies_stops_the_job_naming_it(tmp_path):
    started = time.monotonic()
    proc = run_matrix(tmp_path, 2, 2, 1, 64, False, reducer_extra=("--die-after-steps", "1"), timeout=100)
    assert proc.returncode != 0
    assert time.monotonic() - started < 60, "the workers waited for their timeout instead of noticing the death"
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: reducer rank")]
    if lines:  # a worker noticed first and named the reducer itself
        assert all(ln.endswith(")") for ln in lines), proc.stderr[-3000:]
        assert any(f"reducer rank {r} on {socket.gethostname()} stopped answering" in ln
                   for ln in lines for r in (2, 3))
    else:  # mpirun saw the reducer die and stopped the job first: the launcher's diagnosis names it from that
        from launcher.cluster import Node
        from launcher.plans import faults

        nodes = [Node(name=name, address="127.0.0.1", port=2200 + i, role=role, slots=1, cpus=1, workdir="/w")
                 for i, (name, role) in enumerate([("node0", "worker"), ("node1", "worker"),
                                                   ("reducer0", "reducer"), ("reducer1", "reducer")])]
        why = faults.diagnose((proc.stdout + proc.stderr).splitlines(), nodes) or ""
        assert why.startswith(("rank 2 on reducer0 was killed by signal 9", "rank 3 on reducer1 was killed by "
                               "signal 9")), proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert not list(tmp_path.glob("rank*.json")), "a step finished without the dead reducer"


if __name__ == "__main__":
    worker_main()
