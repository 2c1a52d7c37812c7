"""The distributed engines behind one small interface: Horovod (the default) and torch.distributed DDP.

The training loop calls only what is here, so a user without Horovod still trains (`--engine ddp`), and the
reducer tier (training/reducer.py, `--engine reducer --reducers K`) plugs in as one more engine. Each engine:

- knows this process's place: `rank`, `size`, `local_rank`, `local_size`;
- `broadcast_state(model, optimizer)`: every rank starts from rank 0's parameters, buffers and optimizer state;
- `prepare(model, optimizer, ...)`: returns the model to call and the optimizer to step, wired so gradients
  are averaged over the ranks;
- `accumulate(model)`: a context for the micro-batches before the last of a step (no communication);
- `step(optimizer, scaler)`: one optimizer step, with the GradScaler seeing *reduced* gradients; returns
  True when the step was skipped (an inf/nan gradient in fp16);
- `allreduce(tensor, op, name)` ("mean" or "sum") and `broadcast_object(obj, name)` (from rank 0) for the rest.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
from typing import Any

import torch

ENGINES = ("horovod", "ddp", "reducer")


def found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer) -> bool:
    """Whether the scaler found an inf/nan in this step's gradients (it then skips the step)."""
    return bool(sum(float(v) for v in scaler._found_inf_per_device(optimizer).values()))


def scaled_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, static_scale: float | None) -> bool:
    """An optimizer step on gradients already reduced: through the scaler in fp16 (skipped on inf/nan, the scale
    then backed off, or held at `static_scale`); True when the step was skipped."""
    if not scaler.is_enabled():
        optimizer.step()
        return False
    scaler.unscale_(optimizer)
    skipped = found_inf(scaler, optimizer)
    scaler.step(optimizer)
    scaler.update(static_scale)
    return skipped


class HorovodEngine:
    name = "horovod"

    def __init__(self) -> None:
        import horovod.torch as hvd

        # Horovod: initialize; under mpirun the ranks come from MPI.
        hvd.init()
        self.hvd = hvd
        self.rank, self.size = hvd.rank(), hvd.size()
        self.local_rank, self.local_size = hvd.local_rank(), hvd.local_size()

    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # Horovod: parameters and buffers from rank 0, then its optimizer state (momentum) as an object.
        # Not hvd.broadcast_optimizer_state: on an optimizer without state it takes a step with zero gradients
        # to create some, and that step applies weight decay and seeds the momentum: a fresh run would not
        # start from its initial weights, and a resumed run would not continue the interrupted one exactly.
        self.hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        state = self.broadcast_object(optimizer.state_dict() if self.rank == 0 else None, "optimizer.state")
        if self.rank != 0:
            optimizer.load_state_dict(state)

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, fp16_allreduce: bool,
                backward_passes_per_step: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        # Horovod: the wrapped optimizer averages gradients across ranks while backward runs.
        compression = self.hvd.Compression.fp16 if fp16_allreduce else self.hvd.Compression.none
        return model, self.hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(), compression=compression, op=self.hvd.Average,
            backward_passes_per_step=backward_passes_per_step)

    def accumulate(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        # Horovod: backward_passes_per_step already holds the allreduce until the last micro-batch.
        return contextlib.nullcontext()

    def step(self, optimizer, scaler: torch.amp.GradScaler, static_scale: float | None) -> bool:
        if not scaler.is_enabled():
            optimizer.step()
            return False
        # Horovod: finish the allreduce before unscaling, so the scaler sees reduced gradients.
        optimizer.synchronize()
        scaler.unscale_(optimizer)
        skipped = found_inf(scaler, optimizer)
        with optimizer.skip_synchronize():
            scaler.step(optimizer)
        scaler.update(static_scale)
        return skipped

    def allreduce(self, tensor: torch.Tensor, op: str, name: str) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Average if op == "mean" else self.hvd.Sum, name=name)

    def broadcast_object(self, obj: Any, name: str) -> Any:
        # Horovod: the name must be the same on every rank (its default, the object's type, may not be).
        return self.hvd.broadcast_object(obj, root_rank=0, name=name)

    def shutdown(self) -> None:
        self.hvd.shutdown()


def _env_int(*names: str, default: int) -> int:
    for n in names:
        if n in os.environ:
            return int(os.environ[n])
    return default


class DDPEngine:
    """torch.distributed DistributedDataParallel: NCCL on GPU, gloo on CPU.

    Started by mpirun (OMPI_COMM_WORLD_* variables) or torchrun (RANK, WORLD_SIZE, LOCAL_RANK); the rendezvous
    is MASTER_ADDR:MASTER_PORT (the launcher sets both to the first node; default 127.0.0.1:29500).
    """

    name = "ddp"

    def __init__(self, timeout_s: float = 600) -> None:
        import torch.distributed as dist

        self.dist = dist
        self.rank = _env_int("OMPI_COMM_WORLD_RANK", "RANK", default=0)
        self.size = _env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", default=1)
        self.local_rank = _env_int("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK", default=0)
        self.local_size = _env_int("OMPI_COMM_WORLD_LOCAL_SIZE", "LOCAL_WORLD_SIZE", default=1)
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        self.backend = "nccl" if torch.cuda.is_available() else "gloo"
        if torch.cuda.is_available():
            torch.cuda.set_device(self.local_rank)
        # DDP: one process group over all ranks; a dead peer ends the wait after timeout_s, not never.
        dist.init_process_group(self.backend, rank=self.rank, world_size=self.size,
                                timeout=dt.timedelta(seconds=timeout_s))

    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # DDP: parameters and buffers from rank 0 (DDP's constructor would too; the optimizer state it would not).
        for tensor in model.state_dict().values():
            self.dist.broadcast(tensor, src=0)
        state = [optimizer.state_dict() if self.rank == 0 else None]
        self.dist.broadcast_object_list(state, src=0)
        if self.rank != 0:
            optimizer.load_state_dict(state[0])

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, fp16_allreduce: bool,
                backward_passes_per_step: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        # DDP: gradients are averaged in buckets while backward runs.
        device_ids = [self.local_rank] if torch.cuda.is_available() else None
        ddp = DistributedDataParallel(model, device_ids=device_ids)
        if fp16_allreduce:
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        return ddp, optimizer

    def accumulate(self, model) -> contextlib.AbstractContextManager:
        # DDP: no allreduce for the micro-batches before the last one of a step.
        return model.no_sync()

    def step(self, optimizer, scaler: torch.amp.GradScaler, static_scale: float | None) -> bool:
        return scaled_step(optimizer, scaler, static_scale)  # DDP reduced the gradients during backward

    def allreduce(self, tensor: torch.Tensor, op: str, name: str) -> torch.Tensor:
        # NCCL reduces CUDA tensors only ("No backend type associated with device type cpu" on the first logged loss,
        # seen on an H200; https://docs.pytorch.org/docs/stable/distributed.html#backends: NCCL, all_reduce on GPU
        # only): a CPU tensor (the logged loss, validation's counts) goes through this rank's GPU and comes back.
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else tensor.device
        out = tensor.detach().to(device, copy=True)
        self.dist.all_reduce(out, op=self.dist.ReduceOp.SUM)
        out = out.to(tensor.device)
        return out / self.size if op == "mean" else out

    def broadcast_object(self, obj: Any, name: str) -> Any:
        box = [obj]
        self.dist.broadcast_object_list(box, src=0)
        return box[0]

    def shutdown(self) -> None:
        self.dist.destroy_process_group()


def start(name: str, *, reducers: int = 0):
    """The engine called `name`; `reducers`: the reducer processes of the MPMD world (reducer engine only)."""
    if name == "horovod":
        return HorovodEngine()
    if name == "ddp":
        return DDPEngine()
    if name == "reducer":
        from training.reducer import ReducerEngine

        return ReducerEngine(reducers)
    raise ValueError(f"unknown engine '{name}'; choose one of: {', '.join(ENGINES)}")
