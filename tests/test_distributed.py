"""training/distributed.py's choice of engine from the environment (pure), and its single-process engine.

The multi-process runs (each engine across 2 processes, the reducer tier under torchrun-style variables) are in
tests/test_bert_engines.py, through examples/bert/pretrain.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from training import distributed
from training.distributed import Choice, DistributedError, choose

MPI = {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
       "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
TORCHRUN = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "1",
            "MASTER_ADDR": "10.0.0.2", "MASTER_PORT": "29500"}


@pytest.mark.parametrize(("env", "engine"), [
    ({}, "single"),                                          # python script.py: one process, nothing to average
    (MPI, "horovod"),                                        # plain mpirun
    (TORCHRUN, "ddp"),                                       # plain torchrun
    ({**MPI, **TORCHRUN}, "horovod"),                        # both: mpirun's win, as training/engine.py reads them
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2"}, "horovod"),  # horovodrun --gloo
    ({**TORCHRUN, "HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "SCALETRAIN_ENGINE": "horovod"}, "horovod"),
    ({**MPI, "SCALETRAIN_ENGINE": "ddp"}, "ddp"),            # launch train --engine ddp: mpirun starts DDP ranks
    ({**TORCHRUN, "SCALETRAIN_ENGINE": "DDP "}, "ddp"),
    ({"SCALETRAIN_ENGINE": "", **TORCHRUN}, "ddp"),          # empty is unset
    ({"SCALETRAIN_ENGINE": "horovod"}, "horovod"),           # one process under Horovod is allowed (size 1)
    ({**TORCHRUN, "WORLD_SIZE": "1", "RANK": "0", "SCALETRAIN_ENGINE": "horovod"}, "horovod"),
])
def test_the_engine_is_the_one_asked_for_else_the_launchers(env, engine):
    assert choose(env).engine == engine


def test_horovod_without_mpirun_is_refused_beyond_one_process():
    # WORLD_SIZE=1: allowed above; WORLD_SIZE=2: each process would be Horovod's rank 0 of 1 and train alone.
    with pytest.raises(DistributedError, match="SCALETRAIN_ENGINE=horovod needs mpirun or horovodrun .*use "
                                               "SCALETRAIN_ENGINE=ddp"):
        choose({**TORCHRUN, "SCALETRAIN_ENGINE": "horovod"})


@pytest.mark.parametrize(("env", "message"), [
    ({"SCALETRAIN_ENGINE": "nccl"}, "SCALETRAIN_ENGINE=nccl: choose one of horovod, ddp, reducer"),
    ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set but RANK is not"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, "RANK=2 with WORLD_SIZE=2: RANK must be below WORLD_SIZE"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE=0: must be a whole number >= 1"),
    ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE=two: must be a whole number >= 1"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, "RANK=-1: must be a whole number >= 0"),
    ({**TORCHRUN, "SCALETRAIN_REDUCERS": "2"}, "SCALETRAIN_ENGINE=ddp with SCALETRAIN_REDUCERS=2"),
    ({**TORCHRUN, "SCALETRAIN_ENGINE": "reducer"}, "the reducer engine needs SCALETRAIN_REDUCERS >= 1"),
    ({**TORCHRUN, "SCALETRAIN_ENGINE": "reducer", "SCALETRAIN_REDUCERS": "0"}, "needs SCALETRAIN_REDUCERS >= 1"),
    ({"SCALETRAIN_ENGINE": "reducer", "SCALETRAIN_REDUCERS": "1"}, "needs this process's place"),
    ({**MPI, "SCALETRAIN_ENGINE": "reducer", "SCALETRAIN_REDUCERS": "4"}, "OMPI_COMM_WORLD_SIZE=4 with "
                                                                            "SCALETRAIN_REDUCERS=4"),
])
def test_an_environment_that_names_no_world_is_one_line(env, message):
    with pytest.raises(DistributedError, match=message.replace("(", r"\(").replace(".", r"\.")) as e:
        choose(env)
    assert "\n" not in str(e.value)


def test_the_reducer_tier_under_mpirun_is_the_mpmd_world():
    # 4 ranks: 3 workers then 1 reducer; the reducer engine reads its place from mpirun's variables.
    assert choose({**MPI, "SCALETRAIN_ENGINE": "reducer", "SCALETRAIN_REDUCERS": "3"}) == \
        Choice("reducer", 3, why="SCALETRAIN_ENGINE")


def test_the_reducer_tier_under_torchrun_counts_reducers_after_world_size():
    # WORLD_SIZE keeps torchrun's meaning (the training processes); the gloo world adds the reducers after them.
    got = choose({**TORCHRUN, "SCALETRAIN_ENGINE": "reducers", "SCALETRAIN_REDUCERS": "2"})
    assert (got.engine, got.reducers, got.place, got.node) == ("reducer", 2, (1, 4), "node1")
    no_node = dict(TORCHRUN)
    del no_node["NODE_RANK"]
    assert choose({**no_node, "SCALETRAIN_ENGINE": "reducer", "SCALETRAIN_REDUCERS": "1"}).node is None


def test_single_process_engine_trains_and_refuses_a_second_init():
    assert distributed.init(env={}).name == "single"
    try:
        with pytest.raises(DistributedError, match="called twice"):
            distributed.init(env={})
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model, opt = distributed.wrap(model, opt)
        x, y = torch.randn(16, 3), torch.randn(16, 1)
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            assert distributed.step(opt) is False
            losses.append(float(distributed.allreduce(loss.detach())))
        assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0]
        assert (distributed.rank(), distributed.size(), distributed.engine_name()) == (0, 1, "single")
        assert distributed.broadcast_object({"a": 1}) == {"a": 1}
        with pytest.raises(DistributedError, match="op='max': choose 'mean' or 'sum'"):
            distributed.allreduce(torch.ones(1), op="max")
    finally:
        distributed.shutdown()
    with pytest.raises(DistributedError, match=r"call distributed.init\(\) first"):
        distributed.rank()


def one_rank(code: str) -> subprocess.CompletedProcess:
    """`code` in a process holding a live torch.distributed (gloo) group of one, started as init() starts DDP."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root), "SCALETRAIN_ENGINE": "ddp", "RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo"}
    prelude = "from training import distributed\nengine = distributed.init()\nprint('started', flush=False)\n"
    return subprocess.run([sys.executable, "-c", prelude + code], capture_output=True, text=True, env=env,
                          timeout=120, cwd=root)


@pytest.mark.parametrize(("code", "status", "err"), [
    # leave(): its line, its status, and stdout flushed although os._exit flushes nothing.
    ("distributed.leave(3, 'error: said once')", 3, "error: said once\n"),
    ("distributed.leave(0)", 0, ""),
    # A user's uncaught exception while the group is live: Python's traceback, then leave(1), not the interpreter's
    # exit (where gloo's joinable threads may abort the process: SIGABRT, -6).
    ("raise RuntimeError('boom')", 1, "RuntimeError: boom\n"),
    ("raise KeyboardInterrupt", 130, "error: interrupted\n"),
    # After shutdown() the group is gone and the interpreter's own exit is back: Python's status for a traceback.
    ("distributed.shutdown()\nimport sys\nassert sys.excepthook is sys.__excepthook__\nraise SystemExit(5)", 5, ""),
])
def test_a_rank_with_a_live_group_leaves_with_its_line_and_status(code, status, err):
    proc = one_rank(code)
    assert proc.returncode == status, (proc.returncode, proc.stderr[-2000:])
    assert proc.stdout == "started\n" and proc.stderr.endswith(err), proc.stderr[-2000:]
    assert ("Traceback" in proc.stderr) == ("RuntimeError" in code), proc.stderr[-2000:]


SLOW_SCRIPT = r"""
import os, sys, time, torch
from training import distributed
distributed.init()
slow = float(os.environ["SLOW_FORWARD_S"])
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 1)
    def forward(self, x):
        time.sleep(slow)
        return self.lin(x)
torch.manual_seed(0)
net = Net()
model, opt = distributed.wrap(net, torch.optim.SGD(net.parameters(), lr=0.1))
for step in range(4):
    time.sleep(float(os.environ["DATA_S"]))               # the script's loader
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(torch.randn(8, 3)), torch.randn(8, 1)).backward()
    distributed.step(opt)
distributed.shutdown()
"""


def run_ranks(tmp_path, world: int, slow: dict[int, float], data_s: float = 0.0) -> dict[int, list]:
    """`world` processes of SLOW_SCRIPT as `launch run` starts a script (torchrun's variables, the progress
    directory set); rank r's forward sleeps slow.get(r, 0) s. Each rank's recorded steps."""
    from launcher.plans import stragglers as sg
    from training import progress

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = Path(__file__).resolve().parent.parent
    procs = []
    for r in range(world):
        env = {**os.environ, "PYTHONPATH": str(root), "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
               "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "GLOO_SOCKET_IFNAME": "lo", progress.ENV: str(tmp_path / "progress"),
               "SLOW_FORWARD_S": str(slow.get(r, 0.0)), "DATA_S": str(data_s), "OMP_NUM_THREADS": "1"}
        if world == 1:
            env["SCALETRAIN_ENGINE"] = ""
            for k in ("RANK", "WORLD_SIZE"):
                env.pop(k)
        procs.append(subprocess.Popen([sys.executable, "-c", SLOW_SCRIPT], env=env, cwd=root, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-2000:]
    files = {int(f.name.split("@")[0].removeprefix("rank-")): f for f in (tmp_path / "progress").iterdir()}
    return {r: [sg.parse(ln) for ln in f.read_text().splitlines()] for r, f in files.items()}


def test_a_scripts_steps_are_recorded_by_distributed_without_a_line_of_its_own(tmp_path):
    """training.distributed records each step's phases for a `launch run` script (training/progress.StepHooks):
    data from one step's end to the next forward, forward the model's call, the optimizer's step."""
    got = run_ranks(tmp_path, 1, {0: 0.2}, data_s=0.1)
    steps = got[0]
    assert [t.step for t in steps] == [0, 1, 2, 3]
    assert all(0.2 <= t.forward < 0.4 and 0.1 <= t.data < 0.3 and t.optimizer < 0.1 for t in steps[1:]), steps


def test_under_ddp_the_slow_ranks_forward_is_its_own_and_the_others_wait_in_backward(tmp_path):
    """Two DDP ranks, rank 1's forward 0.3 s slower: rank 1's recorded forward shows it, rank 0's does not (it
    waits for rank 1 in backward, where DDP's allreduce completes), so launcher/plans/stragglers.py, which compares
    data + forward, names the slow one and not the one that waits."""
    got = run_ranks(tmp_path, 2, {1: 0.3})
    assert [t.step for t in got[0]] == [t.step for t in got[1]] == [0, 1, 2, 3]
    for fast, slow in zip(got[0][1:], got[1][1:], strict=True):
        assert slow.forward >= 0.3 and fast.forward < 0.1, (fast, slow)
        assert fast.backward >= 0.2 > slow.backward, (fast, slow)
