"""The reducer tier of seed 004: gradients summed on CPU reducer processes instead of a ring among the workers.

One MPMD world (torch.distributed over gloo): workers are ranks 0..W-1 (python -m training.train --engine reducer
--reducers K), reducers are ranks W..W+K-1 (python -m training.reducer --workers W). Per optimizer step:

1. each worker fuses its gradients into buckets (reverse parameter order, as DDP does), scaled by 1/W;
2. the workers of one node reduce each bucket onto their node leader (the node's lowest rank);
3. the leader sends shard i of the bucket to reducer i and receives back the sum of shard i over all nodes;
4. the leader broadcasts the bucket to its node; every worker writes the mean gradients into `param.grad`.

Each node leader sends and receives the gradient once per step (2 hops), where a ring allreduce sends and
receives 2(n-1)/n of it (n nodes, 2(n-1) hops). Overlap: a bucket's intra-node reduce and its sends start on a
communication thread as soon as backward has produced its last gradient (post-accumulate-grad hooks); the
leader sends every bucket before it waits for any reply, so sends and the reducers' replies overlap too.

Run by hand (as the launcher's plan does, workers and reducers in one mpirun):
    mpirun -np 2 python -m training.train --engine reducer --reducers 1 ... \
        : -np 1 python -m training.reducer --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import re
import signal
import socket
import sys
import threading
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from training import distributed

BUCKET_BYTES = 25 * 2**20      # bytes of one fused bucket on the wire (DDP's default)
TIMEOUT_S = 300.0              # a peer that does not answer within this long has stopped answering
CONTROL_TIMEOUT = dt.timedelta(days=7)  # reducers wait between steps (validation, checkpoints) without a limit
STEP, STOP = 1, 0              # control messages from worker 0 to every reducer


# ---------------------------------------------------------------------------------------------- pure helpers

def shard_bounds(n: int, k: int) -> list[tuple[int, int]]:
    """[start, stop) of shard i of n elements over k reducers: the first n % k shards hold one extra element."""
    if n < 0 or k < 1:
        raise ValueError(f"need n >= 0 and k >= 1, got n={n} k={k}")
    base, extra = divmod(n, k)
    bounds, start = [], 0
    for i in range(k):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def buckets(numels: list[int], element_size: int, bucket_bytes: int) -> list[list[int]]:
    """Parameter indices fused into buckets in reverse parameter order (backward produces the last layers'
    gradients first); a bucket closes once it holds at least `bucket_bytes`, so a large tensor has its own."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes must be >= 1, got {bucket_bytes}")
    out: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i in reversed(range(len(numels))):
        current.append(i)
        size += numels[i] * element_size
        if size >= bucket_bytes:
            out.append(current)
            current, size = [], 0
    if current:
        out.append(current)
    return out


def node_groups(nodes: list[str]) -> list[list[int]]:
    """Ranks grouped by node name, in order of each node's lowest rank (the node leader comes first)."""
    groups: dict[str, list[int]] = {}
    for rank, node in enumerate(nodes):
        groups.setdefault(node, []).append(rank)
    return list(groups.values())


# ---------------------------------------------------------------------------------------------- the world

def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def nodes_of(local_ranks: list[int]) -> list[str]:
    """Node names from each rank's OpenMPI local rank, under `--map-by slot` (a node's ranks are consecutive): a
    new node starts where the local rank does not go up. Host names cannot tell the local cluster's nodes apart
    (they share one machine); OpenMPI's daemons, one per node, can."""
    out, node, prev = [], -1, None
    for lr in local_ranks:
        if prev is None or lr <= prev:
            node += 1
        out.append(f"node{node}")
        prev = lr
    return out


@dataclass
class World:
    """Every rank's place in the MPMD world, and the process groups, created in one order on every rank."""

    rank: int
    workers: int
    reducers: int
    nodes: list[str]                  # node name of every rank
    hosts: list[str]                  # host name of every rank (for messages)
    control: Any                      # all ranks, no time limit: worker 0 tells the reducers what comes next
    worker_group: Any                 # workers only: the trainer's own allreduce / broadcast
    node_group: Any | None            # this worker's node, when it holds more than one worker
    node_ranks: list[int] = field(default_factory=list)  # this worker's node (leader first)

    @property
    def leaders(self) -> list[int]:
        return [g[0] for g in node_groups(self.nodes[:self.workers])]

    def where(self, rank: int) -> str:
        return f"rank {rank} on {self.hosts[rank]}"


def join(role: str, *, workers: int | None = None, reducers: int | None = None, node: str | None = None,
         timeout_s: float = TIMEOUT_S, place: tuple[int, int] | None = None) -> World:
    """Join the MPMD world started by mpirun (OMPI_COMM_WORLD_*) or by hand (RANK, WORLD_SIZE); the rendezvous is
    MASTER_ADDR:MASTER_PORT. Workers pass `reducers`, reducers pass `workers`; the other count is the rest.
    `place`: (rank, size) in the world when the environment does not say it (training/distributed.py: under
    torchrun-style variables WORLD_SIZE counts the workers only)."""
    rank, size = place or (_env_int("OMPI_COMM_WORLD_RANK", _env_int("RANK", 0)),
                           _env_int("OMPI_COMM_WORLD_SIZE", _env_int("WORLD_SIZE", 1)))
    workers = size - reducers if workers is None else workers
    reducers = size - workers
    if workers < 1 or reducers < 1:
        raise RuntimeError(f"the reducer tier needs >= 1 worker and >= 1 reducer; the world has {size} rank(s) "
                           f"for {workers} worker(s) and {reducers} reducer(s)")
    if (role == "worker") != (rank < workers):
        raise RuntimeError(f"rank {rank} runs the {role} program, but ranks 0..{workers - 1} are workers and "
                           f"{workers}..{size - 1} reducers; start workers first in the mpirun line")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    # Distributed: one gloo world for workers and reducers; a peer that stops answering ends a wait after
    # timeout_s instead of never.
    dist.init_process_group("gloo", rank=rank, world_size=size, timeout=dt.timedelta(seconds=timeout_s))
    info: list[Any] = [None] * size
    dist.all_gather_object(info, (role, node, socket.gethostname(), _env_int("OMPI_COMM_WORLD_LOCAL_RANK", 0)))
    roles = [r for r, *_ in info]
    if roles != ["worker"] * workers + ["reducer"] * reducers:
        raise RuntimeError(f"ranks disagree on who is a worker: {roles}")
    # Workers' nodes: as given (tests place ranks on pretend nodes), else OpenMPI's; reducers sit apart.
    given = [n for _, n, _, _ in info[:workers]]
    found = nodes_of([lr for *_, lr in info[:workers]])
    nodes = [g if g is not None else f for g, f in zip(given, found, strict=True)]
    nodes += [f"reducer{i}" for i in range(reducers)]
    # Distributed: every rank creates every group, in the same order (torch.distributed requires it).
    control = dist.new_group(list(range(size)), timeout=CONTROL_TIMEOUT)
    worker_group = dist.new_group(list(range(workers)))
    mine, node_group = [], None
    for ranks in node_groups(nodes[:workers]):
        group = dist.new_group(ranks) if len(ranks) > 1 else None
        if rank in ranks:
            mine, node_group = ranks, group
    return World(rank, workers, reducers, nodes, [h for _, _, h, _ in info], control, worker_group, node_group,
                 mine)


class PeerStopped(RuntimeError):
    """A peer (a reducer, a node leader, a worker) stopped answering: the job cannot go on."""


@contextlib.contextmanager
def answering(who: str):
    """Turns a failed or timed-out wait on `who` into one line naming it."""
    try:
        yield
    except RuntimeError as e:
        raise PeerStopped(f"{who} stopped answering ({_first_line(e)})") from None


# ---------------------------------------------------------------------------------------------- workers

WIRE = {False: torch.float32, True: torch.float16}


class ReducerEngine:
    """training/engine.py's interface over the reducer tier; rank and size count workers only."""

    name = "reducer"

    def __init__(self, reducers: int, *, bucket_bytes: int = BUCKET_BYTES, timeout_s: float = TIMEOUT_S,
                 node: str | None = None, place: tuple[int, int] | None = None) -> None:
        self.world = w = join("worker", reducers=reducers, node=node, timeout_s=timeout_s, place=place)
        self.timeout = dt.timedelta(seconds=timeout_s)
        self.bucket_bytes = bucket_bytes
        self.exit_on_peer_stop = True   # a dead peer ends this process (the trainer); False: finish() raises
        self.rank, self.size = w.rank, w.workers
        self.local_rank, self.local_size = w.node_ranks.index(w.rank), len(w.node_ranks)
        self.leader = w.node_ranks[0]
        self.is_leader = self.rank == self.leader
        self.bytes_sent = self.bytes_received = 0   # this worker's traffic with the reducers (node leaders)
        self.params: list[torch.Tensor] = []
        self.plan: list[list[int]] = []
        self.wire = torch.float32
        self._sync = True
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._ready: list[threading.Event] = []
        self._pending: list[int] = []
        self._lock = threading.Lock()

    # -- what the trainer calls

    def broadcast_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        # Distributed: parameters, buffers and optimizer state from worker 0, among the workers.
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0, group=self.world.worker_group)
        state = self.broadcast_object(optimizer.state_dict() if self.rank == 0 else None, "optimizer.state")
        if self.rank != 0:
            optimizer.load_state_dict(state)

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *, fp16_allreduce: bool,
                backward_passes_per_step: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        self.setup([p for p in model.parameters() if p.requires_grad], fp16_allreduce=fp16_allreduce)
        return model, optimizer

    def accumulate(self, model: torch.nn.Module) -> contextlib.AbstractContextManager:
        # Distributed: micro-batches before the last one only add up locally.
        @contextlib.contextmanager
        def no_sync():
            self._sync = False
            try:
                yield
            finally:
                self._sync = True
        return no_sync()

    def step(self, optimizer, scaler: torch.amp.GradScaler, static_scale: float | None) -> bool:
        from training.engine import scaled_step

        self.finish()  # Distributed: the gradients are now the mean over all workers
        return scaled_step(optimizer, scaler, static_scale)

    def allreduce(self, tensor: torch.Tensor, op: str, name: str) -> torch.Tensor:
        out = tensor.detach().clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=self.world.worker_group)
        return out / self.size if op == "mean" else out

    def broadcast_object(self, obj: Any, name: str) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.world.worker_group)
        return box[0]

    def shutdown(self) -> None:
        # Distributed: worker 0 tells every reducer to stop (they exit 0), then everyone leaves.
        if self.rank == 0:
            for r in range(self.world.workers, self.world.workers + self.world.reducers):
                dist.send(torch.tensor([STOP]), dst=r, group=self.world.control)
        dist.barrier(group=self.world.control)
        dist.destroy_process_group()

    # -- the reduction

    def setup(self, params: list[torch.Tensor], *, fp16_allreduce: bool) -> None:
        """Fix the buckets, tell the reducers their shapes, and hook every parameter's gradient."""
        self.params, self.wire = params, WIRE[fp16_allreduce]
        elem = torch.empty((), dtype=self.wire).element_size()
        self.plan = buckets([p.numel() for p in params], elem, self.bucket_bytes)
        if self.rank == 0:
            shape = {"buckets": [sum(params[i].numel() for i in b) for b in self.plan], "wire": str(self.wire),
                     "leaders": self.world.leaders}
            for r in range(self.world.workers, self.world.workers + self.world.reducers):
                dist.send_object_list([shape], dst=r, group=self.world.control)
        where = {i: b for b, ids in enumerate(self.plan) for i in ids}
        self._left = [len(b) for b in self.plan]
        for i, p in enumerate(params):
            p.register_post_accumulate_grad_hook(lambda _p, b=where[i]: self._grad_ready(b))

    def _grad_ready(self, bucket: int) -> None:
        if not self._sync:
            return
        with self._lock:
            if self._thread is None:
                self._begin()
            self._left[bucket] -= 1
            if self._left[bucket] == 0:
                self._ready[bucket].set()

    def _begin(self) -> None:
        self._ready = [threading.Event() for _ in self.plan]
        self._left = [len(b) for b in self.plan]
        self._error = None
        self._thread = threading.Thread(target=self._run, name="reducer-comm", daemon=True)
        self._thread.start()

    def finish(self) -> None:
        """Wait for this step's reduction (starting it for buckets whose gradients never came: zeros)."""
        with self._lock:
            if self._thread is None:
                self._begin()
            for event in self._ready:
                event.set()
        self._thread.join()
        self._thread = None
        if isinstance(self._error, PeerStopped) and self.exit_on_peer_stop:
            # Said already, in one line; no orderly shutdown, so mpirun stops the other ranks (distributed.leave).
            distributed.leave(1)
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            self._reduce_all()
        except BaseException as e:  # handed to the training thread by finish()
            self._error = e
            if isinstance(e, PeerStopped):  # said at once: mpirun may stop this process any moment now
                sys.stderr.write(f"error: {e}\n")  # one write: the leaders say it at the same time
                sys.stderr.flush()

    def _flat(self, bucket: list[int]) -> torch.Tensor:
        grads = [self.params[i].grad for i in bucket]
        parts = [g.reshape(-1) if g is not None else torch.zeros(self.params[i].numel(), device=self.params[i].device)
                 for i, g in zip(bucket, grads, strict=True)]
        # Scaled by 1/W before the wire: the reducers' sum is the mean, and fp16 does not overflow on the way.
        return torch.cat(parts).div_(self.size).to(device="cpu", dtype=self.wire)

    def _write(self, bucket: list[int], flat: torch.Tensor) -> None:
        offset = 0
        for i in bucket:
            p = self.params[i]
            chunk = flat[offset:offset + p.numel()].view(p.shape)
            offset += p.numel()
            if p.grad is None:
                p.grad = torch.empty_like(p)
            p.grad.copy_(chunk)

    def _reduce_all(self) -> None:
        w = self.world
        first = w.workers
        if self.rank == 0:
            # Distributed: tell every reducer a step is coming.
            for r in range(first, first + w.reducers):
                dist.send(torch.tensor([STEP]), dst=r, group=w.control)
        pending = []
        for b, bucket in enumerate(self.plan):
            self._ready[b].wait()
            flat = self._flat(bucket)
            # Distributed: reduce onto the node leader (NVLink on a GPU node), then its shards to the reducers.
            if w.node_group is not None:
                with answering(f"a worker of the node of {w.where(self.leader)}"):
                    dist.reduce(flat, dst=self.leader, group=w.node_group)
            if not self.is_leader:
                pending.append((b, None, []))
                continue
            out = torch.empty_like(flat)
            waits = []
            for i, (start, stop) in enumerate(shard_bounds(flat.numel(), w.reducers)):
                if stop == start:
                    continue
                waits.append((first + i, dist.isend(flat[start:stop], dst=first + i, tag=b)))
                waits.append((first + i, dist.irecv(out[start:stop], src=first + i, tag=b)))
                nbytes = (stop - start) * flat.element_size()
                self.bytes_sent += nbytes
                self.bytes_received += nbytes
            pending.append((b, out, waits))
        for b, out, waits in pending:
            for reducer, work in waits:
                with answering(f"reducer {w.where(reducer)}"):
                    work.wait(self.timeout)
            if w.node_group is not None:
                if out is None:
                    out = torch.empty(sum(self.params[i].numel() for i in self.plan[b]), dtype=self.wire)
                with answering(f"node leader {w.where(self.leader)}" if not self.is_leader
                               else f"a worker of the node of {w.where(self.leader)}"):
                    dist.broadcast(out, src=self.leader, group=w.node_group)
            self._write(self.plan[b], out)


def _first_line(e: BaseException) -> str:
    """The gist of a gloo error: its first sentence, without the source location."""
    lines = str(e).strip().splitlines()
    if not lines:
        return type(e).__name__
    return re.sub(r"^\[[^\]]*\]\s*", "", lines[0]).split(". ")[0][:160]


# ---------------------------------------------------------------------------------------------- reducers

def serve(world: World, *, die_after_steps: int | None = None, timeout_s: float = TIMEOUT_S) -> int:
    """Sum shard `world.rank - W` of every bucket over the node leaders, step after step, until STOP.
    Returns the number of steps served."""
    me = world.rank - world.workers
    timeout = dt.timedelta(seconds=timeout_s)
    box: list[Any] = [None]
    dist.recv_object_list(box, src=0, group=world.control)
    shape = box[0]
    wire = getattr(torch, shape["wire"].removeprefix("torch."))
    leaders = shape["leaders"]
    shards = [shard_bounds(n, world.reducers)[me] for n in shape["buckets"]]
    inbox = [[torch.empty(stop - start, dtype=wire) for _ in leaders] for start, stop in shards]
    control = torch.empty(1, dtype=torch.int64)
    steps = 0
    while True:
        with answering(f"worker {world.where(0)}"):
            dist.recv(control, src=0, group=world.control)
        if int(control) == STOP:
            break
        if die_after_steps is not None and steps >= die_after_steps:
            os.kill(os.getpid(), signal.SIGKILL)  # a crash, for the fault tests: no goodbye, no exit code
        # Distributed: post every receive of the step at once, so the leaders can send as fast as they like.
        recvs = [[dist.irecv(buf, src=leader, tag=b) for leader, buf in zip(leaders, inbox[b], strict=True)]
                 for b in range(len(shards)) if shards[b][1] > shards[b][0]]
        sends = []
        active = [b for b in range(len(shards)) if shards[b][1] > shards[b][0]]
        for b, works in zip(active, recvs, strict=True):
            for leader, work in zip(leaders, works, strict=True):
                with answering(f"worker {world.where(leader)}"):
                    work.wait(timeout)
            total = torch.zeros(inbox[b][0].numel(), dtype=torch.float32)
            for buf in inbox[b]:
                total += buf  # sums in fp32 whatever the wire carries
            reply = total.to(wire)
            sends += [dist.isend(reply, dst=leader, tag=b) for leader in leaders]
        for leader, work in zip(leaders * len(active), sends, strict=True):
            with answering(f"worker {world.where(leader)}"):
                work.wait(timeout)
        steps += 1
    dist.barrier(group=world.control)
    dist.destroy_process_group()
    return steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.reducer", description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int, required=True, help="worker ranks in the world (ranks 0..W-1)")
    p.add_argument("--timeout-s", type=float, default=TIMEOUT_S, help="seconds a worker may stay silent mid-step")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads for the sums; 0 = OMP_NUM_THREADS")
    p.add_argument("--die-after-steps", type=int, default=None, help=argparse.SUPPRESS)  # fault tests only
    args = p.parse_args(argv)
    if args.workers < 1:
        p.error(f"--workers must be >= 1, got {args.workers}")
    if args.threads:
        torch.set_num_threads(args.threads)
    rank = _env_int("OMPI_COMM_WORLD_RANK", _env_int("RANK", 0))
    try:
        world = join("reducer", workers=args.workers, timeout_s=args.timeout_s)
        serve(world, die_after_steps=args.die_after_steps, timeout_s=args.timeout_s)
    except RuntimeError as e:  # PeerStopped included; its gloo group is live (distributed.leave says why that matters)
        distributed.leave(1, f"error: reducer rank {rank}: {_first_line(e)}")
    except KeyboardInterrupt:  # Ctrl-C reaches the reducers too: the workers' rank 0 says it, they end quietly
        distributed.leave(130)
    return 0


if __name__ == "__main__":
    sys.exit(main())
