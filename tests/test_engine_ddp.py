"""training/engine.py's DDP engine across real processes: 2 and 3 ranks of torch.distributed over gloo (CPU), started
as torchrun starts a user's script (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) and reached through the
user's own API, training.distributed. Each rank holds a different value, 10**rank, so a sum, a mean and a mean with
another divisor (the ranks on a node, the world less one) are told apart: allreduce "mean" is what BatchNorm's
statistics, the logged loss and a user's metrics are averaged with.

torch.distributed.all_reduce with ReduceOp.SUM sums the ranks' tensors in place on every rank; gloo has no AVG
(https://docs.pytorch.org/docs/stable/distributed.html, "Backends": gloo's all_reduce on CPU; ReduceOp.AVG "only
available with the NCCL backend"), so the engine divides by the world size itself."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

RANK_SCRIPT = r"""
import json, sys
import torch
from training import distributed

engine = distributed.init()
rank, size = distributed.rank(), distributed.size()
value = torch.tensor([10.0 ** rank, -(10.0 ** rank)])
count = torch.tensor([rank + 1], dtype=torch.int64)          # validation's counts are integers
out = {
    "engine": distributed.engine_name(), "rank": rank, "size": size, "local_size": distributed.local_size(),
    "mean": distributed.allreduce(value, op="mean").tolist(),
    "sum": distributed.allreduce(value, op="sum").tolist(),
    "count_sum": distributed.allreduce(count, op="sum").tolist(),
    "count_mean": distributed.allreduce(count, op="mean").tolist(),
    "input_after": value.tolist(),                          # the caller's tensor is left as it was
}
distributed.shutdown()
print(json.dumps(out))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(size: int, tmp_path: Path) -> list[dict]:
    """``size`` processes of one torch.distributed world, one per (pretend) node: LOCAL_WORLD_SIZE 1, so a divisor
    of the ranks on a node would show."""
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "HOROVOD_", "SCALETRAIN_", "PMIX"))}
    procs = []
    for rank in range(size):
        env = {**base, "PYTHONPATH": str(ROOT), "RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "NODE_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
        procs.append(subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=180)
            assert p.returncode == 0, err[-3000:]
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return sorted(results, key=lambda r: r["rank"])


@pytest.mark.parametrize("size", [2, 3])
def test_ddp_allreduce_means_and_sums_over_every_rank(tmp_path, size) -> None:
    results = run_world(size, tmp_path)
    total = sum(10.0 ** r for r in range(size))        # 11 for 2 ranks, 111 for 3
    assert [r["rank"] for r in results] == list(range(size))
    for r in results:
        assert (r["engine"], r["size"], r["local_size"]) == ("ddp", size, 1)
        assert r["sum"] == [total, -total]
        assert r["mean"] == pytest.approx([total / size, -total / size])   # 5.5, 37: not 11 or 55.5 or 111
        assert r["count_sum"] == [size * (size + 1) // 2]
        assert r["count_mean"] == pytest.approx([(size + 1) / 2])
        assert r["input_after"] == [10.0 ** r["rank"], -(10.0 ** r["rank"])]
