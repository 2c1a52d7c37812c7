"""`launch run`: the user's own command on every node, as pure decisions: which files of the working directory go to
the shared storage (only what changed since the last run), the environment a torchrun script reads, and the mpirun
line of the Slurm job that starts one process per GPU (per slot on CPU nodes).

The variables are torchrun's (https://pytorch.org/docs/stable/elastic/run.html, "Environment Variables": RANK,
LOCAL_RANK, GROUP_RANK, ROLE_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_RUN_ID), made from the ones Open MPI gives every process it starts
(mpirun(1), "Exported Environment Variables": OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_LOCAL_RANK,
OMPI_COMM_WORLD_LOCAL_SIZE), so a script written for torchrun runs unchanged, and a Horovod script's hvd.init()
finds its MPI world as under any mpirun.
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from launcher.cluster import Cluster, Node

# What a working directory holds that no node needs: version control, caches, local environments (SkyPilot leaves
# out what .gitignore names; here these and the patterns of the directory's own IGNORE_FILE).
DEFAULT_IGNORE = (".git", ".hg", ".svn", "__pycache__", "*.pyc", ".venv", "venv", "node_modules", ".mypy_cache",
                  ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints", ".DS_Store", ".scaletrain-sync.json")
IGNORE_FILE = ".scaletrainignore"            # one fnmatch pattern per line; '#' starts a comment
MANIFEST = ".scaletrain-sync.json"           # in the copy on the shared storage: what was sent, with sizes and times
MAX_SYNC_BYTES = 2 * 2**30                   # a working directory is code, not data: more is refused
MASTER_PORT = 29500                          # torchrun's default --master-port
ENGINES = ("horovod", "ddp", "reducer")


def ignore_patterns(ignore_file_text: str | None) -> tuple[str, ...]:
    extra = []
    for line in (ignore_file_text or "").splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            extra.append(line.rstrip("/"))
    return DEFAULT_IGNORE + tuple(extra)


def ignored(relpath: str, patterns: tuple[str, ...]) -> bool:
    """Is ``relpath`` (POSIX, relative to the working directory) or one of its folders left out?"""
    parts = PurePosixPath(relpath).parts
    for pattern in patterns:
        if "/" in pattern:  # anchored at the working directory, one folder per '/' (a '*' never crosses one)
            pp = PurePosixPath(pattern.lstrip("/")).parts
            head = parts[:len(pp)]
            if len(head) == len(pp) and all(fnmatch.fnmatchcase(a, b) for a, b in zip(head, pp, strict=True)):
                return True
        elif any(fnmatch.fnmatchcase(part, pattern) for part in parts):
            return True
    return False


@dataclass(frozen=True)
class SyncPlan:
    send: tuple[str, ...]                    # new or changed files
    delete: tuple[str, ...]                  # files of the last copy the working directory no longer has
    unchanged: int
    send_bytes: int


def sync_plan(local: dict[str, tuple[int, int]], remote: dict[str, tuple[int, int]]) -> SyncPlan:
    """What to copy: ``local`` and ``remote`` map a relative path to (size, mtime in ns), the remote side as the last
    sync recorded it. A file whose size or modification time differs is sent again (rsync's quick check)."""
    send = tuple(sorted(p for p, stat in local.items() if remote.get(p) != tuple(stat)))
    delete = tuple(sorted(p for p in remote if p not in local))
    return SyncPlan(send, delete, len(local) - len(send), sum(local[p][0] for p in send))


def workdir_name(path: str, host: str) -> str:
    """The copy's folder under the shared storage's work/: the directory's name and a hash of where it is (two
    checkouts named alike stay apart; the same one is synced into the same copy each time)."""
    name = re.sub(r"[^A-Za-z0-9._-]", "_", PurePosixPath(path).name or "root")[:40]
    return f"{name}-{hashlib.sha256(f'{host}:{path}'.encode()).hexdigest()[:8]}"


def torchrun_env(ompi: dict[str, str], *, job_id: str = "", restarts: str = "0", reducers: int = 0) -> dict[str, str]:
    """The torchrun variables of one process, from Open MPI's. Ranks fill node after node (--map-by slot with the
    same slots on every node), so a process's node is its rank divided by the processes per node. With ``reducers``
    (the reducer tier's MPMD world: the workers, then the reducers), WORLD_SIZE counts the workers only, as
    training/distributed.py reads it."""
    try:
        rank, size = int(ompi["OMPI_COMM_WORLD_RANK"]), int(ompi["OMPI_COMM_WORLD_SIZE"])
        local_rank, local_size = int(ompi["OMPI_COMM_WORLD_LOCAL_RANK"]), int(ompi["OMPI_COMM_WORLD_LOCAL_SIZE"])
    except (KeyError, ValueError) as e:
        raise ValueError(f"not started by Open MPI's mpirun (no {e} in the environment)") from None
    node = str(rank // max(local_size, 1))
    size -= reducers
    return {"RANK": str(rank), "WORLD_SIZE": str(size), "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_size), "NODE_RANK": node, "GROUP_RANK": node, "ROLE_RANK": str(rank),
            "ROLE_WORLD_SIZE": str(size), "ROLE_NAME": "default", "TORCHELASTIC_RESTART_COUNT": restarts or "0",
            "TORCHELASTIC_RUN_ID": job_id or "none"}


def procs_per_node(node: Node, asked: int | None) -> int:
    """One process per GPU (per slot on CPU nodes), or what --procs-per-node asks."""
    if asked is None:
        return node.slots
    if asked < 1:
        raise ValueError(f"--procs-per-node must be >= 1, got {asked}")
    # Slurm gives a task at least one CPU (sbatch(1), --ntasks-per-node with CR_Core): more processes than the node
    # has vCPUs would leave the job pending for ever (Reason=PartitionConfig on dynamic nodes).
    if asked > node.cpus:
        raise ValueError(f"--procs-per-node {asked} is more than the {node.cpus} vCPU(s) of {node.name}; "
                         f"at most {node.cpus}")
    return asked


def run_mpirun(cluster: Cluster, workers: list[Node], *, procs: int, workdir: str, output: str, command: list[str],
               engine: str, fabric_env: dict[str, str], mca: list[tuple[str, str]],
               checkpoint_to: str | None = None, reducers: list[Node] = (),
               requirements_set: str | None = None) -> list[str]:
    """The mpirun line of a `launch run` job (inside the allocation; launcher/plans/slurm.job_mpirun's settings):
    each process starts launcher.execute.userrank, which sets the torchrun variables and runs ``command`` from the
    synced ``workdir`` with the image's Python first on PATH. MASTER_ADDR and MASTER_PORT are the job step's (the
    allocation's first node, as Slurm has it after a replacement), forwarded by name. ``requirements_set``: the
    document of the job's own environment on the shared storage (launcher/plans/requirements.py), made or found by
    each process before the command runs."""
    from launcher.plans import job, slurm

    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    if (engine == "reducer") != bool(reducers):
        raise ValueError("the reducer engine needs reducer nodes (--reducers K), and only it takes them")
    sized = [n.model_copy(update={"slots": procs}) for n in workers]
    # The ddp engine's line: a rendezvous and, on the cluster's MPI interface, gloo's own sockets (a rehearsal node's
    # name resolves to nothing, and gloo would bind loopback), what a torchrun script needs whichever engine it uses.
    # (No trainer here: its loader workers and threads are set so nothing sizes them from the nodes' vCPUs.)
    # With reducers: the reducer tier's MPMD line (launcher/plans/job.mpmd_mpirun_argv), the workers' program ours.
    spec = job.TrainSpec(data="", output=output, engine="reducer" if reducers else "ddp", workers=0, threads=1,
                         reducers=len(reducers))
    argv = slurm.job_mpirun(cluster, sized, spec, fabric_env=fabric_env, mca=mca, reducers=list(reducers))
    trainer = job.trainer_argv(cluster.python, spec)
    at = next(i for i in range(len(argv)) if argv[i:i + len(trainer)] == trainer)
    env = {"SCALETRAIN_ENGINE": engine, "SCALETRAIN_OUTPUT": output, "SCALETRAIN_WORKDIR": workdir,
           # where training.distributed records each step (training/progress.py), read by the job's step
           # (launcher/execute/progresswatch.py) to name a straggler, as the trainer's run directory is
           "SCALETRAIN_PROGRESS_DIR": f"{output.rstrip('/')}/progress"}
    if reducers:
        env["SCALETRAIN_REDUCERS"] = str(len(reducers))
    if checkpoint_to:
        env["SCALETRAIN_CHECKPOINT_TO"] = checkpoint_to
    ours = [a for key, value in sorted(env.items()) for a in ("-x", f"{key}={value}")]
    ours += ["-x", "SCALETRAIN_RESTART_COUNT", "-x", "SLURM_JOB_ID"]
    ours += [cluster.python, "-m", "launcher.execute.userrank", "--workdir", workdir,
             "--python-bin", str(PurePosixPath(cluster.python).parent), "--reducers", str(len(reducers)),
             *(["--requirements-set", requirements_set] if requirements_set else []), "--", *command]
    return argv[:at] + ours + argv[at + len(trainer):]

