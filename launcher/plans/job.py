"""Pure plans for a training run: hostfile, environment and the mpirun argv, from a cluster and a spec.

Golden-tested under tests/golden/; nothing here touches a server.
"""

from __future__ import annotations

import shlex
from pathlib import PurePosixPath

from pydantic import BaseModel, ConfigDict

from ami import paths
from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.plans import loading

ENGINES = ("horovod", "ddp", "reducer")   # training/engine.py's; not imported from there, so plans need no torch
DDP_PORT = 29500               # the DDP rendezvous port on the first node


class TrainSpec(BaseModel):
    """What `launch train` asks the trainer to do (paths are as the nodes see them)."""

    model_config = ConfigDict(frozen=True)

    data: str
    output: str
    model: str = "resnet50"
    image_size: int = 224
    epochs: int = 90
    batch_per_gpu: int = 256
    warmup_epochs: float | None = None
    workers: int | None = None      # loader processes per rank; None: sized from the nodes (launcher.plans.loading)
    decode: str | None = None       # the trainer's --decode (cpu, gpu); None: the cost model's choice for the nodes
    threads: int | None = None      # torch threads per rank; None: sized from the nodes (GPU ranks) or the trainer's
    precision: str | None = None    # the trainer's --precision (fp16, bf16, fp32); None: its auto
    fp16_allreduce: bool = False    # fp16 gradient compression on the wire (the trainer's --fp16-allreduce)
    resume: bool = False
    engine: str = "horovod"         # horovod, ddp or reducer (training/engine.py)
    reducers: int = 0               # reducer processes (one per reducer node) with the reducer engine
    checkpoint_to: str | None = None  # s3://BUCKET/PREFIX: each checkpoint copied there (training/durable.py)
    aws_region: str | None = None   # the bucket's region, given to every AWS CLI call (the nodes have no AWS config)
    aws_cli: str | None = None      # the AWS CLI on the nodes by its absolute path (ami.paths.AWS_CLI on AWS)
    extra_args: tuple[str, ...] = ()


def checkpoint_store(cluster: Cluster, region: str | None) -> tuple[str, str]:
    """(region, AWS CLI path) the trainer's --checkpoint-to uses on the nodes. On AWS: the stack's region (the
    node subnet reaches S3 through the VPC's gateway endpoint, which serves its own Region only; see
    launcher/plans/staging.py ``_s3``) and the image's CLI (ami/paths.py). Locally: the region asked for, and on
    rehearsal nodes the image's CLI too (the recipe's aws-cli.sh installed it there); on loopback nodes the CLI
    beside the nodes' Python (the dev extra's)."""
    if cluster.aws:
        return cluster.aws.region, paths.AWS_CLI
    if not region:
        raise LaunchError("--checkpoint-to on a local cluster needs --region REGION (the bucket's)")
    if not cluster.shares_launcher_fs:
        return region, paths.AWS_CLI
    return region, str(PurePosixPath(cluster.python).parent / "aws")


def hostfile(nodes: list[Node]) -> str:
    """OpenMPI hostfile: one line per node, slots = its training ranks (GPUs on AWS)."""
    return "".join(f"{n.name} slots={n.slots}\n" for n in nodes)


def rank_env(cluster: Cluster, nodes: list[Node]) -> dict[str, str]:
    """Environment every rank gets (forwarded with mpirun -x)."""
    threads = max(1, min(n.cpus // n.slots for n in nodes))
    env = {
        "OMP_NUM_THREADS": str(threads),
        "PYTHONUNBUFFERED": "1",
        "HOROVOD_CYCLE_TIME": "1",
    }
    if cluster.mpi_interface:
        env["HOROVOD_GLOO_IFACE"] = cluster.mpi_interface
    return env


def engine_env(spec: TrainSpec, nodes: list[Node]) -> dict[str, str]:
    """DDP's rendezvous: the first node's private address (Horovod needs nothing, MPI tells it everything)."""
    if spec.engine not in ("ddp", "reducer"):
        return {}
    return {"MASTER_ADDR": nodes[0].address, "MASTER_PORT": str(DDP_PORT)}


def sized(spec: TrainSpec, nodes: list[Node]) -> TrainSpec:
    """``spec`` with the loader processes, torch threads and decode path it left out sized from the nodes, as
    launcher.plans.loading decides for the cost model too (GPU ranks: one loader process per physical core of their
    share; decoding on the GPU where those fall short, decode_for)."""
    if spec.workers is not None and spec.threads is not None and spec.decode is not None:
        return spec
    ranked = [n for n in nodes if n.slots > 0]
    if not ranked:
        return spec
    plan = loading.for_share(min(n.cpus // n.slots for n in ranked), gpus=all(n.gpus > 0 for n in ranked))
    return spec.model_copy(update={"workers": plan.workers_per_rank if spec.workers is None else spec.workers,
                                   "threads": plan.threads_per_rank if spec.threads is None else spec.threads,
                                   "decode": decode_for(spec, ranked) if spec.decode is None else spec.decode})


def decode_for(spec: TrainSpec, nodes: list[Node]) -> str:
    """The trainer's --decode on these nodes: the cost model's choice (launcher.plans.loading.decode_path) where it
    models the run (ResNet-50 at 224 px on one catalog GPU type), for full-size shards (the launcher does not read
    the manifest; on --resize 256 shards the CPUs decode 1.7x as many, so a GPU path chosen here is at most the
    0.84 against 0.91 measured on an H200); "cpu" elsewhere."""
    types = {n.instance_type for n in nodes}
    if spec.model != "resnet50" or spec.image_size != 224 or len(types) != 1 or None in types:
        return "cpu"
    from infra.catalog import UnknownInstanceType, get
    from launcher.cost.inputs import imagenet
    from launcher.cost.model import estimate

    try:
        instance = get(types.pop())
    except UnknownInstanceType:
        return "cpu"
    return estimate(instance, len(nodes), imagenet(1)).decode if instance.gpus else "cpu"


def trainer_argv(python: str, spec: TrainSpec) -> list[str]:
    workers = loading.CPU_RANK_WORKERS if spec.workers is None else spec.workers
    argv = [python, "-m", "training.train", "--data", spec.data, "--output", spec.output,
            "--model", spec.model, "--image-size", str(spec.image_size), "--epochs", str(spec.epochs),
            "--batch-per-gpu", str(spec.batch_per_gpu), "--workers", str(workers)]
    if spec.threads is not None:
        argv += ["--threads", str(spec.threads)]
    if spec.decode == "gpu":  # "cpu" is the trainer's default
        argv += ["--decode", "gpu"]
    if spec.precision is not None:
        argv += ["--precision", spec.precision]
    if spec.fp16_allreduce:
        argv.append("--fp16-allreduce")
    if spec.warmup_epochs is not None:
        argv += ["--warmup-epochs", str(spec.warmup_epochs)]
    if spec.resume:
        argv.append("--resume")
    if spec.engine != "horovod":
        argv += ["--engine", spec.engine]
    if spec.reducers:
        argv += ["--reducers", str(spec.reducers)]
    if spec.checkpoint_to:
        argv += ["--checkpoint-to", spec.checkpoint_to, "--aws-region", spec.aws_region or "",
                 "--aws-cli", spec.aws_cli or ""]
    return argv + list(spec.extra_args)


def mpirun_head(cluster: Cluster) -> list[str]:
    """How every mpirun line of the launcher starts: the cluster's mpirun by absolute path and, where it is not the
    system's, ``--prefix`` for the remote orted (see Cluster.mpirun: a node's non-login shell has no PATH to the
    image's Open MPI). Never a bare ``mpirun``."""
    head = [cluster.mpirun] + (["--prefix", cluster.mpi_prefix] if cluster.mpi_prefix else [])
    return head + (["--allow-run-as-root"] if cluster.user == "root" else [])


def mpirun_argv(cluster: Cluster, nodes: list[Node], spec: TrainSpec, hostfile_path: str) -> list[str]:
    """The mpirun line the first node runs. MPI reaches the other nodes with the cluster's ssh_config."""
    spec = sized(spec, nodes)
    ranks = sum(n.slots for n in nodes)
    argv = mpirun_head(cluster)
    argv += ["-np", str(ranks), "--hostfile", hostfile_path, "--bind-to", "none", "--map-by", "slot",
             "--mca", "plm_rsh_agent", f"ssh -F {cluster.mpi_ssh_config}",
             # Seed 003's line: the ob1 point-to-point layer, no InfiniBand verbs.
             "--mca", "pml", "ob1", "--mca", "btl", "^openib"]
    if cluster.mpi_interface:
        argv += ["--mca", "btl_tcp_if_include", cluster.mpi_interface,
                 "--mca", "oob_tcp_if_include", cluster.mpi_interface]
    env = rank_env(cluster, nodes) | engine_env(spec, nodes)
    if spec.engine == "ddp" and cluster.mpi_interface:
        # gloo binds to the address its host name resolves to, loopback when it resolves to nothing (a rehearsal
        # node has no DNS for its name), and its peers then dial 127.0.0.1: name the interface, as the reducer tier
        # does. "GLOO_SOCKET_IFNAME, for example export GLOO_SOCKET_IFNAME=eth0" (PyTorch, torch.distributed,
        # "Choosing the network interface to use": https://pytorch.org/docs/stable/distributed.html).
        env["GLOO_SOCKET_IFNAME"] = cluster.mpi_interface
    for key, value in sorted(env.items()):
        argv += ["-x", f"{key}={value}"]
    return argv + trainer_argv(cluster.python, spec)


def command_line(argv: list[str]) -> str:
    return shlex.join(argv)


def _with_mca(head: list[str], mca: list[tuple[str, str]]) -> list[str]:
    """``head`` (an mpirun line without its program) with each of ``mca`` replacing the setting of that name, or
    added after the existing ones, before the first ``-x``."""
    pending = dict(mca)
    out: list[str] = []
    i = 0
    while i < len(head):
        if head[i] == "--mca" and head[i + 1] in pending:
            out += ["--mca", head[i + 1], pending.pop(head[i + 1])]
            i += 3
            continue
        if head[i] == "-x" and pending:  # new MCA settings go after the existing ones, before the env
            out += [arg for key, value in pending.items() for arg in ("--mca", key, value)]
            pending.clear()
        out.append(head[i])
        i += 1
    return out + [arg for key, value in pending.items() for arg in ("--mca", key, value)]


def fabric_mpirun_argv(cluster: Cluster, nodes: list[Node], spec: TrainSpec, hostfile_path: str, *,
                       fabric_env: dict[str, str], mca: list[tuple[str, str]]) -> list[str]:
    """:func:`mpirun_argv` on a fabric: each of ``mca`` replaces the setting of that name (or is added), and
    ``fabric_env`` (EFA / NCCL variables, see launcher.plans.efa) is forwarded with ``-x`` after the ranks' own env."""
    spec = sized(spec, nodes)
    argv = mpirun_argv(cluster, nodes, spec, hostfile_path)
    trainer = trainer_argv(cluster.python, spec)
    out = _with_mca(argv[:len(argv) - len(trainer)], mca)
    for key, value in sorted(fabric_env.items()):
        out += ["-x", f"{key}={value}"]
    return out + trainer


def launch_argv(cluster: Cluster, workers: list[Node], reducers: list[Node], spec: TrainSpec, hostfile_path: str,
                *, fabric_env: dict[str, str], mca: list[tuple[str, str]]) -> list[str]:
    """The one mpirun line of a run: the workers alone, or with the reducer tier (MPMD) when there are reducers.
    ``fabric_env`` and ``mca`` come from launcher.plans.efa (empty on the local cluster and on types without EFA)."""
    if reducers:
        return mpmd_mpirun_argv(cluster, workers, reducers, spec, hostfile_path, fabric_env=fabric_env, mca=mca)
    return fabric_mpirun_argv(cluster, workers, spec, hostfile_path, fabric_env=fabric_env, mca=mca)


def reducer_argv(python: str, workers: int) -> list[str]:
    """The reducer program (training/reducer.py) of the reducer tier, told how many worker ranks come first."""
    return [python, "-m", "training.reducer", "--workers", str(workers)]


def mpmd_hostfile(workers: list[Node], reducers: list[Node]) -> str:
    """The hostfile of a run with a reducer tier: the workers' slots, then one slot per reducer node."""
    return hostfile(workers) + "".join(f"{n.name} slots=1\n" for n in reducers)


def mpmd_mpirun_argv(cluster: Cluster, workers: list[Node], reducers: list[Node], spec: TrainSpec,
                     hostfile_path: str, *, fabric_env: dict[str, str] | None = None,
                     mca: list[tuple[str, str]] = ()) -> list[str]:
    """One mpirun for the reducer tier (seed 004), OpenMPI's MPMD colon syntax: the trainer on the worker nodes'
    slots (ranks 0..W-1), then the reducer program once on each reducer node (ranks W..W+K-1). Environment is
    per program in OpenMPI, so each gets its own ``-x``; reducers get the threads of their own nodes.

    ``mca`` applies to the whole job (MPI's own traffic stays on TCP); ``fabric_env`` (the GPU nodes' EFA / NCCL
    variables) goes to the workers only: the reducers (CPU nodes) run gloo over TCP and load no NCCL."""
    if not reducers or spec.reducers != len(reducers) or spec.engine != "reducer":
        raise ValueError(f"the reducer tier needs engine 'reducer' and spec.reducers == {len(reducers)} reducer "
                         f"node(s); got engine '{spec.engine}' and reducers={spec.reducers}")
    spec = sized(spec, workers)
    ranks = sum(n.slots for n in workers)
    argv = mpirun_head(cluster)
    argv += ["--hostfile", hostfile_path, "--bind-to", "none", "--map-by", "slot",
             "--mca", "plm_rsh_agent", f"ssh -F {cluster.mpi_ssh_config}",
             "--mca", "pml", "ob1", "--mca", "btl", "^openib"]
    if cluster.mpi_interface:
        argv += ["--mca", "btl_tcp_if_include", cluster.mpi_interface,
                 "--mca", "oob_tcp_if_include", cluster.mpi_interface]
    argv = _with_mca(argv, list(mca))
    rendezvous = engine_env(spec, workers)
    worker_env = rank_env(cluster, workers) | rendezvous | dict(fabric_env or {})
    reducer_env = rank_env(cluster, workers) | rendezvous | {"OMP_NUM_THREADS": str(min(n.cpus for n in reducers))}
    if cluster.mpi_interface:  # gloo's own sockets stay on the MPI interface too
        worker_env["GLOO_SOCKET_IFNAME"] = reducer_env["GLOO_SOCKET_IFNAME"] = cluster.mpi_interface
    for count, nodes, env, program in (
            (ranks, workers, worker_env, trainer_argv(cluster.python, spec)),
            (len(reducers), reducers, reducer_env, reducer_argv(cluster.python, ranks))):
        if nodes is reducers:
            argv.append(":")
        argv += ["-np", str(count), "-host", ",".join(f"{n.name}:{n.slots if nodes is workers else 1}"
                                                       for n in nodes)]
        for key, value in sorted(env.items()):
            argv += ["-x", f"{key}={value}"]
        argv += program
    return argv
