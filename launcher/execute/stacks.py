"""Every rank's Python stack, before a stalled job is stopped (launcher/plans/hangs.py says where they are).

The job's step (jobstep.py) runs this module on each node of the allocation as a step of its own
(``srun --overlap``: Slurm lets it share the CPUs mpirun's step holds, https://slurm.schedmd.com/srun.html#OPT_overlap),
and the module, on the node, finds the ranks (the processes Open MPI started, with OMPI_COMM_WORLD_RANK in their
environment; a loader worker, a child of its rank with the same environment, is left out) and dumps each with
`py-spy dump` (https://github.com/benfred/py-spy), one JSON line per rank; a GPU rank's NCCL flight recorder is
asked for a dump first (launcher/plans/flightrec.py) and its newest collective added to the rank's line. A node that
does not answer within the timeout (frozen, hung in the kernel) gives no line: its ranks are "no stack" in the
summary.

py-spy attaches with ptrace. Root (the rehearsal nodes' jobs) may; a user may trace its own processes only where the
kernel's Yama ptrace_scope is 0, and Ubuntu's default is 1, descendants only
(https://www.kernel.org/doc/html/latest/admin-guide/LSM/Yama.html). The image does not yet lift that for the AWS
nodes' user (ptrace_scope 0, or CAP_SYS_PTRACE on py-spy): there a dump fails, the summary says "no stack", and the
ranks' recorded steps still say which ones are behind.

Run on a node as ``python -m launcher.execute.stacks``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

DUMP_TIMEOUT_S = 10
RECORDER_WAIT_S = 5  # a GPU rank's flight recorder dump, asked for before py-spy's dumps and written beside them


def py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def ranks_here() -> dict[int, int]:
    """rank -> pid of this node's rank processes (not their loader workers)."""
    found: dict[int, tuple[int, int, bytes]] = {}  # pid -> (rank, parent, command line)
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        rank = environment(int(entry.name)).get("OMPI_COMM_WORLD_RANK")
        if rank is None or not rank.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmdline = Path(entry.path, "cmdline").read_bytes()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        found[int(entry.name)] = (int(rank), parent, cmdline)
    out: dict[int, int] = {}
    for pid, (rank, parent, _) in sorted(found.items()):
        up = found.get(parent)
        # A child of its own rank is a loader worker, unless its parent is `launch run`'s wrapper: then it is the
        # user's command, the one that trains.
        if up is not None and up[0] == rank and b"launcher.execute.userrank" not in up[2]:
            continue
        if b"launcher.execute.userrank" in found[pid][2]:
            continue
        out.setdefault(rank, pid)
    return out


def dump(pid: int, tool: str) -> str | None:
    try:
        r = subprocess.run([tool, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=DUMP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout if r.returncode == 0 and r.stdout.strip() else None


def environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    return dict(e.decode(errors="replace").split("=", 1) for e in raw.split(b"\0") if b"=" in e)


def poke_recorder(pid: int, rank: int) -> tuple[str, float] | None:
    """Ask a GPU rank's NCCL flight recorder for a dump (launcher/plans/flightrec.py): one write to the pipe its
    watchdog made. (the dump's path, its modification time before), or None where the rank keeps no recorder."""
    from launcher.plans import flightrec

    env = environment(pid)
    stem = env.get("TORCH_NCCL_DEBUG_INFO_PIPE_FILE")
    out = env.get("TORCH_FR_DUMP_TEMP_FILE") or env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not stem or not out:
        return None
    pipe = Path(flightrec.pipe_path(stem, rank))
    if not pipe.is_fifo():
        return None
    target = flightrec.dump_path(out, rank)
    try:
        before = os.stat(target).st_mtime
    except OSError:
        before = 0.0
    try:  # O_NONBLOCK: no reader (the rank's watchdog gone) is ENXIO at once, not a wait
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        os.write(fd, b"1\n")
    os.close(fd)
    return target, before


def recorder_dump(poked: tuple[str, float] | None, deadline: float) -> str | None:
    """What the rank's recorder says (flightrec.summary) once its dump is newer than before the poke."""
    from launcher.plans import flightrec

    if poked is None:
        return None
    target, before = poked
    while True:
        try:
            if os.stat(target).st_mtime > before:
                time.sleep(0.2)  # the writer's last bytes
                return flightrec.summary(flightrec.load(Path(target).read_bytes())) or "NCCL: unreadable dump"
        except OSError:
            pass
        if time.monotonic() > deadline:
            return "NCCL: no dump within the time"
        time.sleep(0.1)


def main() -> int:
    node = socket.gethostname().split(".")[0]
    tool = py_spy()
    ranks = ranks_here()
    poked = {rank: poke_recorder(pid, rank) for rank, pid in ranks.items()}  # first: the dumps run beside py-spy
    deadline = time.monotonic() + RECORDER_WAIT_S
    if tool is None:
        for rank in sorted(ranks):
            print(json.dumps({"rank": rank, "node": node, "dump": None, "why": "py-spy is not installed",
                              "nccl": recorder_dump(poked[rank], deadline)}), flush=True)
        return 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(ranks)))) as pool:
        dumps = dict(zip(ranks, pool.map(lambda pid: dump(pid, tool), ranks.values()), strict=True))
    for rank in sorted(dumps):
        print(json.dumps({"rank": rank, "node": node, "dump": dumps[rank],
                          "nccl": recorder_dump(poked[rank], deadline)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())


# A node that does not answer within this is left out: well inside SlurmdTimeout (launcher/plans/slurm.py), after
# which Slurm ends the job itself, and long enough for srun's start and one py-spy dump per rank, in parallel.
SRUN_TIMEOUT_S = 20


def collect(hosts: list[str], job_id: str, out_dir: Path, last_steps: dict[int, int | None],
            rank_nodes: dict[int, str]) -> list[str]:
    """From the job's step: every node's ranks' stacks, kept in ``out_dir`` (rank-R.txt), and the summary's lines
    (launcher/plans/hangs.py). A node that does not answer within SRUN_TIMEOUT_S adds none."""
    from launcher.files import write_atomic
    from launcher.plans import hangs

    def one(host: str) -> list[dict]:
        argv = ["srun", "--overlap", f"--jobid={job_id}", "-N1", "-n1", f"--nodelist={host}", sys.executable, "-m",
                "launcher.execute.stacks"]
        try:
            r = subprocess.run(argv, capture_output=True, text=True, timeout=SRUN_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            return []
        got = []
        for line in r.stdout.splitlines():
            try:
                got.append(json.loads(line))
            except ValueError:
                continue
        return got

    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(32, len(hosts)))) as pool:
        found = [d for ds in pool.map(one, hosts) for d in ds]
    out_dir.mkdir(parents=True, exist_ok=True)
    ranks: dict[int, hangs.Rank] = {}
    for d in found:
        ranks[d["rank"]] = hangs.Rank(d["rank"], d["node"], d.get("dump"), last_steps.get(d["rank"]), d.get("nccl"))
        text = d.get("dump") or f"no stack: {d.get('why', 'py-spy failed')}\n"
        write_atomic(out_dir / f"rank-{d['rank']}.txt", text + (f"{d['nccl']}\n" if d.get("nccl") else ""))
    for rank, step in last_steps.items():  # ranks whose node gave nothing: known from their progress alone
        ranks.setdefault(rank, hangs.Rank(rank, rank_nodes.get(rank, "?"), None, step))
    lines = hangs.summary(ranks)
    write_atomic(out_dir / "summary.txt", "".join(f"{ln}\n" for ln in lines))
    return lines
