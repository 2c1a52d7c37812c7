"""examples/bert/pretrain.py trains for real across 2 processes on this machine through training.distributed, with
each engine started the way a launcher starts it: Horovod under `mpirun -np 2`, DDP from torchrun's variables (two
processes, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, gloo), and the reducer tier both from torchrun-style variables
(workers, then `python -m training.reducer`) and as mpirun's MPMD world. Then the reducer tier against the ring on a
BERT-sized gradient, bytes per worker as bench/reducer.py counts them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_reducer import MPI_ENV, MPI_FLAGS, free_port

pytestmark = pytest.mark.mpi

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "examples" / "bert" / "pretrain.py")
# 20 steps of BERT-tiny, two micro-batches a step (the engines' accumulate path), each rank's final weights saved.
ARGS = ["--steps", "20", "--log-every", "5", "--accumulate", "2", "--threads", "1", "--dump-rank-params"]
LAUNCHERS = ("SCALETRAIN_ENGINE", "SCALETRAIN_REDUCERS", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
             "NODE_RANK", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")


def base_env() -> dict[str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in LAUNCHERS}
    return {**clean, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def torchrun_style(out: Path, workers: int = 2, reducers: int = 0) -> list[tuple[int, str]]:
    """What torchrun (or `launch run`) does: one process per rank with RANK, WORLD_SIZE, LOCAL_RANK, ... set; with
    reducers, SCALETRAIN_ENGINE=reducer on the workers and the reducer program at ranks W..W+K-1 of the world."""
    env, procs = base_env(), []
    for r in range(workers):
        mine = {"RANK": str(r), "WORLD_SIZE": str(workers), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                "NODE_RANK": str(r)}  # each rank its own node, as on the local cluster
        if reducers:
            mine |= {"SCALETRAIN_ENGINE": "reducer", "SCALETRAIN_REDUCERS": str(reducers)}
        procs.append(subprocess.Popen([sys.executable, SCRIPT, *ARGS, "--output", str(out)], env=env | mine,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT))
    for i in range(reducers):
        procs.append(subprocess.Popen([sys.executable, "-m", "training.reducer", "--workers", str(workers)],
                                      env=env | {"RANK": str(workers + i), "WORLD_SIZE": str(workers + reducers)},
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT))
    try:
        return [(p.wait(timeout=120), p.stdout.read()) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def mpirun(out: Path, reducers: int = 0) -> list[tuple[int, str]]:
    """Horovod's way: `mpirun -np 2 python pretrain.py`; with reducers, the MPMD line `launch train --reducers`
    builds (the workers told SCALETRAIN_ENGINE=reducer, the reducer program after them)."""
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    workers = ["-x", "HOROVOD_GLOO_IFACE=lo", *MPI_ENV]
    if reducers:
        workers += ["-x", "SCALETRAIN_ENGINE=reducer", "-x", f"SCALETRAIN_REDUCERS={reducers}"]
    argv = ["mpirun", *root, *MPI_FLAGS, "-np", "2", *workers, sys.executable, SCRIPT, *ARGS, "--output", str(out)]
    if reducers:
        argv += [":", "-np", str(reducers), *MPI_ENV, sys.executable, "-m", "training.reducer", "--workers", "2"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=base_env(), timeout=120, cwd=ROOT)
    return [(proc.returncode, proc.stdout + proc.stderr)]


LAUNCHES = {
    "horovod": lambda out: mpirun(out),
    "ddp": lambda out: torchrun_style(out),
    "reducer-torchrun": lambda out: torchrun_style(out, reducers=1),
    "reducer-mpirun": lambda out: mpirun(out, reducers=1),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Each launch run once, when a test first asks for it: {name: run directory}."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            out = tmp_path_factory.mktemp(name)
            results = LAUNCHES[name](out)
            assert all(rc == 0 for rc, _ in results), "\n".join(text[-3000:] for _, text in results)
            done[name] = out
        return done[name]
    return get


def params(run: Path, rank: int) -> dict[str, torch.Tensor]:
    return torch.load(run / f"params-rank{rank}.pt")


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_the_example_trains_across_two_processes(runs, launch):
    run = runs(launch)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["engine"] == launch.split("-")[0] and summary["ranks"] == 2  # reducers are not ranks
    assert summary["global_batch"] == 16
    losses = summary["losses"]
    assert len(losses) == 4 and losses[-1] < losses[0] - 0.5, losses  # 7.6 (ln 2000) -> about 6.6
    assert equal(params(run, 0), params(run, 1)), "the ranks' weights parted: the gradients were not averaged"


@pytest.mark.parametrize("launch", ["horovod", "reducer-torchrun", "reducer-mpirun"])
def test_every_engine_ends_with_ddps_weights_bit_for_bit(runs, launch):
    """The same seeds, data and masks on each rank whatever the engine, and with 2 ranks every engine's mean is
    (a + b) / 2 in the same rounding (the reducer tier halves each gradient first, which is exact): so the weights
    after 20 AdamW steps are DDP's exactly. A sum instead of a mean, a rank's gradient lost, a micro-batch reduced
    twice or a bucket written to the wrong parameters would each show here."""
    assert equal(params(runs(launch), 0), params(runs("ddp"), 0))


def test_one_rank_alone_ends_elsewhere(runs, tmp_path):
    """The comparison above can fail: rank 0's data alone (one process, the same batch) gives other weights."""
    env = {k: v for k, v in base_env().items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, SCRIPT, *ARGS, "--output", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "summary.json").read_text())["engine"] == "single"
    alone, ddp = params(tmp_path, 0), params(runs("ddp"), 0)
    assert not equal(alone, ddp)
    assert max(float((alone[k] - ddp[k]).abs().max()) for k in ddp) > 1e-4


def test_ranks_with_different_texts_stop_together_in_one_line(tmp_path):
    """Rank 1's Python ships another reference manual (a pydoc_data ahead of the standard library on its path):
    both ranks stop at once with one line, instead of training on different words."""
    other = tmp_path / "other" / "pydoc_data"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    (other / "topics.py").write_text("topics = {'x': " + repr("another manual of another python " * 2000) + "}\n")
    env, procs = base_env(), []
    for r in range(2):
        path = f"{other.parent}:{ROOT}" if r == 1 else str(ROOT)
        procs.append(subprocess.Popen([sys.executable, SCRIPT, "--steps", "2", "--threads", "1"], env=env | {
            "RANK": str(r), "WORLD_SIZE": "2", "PYTHONPATH": path}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, cwd=ROOT))
    results = [(p.wait(timeout=60), p.stderr.read()) for p in procs]
    for rc, err in results:
        assert rc == 1 and "Traceback" not in err, err
        assert err.strip().splitlines()[-1].startswith("error: the ranks' Pythons ship different reference manuals")


# ---------------------------------------------------------------------------------------------- BERT-sized gradients

def bench(*args: str) -> dict:
    """bench/reducer.py's table: per-worker MB sent and received per step, the largest difference between the
    tier's and the ring's reduced gradient, and the ring/tier volume ratio."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "reducer.py"), *args], capture_output=True,
                          text=True, timeout=240, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = {m[1]: (float(m[2]), float(m[3])) for m in re.finditer(r"^(ring allreduce|reducer tier)\s+([\d.]+)\s+"
                                                                     r"([\d.]+)", proc.stdout, flags=re.M)}
    worst = re.search(r"largest difference of any gradient element (\S+)", proc.stdout)
    return {"rows": rows, "worst": float(worst[1]), "ratio": float(re.search(r"^ratio=(\S+)$", proc.stdout,
                                                                               flags=re.M)[1]), "out": proc.stdout}


def test_a_tenth_of_bert_larges_gradient_through_the_tier_equals_the_ring_and_crosses_once():
    """A tenth of BERT-large's gradient (33.5M fp16 elements, 67 MB) in 1 MB buckets, sharded over 2 reducers,
    through the tier and through the ring, 2 workers: the same numbers, and each worker sends and receives its
    gradient once per step. The whole of BERT-large's (335M elements, `--model bert-large`) takes 1.5 min and about
    10 GB on this 2-core machine, so it is a bench run (docs/benchmarks.md), not a test."""
    got = bench("--workers", "2", "--reducers", "2", "--steps", "1", "--numel", "33517241", "--bucket-mb", "1",
                "--fp16")
    assert "33,517,241-element 67.0 MB gradient (fp16)" in got["out"]
    assert got["rows"] == {"ring allreduce": (67.03, 67.03), "reducer tier": (67.03, 67.03)}
    assert got["worst"] == 0 and got["ratio"] == 1.0  # 2(n-1)/n = 1 at 2 workers


def test_bytes_per_worker_with_three_workers_are_the_tiers_two_thirds_of_the_ring():
    """Over 2 workers the ring and the tier move the same bytes; from 3 on the ring moves 2(n-1)/n gradients per
    worker and the tier one: 4/3 here, BERT-tiny's 238,480 fp16 elements (0.48 MB)."""
    got = bench("--workers", "3", "--reducers", "2", "--steps", "2", "--model", "bert-tiny", "--fp16")
    assert got["rows"]["reducer tier"] == (0.48, 0.48)
    assert got["rows"]["ring allreduce"] == (0.64, 0.64)
    assert got["ratio"] == pytest.approx(4 / 3, abs=0.002)
    assert got["worst"] < 1e-3  # the ring adds in fp16, the reducers in fp32
