"""The project's engines for your own training script: Horovod, DDP or the reducer tier, chosen by the environment.

    from training import distributed

    distributed.init()                                   # which engine: from the variables below
    model = Net().to(distributed.device())
    opt = torch.optim.AdamW(model.parameters())
    model, opt = distributed.wrap(model, opt)            # gradients averaged over the ranks; rank 0's weights
    for batch in my_shard(distributed.rank(), distributed.size()):
        opt.zero_grad()
        loss_fn(model(batch)).backward()
        distributed.step(opt)                            # the optimizer sees the mean gradient of every rank
    distributed.shutdown()
    ...
    distributed.leave(1, "error: ...")                   # any other way out of a rank: its line, its status, now

The engines are training/engine.py's (Horovod, torch.distributed DDP) and training/reducer.py's (the reducer tier of
seed 004); this module only chooses one and hands its calls on. docs/your-code.md says more.

The environment contract (what `launch run` sets; `choose` is the one place that reads it):

| variable | meaning |
| --- | --- |
| SCALETRAIN_ENGINE | `horovod`, `ddp` or `reducer` (`reducers` means `reducer`). Unset or empty: inferred, below |
| SCALETRAIN_REDUCERS | K >= 1 reducer processes (`python -m training.reducer --workers W`), with `reducer` only |
| OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE | set by Open MPI's mpirun; win over the torchrun ones |
| HOROVOD_RANK, HOROVOD_SIZE | set by `horovodrun --gloo` (Horovod reads them itself) |
| RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK | torchrun's; WORLD_SIZE counts the training processes |
| MASTER_ADDR, MASTER_PORT | the rendezvous of DDP and of the reducer tier's gloo world (default 127.0.0.1:29500) |
| GLOO_SOCKET_IFNAME, HOROVOD_GLOO_IFACE, NCCL_*, FI_* | read by torch, Horovod, NCCL and libfabric themselves |

Sources: torchrun's variables, "torchrun (Elastic Launch)", "Environment Variables",
https://docs.pytorch.org/docs/stable/elastic/run.html; Open MPI's, mpirun(1) "Exported Environment Variables",
https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php; horovodrun's Gloo mode, create_slot_env_vars in
horovod/runner/gloo_run.py (Horovod 0.28.1; "Horovod with Gloo", https://horovod.readthedocs.io/en/stable/gloo_include.html).

Inferred when SCALETRAIN_ENGINE is unset: OMPI_COMM_WORLD_SIZE (mpirun) or HOROVOD_SIZE (horovodrun --gloo) set
-> horovod; else WORLD_SIZE set (torchrun) -> ddp; else one process alone (`single`: no communication at all).

The reducer tier is one gloo world of W workers then K reducers. Under mpirun it is the MPMD world `launch train
--reducers K` starts (OMPI_COMM_WORLD_SIZE = W + K, workers first). Under torchrun-style variables the workers keep
torchrun's meaning, RANK < WORLD_SIZE = W, and reducer i runs `python -m training.reducer --workers W` with
RANK = W + i and WORLD_SIZE = W + K (the whole world, which that program reads); every process gets the same
MASTER_ADDR:MASTER_PORT. NODE_RANK groups the workers of one node (they reduce onto their node's first worker,
which alone talks to the reducers); without it each worker counts as its own node.
"""

from __future__ import annotations

import contextlib
import os
import sys
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import torch

from training.progress import Progress, StepHooks

ENGINES = ("horovod", "ddp", "reducer")
ALIASES = {"reducers": "reducer"}


class DistributedError(ValueError):
    """The environment does not describe a world this module can join; one line naming what and what is allowed."""


@dataclass(frozen=True)
class Choice:
    engine: str                            # horovod, ddp, reducer, or single (one process, nothing to average)
    reducers: int = 0                      # reducer processes after the workers (reducer only)
    place: tuple[int, int] | None = None   # (rank, size) in the reducer tier's world when mpirun does not say it
    node: str | None = None                # this worker's node for the reducer tier (from NODE_RANK)
    why: str = ""                          # the variables that decided it


def _int(env: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = env.get(name, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise DistributedError(f"{name}={raw}: must be a whole number >= {minimum}")
    return value


def choose(env: Mapping[str, str]) -> Choice:
    """Which engine this process starts, from its environment (os.environ); pure, so every rule is tested."""
    asked = env.get("SCALETRAIN_ENGINE", "").strip().lower()
    asked = ALIASES.get(asked, asked)
    if asked and asked not in ENGINES:
        raise DistributedError(f"SCALETRAIN_ENGINE={env['SCALETRAIN_ENGINE']}: choose one of {', '.join(ENGINES)} "
                               f"(or leave it unset to infer it from mpirun's or torchrun's variables)")
    reducers = _int(env, "SCALETRAIN_REDUCERS", 0) or 0
    mpi_size = _int(env, "OMPI_COMM_WORLD_SIZE", 1)
    hvd_size = _int(env, "HOROVOD_SIZE", 1)
    world = _int(env, "WORLD_SIZE", 1)
    rank = _int(env, "RANK", 0)
    if world is not None and rank is None:
        raise DistributedError(f"WORLD_SIZE={world} is set but RANK is not: a torchrun-style launcher sets both")
    if world is not None and rank >= world:
        raise DistributedError(f"RANK={rank} with WORLD_SIZE={world}: RANK must be below WORLD_SIZE")
    engine, why = asked, "SCALETRAIN_ENGINE"
    if not engine:
        engine, why = (("horovod", "mpirun's OMPI_COMM_WORLD_SIZE") if mpi_size is not None
                       else ("horovod", "horovodrun's HOROVOD_SIZE") if hvd_size is not None
                       else ("ddp", "torchrun's WORLD_SIZE") if world is not None
                       else ("single", "no launcher's variables"))
    if (engine == "reducer") != (reducers > 0):
        raise DistributedError(f"SCALETRAIN_ENGINE={engine} with SCALETRAIN_REDUCERS={reducers}: the reducer engine "
                               f"needs SCALETRAIN_REDUCERS >= 1, and only it takes reducers")
    if engine == "horovod" and mpi_size is None and hvd_size is None and (world or 1) > 1:
        # Horovod learns its world from MPI under mpirun, or from horovodrun's Gloo rendezvous ("Horovod with MPI",
        # https://horovod.readthedocs.io/en/stable/mpi_include.html); torchrun's variables it does not read: with
        # RANK=1 WORLD_SIZE=2 and no mpirun, hvd.init() gives rank 0 of size 1 (Horovod 0.28.1, measured), so
        # every process would train alone.
        raise DistributedError(f"SCALETRAIN_ENGINE=horovod needs mpirun or horovodrun (no OMPI_COMM_WORLD_SIZE or "
                               f"HOROVOD_SIZE here, but WORLD_SIZE={world}): start under mpirun, or use "
                               f"SCALETRAIN_ENGINE=ddp")
    if engine != "reducer":
        return Choice(engine, why=why)
    if mpi_size is not None:
        if mpi_size <= reducers:
            raise DistributedError(f"OMPI_COMM_WORLD_SIZE={mpi_size} with SCALETRAIN_REDUCERS={reducers}: the "
                                   f"mpirun world holds the workers and then the reducers, so it needs more ranks")
        return Choice(engine, reducers, why=why)
    if world is None:
        raise DistributedError("SCALETRAIN_ENGINE=reducer needs this process's place: mpirun's OMPI_COMM_WORLD_* or "
                               "torchrun's RANK and WORLD_SIZE")
    node_rank = _int(env, "NODE_RANK", 0)
    return Choice(engine, reducers, place=(rank, world + reducers),
                  node=None if node_rank is None else f"node{node_rank}", why=why)


class SingleProcess:
    """One process and nobody to talk to: every call is the engines' with nothing to average."""

    name = "single"
    rank, size, local_rank, local_size = 0, 1, 0, 1

    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        pass

    def prepare(self, model, optimizer, *, fp16_allreduce: bool, backward_passes_per_step: int):
        return model, optimizer

    def accumulate(self, model) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def step(self, optimizer, scaler: torch.amp.GradScaler, static_scale: float | None) -> bool:
        from training.engine import scaled_step

        return scaled_step(optimizer, scaler, static_scale)

    def allreduce(self, tensor: torch.Tensor, op: str, name: str) -> torch.Tensor:
        return tensor.detach().clone()

    def broadcast_object(self, obj: Any, name: str) -> Any:
        return obj

    def shutdown(self) -> None:
        pass


_engine: Any = None
_steps: StepHooks | None = None


def leave(status: int, line: str = "") -> NoReturn:
    """End this process now with `status`, after `line` (one line on stderr; nothing when empty).

    Every way out of a rank that did not call shutdown() goes through here: the trainer's, the reducer's, the BERT
    example's and, through init()'s excepthook, a user's uncaught exception. A process whose torch.distributed (gloo)
    group is still live must not leave through the interpreter's exit (sys.exit, a SystemExit, the end of an
    uncaught exception): the group's C++ threads are still joinable when the runtime's destructors run, and the
    process dies of SIGABRT ("terminate called without an active exception", exit -6) after its one line. PyTorch's
    rule is to call destroy_process_group() before exiting ("Shutdown",
    https://docs.pytorch.org/docs/stable/distributed.html#shutdown), but on an error path the other ranks may never
    call it and the docs warn that a destroy "not called by all ranks ... within the timeout duration" can hang on
    exit (NCCL aborts its communicators collectively). So: flush what was said, then os._exit, which runs no
    destructor at all (https://docs.python.org/3/library/os.html#os._exit: "Exit the process with status n, without
    calling cleanup handlers, flushing stdio buffers, etc."). mpirun sees the rank end and stops the others.
    """
    if line:
        with contextlib.suppress(Exception):
            sys.stderr.write(line.rstrip("\n") + "\n")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _leave_on_uncaught(kind, value, tb) -> None:
    """sys.excepthook while an engine is live: the traceback as Python prints it, then leave(1) instead of the
    interpreter's exit (a KeyboardInterrupt: one line, 130, as a shell reports SIGINT)."""
    if issubclass(kind, KeyboardInterrupt):
        leave(130, "error: interrupted" if _engine is None or _engine.rank == 0 else "")
    traceback.print_exception(kind, value, tb)
    leave(1)


def init(env: Mapping[str, str] | None = None):
    """Start the engine the environment names (see the table above) and return it; once per process."""
    global _engine
    if _engine is not None:
        raise DistributedError("distributed.init() was called twice; call it once per process")
    choice = choose(os.environ if env is None else env)
    if choice.engine == "single":
        _engine = SingleProcess()
    elif choice.engine == "reducer":
        from training.reducer import ReducerEngine

        _engine = ReducerEngine(choice.reducers, node=choice.node, place=choice.place)
    else:
        from training import engine as engines

        _engine = engines.start(choice.engine)
    if torch.cuda.is_available():
        torch.cuda.set_device(_engine.local_rank)  # Distributed: one GPU per process, by its rank on the node
    if choice.engine != "single":
        sys.excepthook = _leave_on_uncaught  # a live group must not die in the interpreter's exit (see leave)
    global _steps
    # Each step's phases, for the job's step to name a straggler (training/progress.py; `launch run` sets the
    # directory): nothing is recorded without SCALETRAIN_PROGRESS_DIR.
    _steps = StepHooks(Progress.from_env(device()))
    return _engine


def _started():
    if _engine is None:
        raise DistributedError("call distributed.init() first")
    return _engine


def rank() -> int:
    return _started().rank


def size() -> int:
    """Training processes (reducers not counted)."""
    return _started().size


def local_rank() -> int:
    return _started().local_rank


def local_size() -> int:
    return _started().local_size


def engine_name() -> str:
    return _started().name


def device() -> torch.device:
    """This process's GPU (its local rank) when there are GPUs, else the CPU."""
    return torch.device("cuda", local_rank()) if torch.cuda.is_available() else torch.device("cpu")


def wrap(model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, fp16_allreduce: bool = False,
         backward_passes_per_step: int = 1) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model to call and the optimizer to step: gradients averaged over the ranks, every rank starting from
    rank 0's parameters and optimizer state. `fp16_allreduce`: gradients cross the wire in fp16.
    `backward_passes_per_step`: micro-batches per step (the earlier ones under `accumulate(model)`)."""
    engine = _started()
    wrapped, opt = engine.prepare(model, optimizer, fp16_allreduce=fp16_allreduce,
                                  backward_passes_per_step=backward_passes_per_step)
    engine.broadcast_state(model, opt)
    if _steps is not None:
        _steps.attach(wrapped)
    return wrapped, opt


def accumulate(model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """For the micro-batches before a step's last: their gradients add up locally, with no communication."""
    return _started().accumulate(model)


def step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None = None) -> bool:
    """One optimizer step on the gradients averaged over every rank (through `scaler` in fp16); True when the
    scaler skipped it (an inf/nan gradient)."""
    scaler = scaler or torch.amp.GradScaler("cpu", enabled=False)
    engine = _started()
    with _steps.step() if _steps is not None else contextlib.nullcontext():
        return bool(engine.step(optimizer, scaler, None))


def allreduce(tensor: torch.Tensor, op: str = "mean", name: str = "user") -> torch.Tensor:
    """`tensor` averaged ("mean") or summed ("sum") over the ranks (a logged loss, a count); a new tensor."""
    if op not in ("mean", "sum"):
        raise DistributedError(f"op={op!r}: choose 'mean' or 'sum'")
    return _started().allreduce(tensor, op, name)


def broadcast_object(obj: Any, name: str = "user") -> Any:
    """Rank 0's `obj` on every rank."""
    return _started().broadcast_object(obj, name)


def shutdown() -> None:
    """Leave the world (the reducer tier's reducers stop when worker 0 leaves)."""
    global _engine, _steps
    engine, _engine = _started(), None
    if _steps is not None:
        _steps.progress.close()
        _steps = None
    engine.shutdown()
    sys.excepthook = sys.__excepthook__  # the group is gone: the interpreter's own exit is safe again
