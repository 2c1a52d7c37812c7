"""Pure plans for a training run: hostfile, environment and the mpirun argv, from a cluster and a spec.

Golden-tested under tests/golden/; nothing here touches a server.
"""

from __future__ import annotations

import shlex

from pydantic import BaseModel, ConfigDict

from launcher.cluster import Cluster, Node


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
    workers: int = 2
    resume: bool = False
    extra_args: tuple[str, ...] = ()


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


def trainer_argv(python: str, spec: TrainSpec) -> list[str]:
    argv = [python, "-m", "training.train", "--data", spec.data, "--output", spec.output,
            "--model", spec.model, "--image-size", str(spec.image_size), "--epochs", str(spec.epochs),
            "--batch-per-gpu", str(spec.batch_per_gpu), "--workers", str(spec.workers)]
    if spec.warmup_epochs is not None:
        argv += ["--warmup-epochs", str(spec.warmup_epochs)]
    if spec.resume:
        argv.append("--resume")
    return argv + list(spec.extra_args)


def mpirun_argv(cluster: Cluster, nodes: list[Node], spec: TrainSpec, hostfile_path: str) -> list[str]:
    """The mpirun line the first node runs. MPI reaches the other nodes with the cluster's ssh_config."""
    ranks = sum(n.slots for n in nodes)
    argv = ["mpirun"]
    if cluster.user == "root":
        argv.append("--allow-run-as-root")
    argv += ["-np", str(ranks), "--hostfile", hostfile_path, "--bind-to", "none", "--map-by", "slot",
             "--mca", "plm_rsh_agent", f"ssh -F {cluster.ssh_config}",
             # Seed 003's line: the ob1 point-to-point layer, no InfiniBand verbs.
             "--mca", "pml", "ob1", "--mca", "btl", "^openib"]
    if cluster.mpi_interface:
        argv += ["--mca", "btl_tcp_if_include", cluster.mpi_interface,
                 "--mca", "oob_tcp_if_include", cluster.mpi_interface]
    for key, value in sorted(rank_env(cluster, nodes).items()):
        argv += ["-x", f"{key}={value}"]
    return argv + trainer_argv(cluster.python, spec)


def command_line(argv: list[str]) -> str:
    return shlex.join(argv)


def fabric_mpirun_argv(cluster: Cluster, nodes: list[Node], spec: TrainSpec, hostfile_path: str, *,
                       fabric_env: dict[str, str], mca: list[tuple[str, str]]) -> list[str]:
    """:func:`mpirun_argv` on a fabric: each of ``mca`` replaces the setting of that name (or is added), and
    ``fabric_env`` (EFA / NCCL variables, see launcher.efa) is forwarded with ``-x`` after the ranks' own env."""
    argv = mpirun_argv(cluster, nodes, spec, hostfile_path)
    trainer = trainer_argv(cluster.python, spec)
    head = argv[:len(argv) - len(trainer)]
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
    out += [arg for key, value in pending.items() for arg in ("--mca", key, value)]
    for key, value in sorted(fabric_env.items()):
        out += ["-x", f"{key}={value}"]
    return out + trainer
