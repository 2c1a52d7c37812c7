"""The step of a Slurm training job: what its batch script (launcher/plans/slurm.batch_script) runs on the first node
of the allocation. It runs on the cluster, so nothing here depends on the launcher that submitted the job.

1. It says which attempt this is (Slurm counts restarts in SLURM_RESTART_COUNT) and ends the job when the bound
   (--max-restarts) is spent.
2. It writes the hostfile from the allocation (`scontrol show hostnames`), with the nodes' slots.
3. It runs the run's mpirun line, adding the trainer's --resume when Slurm restarted the job, and prints what it
   prints (the job's output file). No output for --stall-timeout seconds ends it (a rank stuck in a collective).
   Before it, every attempt's first act on the nodes: the node check (launcher/execute/nodecheck.py), a ring of pairs
   over the allocation; a node that falls short of its type's figure is drained with the reason and the job requeued.
4. When mpirun fails, the decisions of launcher/plans/restarts.py say whether a node was lost and a restart is due:
   then the lost nodes are set DOWN (a replacement that registers under the same name returns them, ReturnToService=2)
   and the job is requeued (`scontrol requeue`); Slurm starts it again when the allocation is whole. A failure the
   trainer named itself is not retried: the job fails with the trainer's line.

Run as ``python -m launcher.execute.jobstep [options] -- MPIRUN ...``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from launcher.cluster import Node
from launcher.execute import restartlog
from launcher.files import write_atomic
from launcher.plans import faults, restarts

PROBE_TIMEOUT_S = 10


def say(line: str) -> None:
    print(f"[job] {line}", flush=True)


def hosts_of(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=True)
    return out.stdout.split()


def node_records(hosts: list[str]) -> dict[str, dict[str, str]]:
    """Each node's record as the controller has it (`scontrol show node`)."""
    from launcher.plans import slurm

    out = subprocess.run(["scontrol", "--oneliner", "show", "node", ",".join(hosts)], capture_output=True,
                         text=True)
    return {f["NodeName"]: f for f in map(slurm.fields, out.stdout.splitlines()) if "NodeName" in f}


def node_addresses(hosts: list[str]) -> dict[str, str]:
    """Each node's address as the controller has it (NodeAddr): where its slurmd answers."""
    return {name: f.get("NodeAddr") or name for name, f in node_records(hosts).items()}


def split_roles(hosts: list[str], reducers: int) -> tuple[list[str], list[str]]:
    """(workers, reducers) of the allocation, by each node's Feature (plans/slurm.node_conf)."""
    from launcher.plans import slurm

    if not reducers:
        return hosts, []
    records = node_records(hosts)
    ours = [h for h in hosts if slurm.REDUCER_FEATURE in records.get(h, {}).get("AvailableFeatures", "").split(",")]
    return [h for h in hosts if h not in ours], ours


def with_hosts(argv: list[str], groups: list[str]) -> list[str]:
    """The MPMD mpirun line with its app contexts' -host lists (workers, then reducers) set to ``groups``: the nodes
    Slurm allocated, which need not be those named when the job was submitted."""
    out, k = list(argv), 0
    for i, a in enumerate(argv[:-1]):
        if a == "-host" and k < len(groups):
            out[i + 1] = groups[k]
            k += 1
    return out


def with_resume(argv: list[str]) -> list[str]:
    """The run's mpirun line with the trainer's --resume. In an MPMD line (reducers) it ends the workers' app context,
    before Open MPI's ":" (mpirun(1), "Multiple Instruction Multiple Data"); training.reducer takes no --resume."""
    at = argv.index(":") if ":" in argv else len(argv)
    return [*argv[:at], "--resume", *argv[at:]]


def unreachable(hosts: list[str]) -> dict[str, str]:
    """The allocation's nodes whose slurmd no longer accepts a connection at the address the job ran with (each
    probed at once, within PROBE_TIMEOUT_S). Slurm's own word, NOT_RESPONDING, takes up to SlurmdTimeout; SSH
    between nodes is not what a Slurm job relies on."""
    from launcher.plans import slurm

    addresses = node_addresses(hosts)

    def probe(host: str) -> tuple[str, str | None]:
        address = addresses.get(host, host)
        try:
            with socket.create_connection((address, slurm.SLURMD_PORT), timeout=PROBE_TIMEOUT_S):
                return host, None
        except OSError as e:
            return host, f"slurmd at {address}:{slurm.SLURMD_PORT}: {e.strerror or e}"
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
        return {h: why for h, why in pool.map(probe, hosts) if why}


WHOLE_WITHIN_S = 90.0


def wait_whole(hosts: list[str], timeout_s: float | None = None) -> dict[str, str]:
    """Wait until every allocated node's slurmd answers at the address the controller has for it; what still does
    not answer after ``timeout_s`` (WHOLE_WITHIN_S, as it is when called). A replacement registers under its
    predecessor's name before it has set its own NodeAddr (plans/slurm_rejoin.rejoin_commands: Slurm 22.05 keeps a
    dynamic node's old address), and the controller may start a requeued job on it in between: mpirun's daemons would
    then be sent to the lost instance's address."""
    deadline = time.monotonic() + (WHOLE_WITHIN_S if timeout_s is None else timeout_s)
    while True:
        silent = unreachable(hosts)
        if not silent or time.monotonic() > deadline:
            return silent
        say(f"waiting for {', '.join(sorted(silent))} to answer at the address Slurm has for it")
        time.sleep(2)


def show(*what: str) -> dict[str, str]:
    """One `scontrol show` record's fields ({} when Slurm does not answer)."""
    from launcher.plans import slurm

    out = subprocess.run(["scontrol", "--oneliner", "show", *what], capture_output=True, text=True)
    return slurm.fields(out.stdout.strip().splitlines()[0]) if out.returncode == 0 and out.stdout.strip() else {}


def replaced_since(node: str, job_id: str) -> bool:
    """Has ``node``'s slurmd registered since the job started (an Auto Scaling group's replacement, quicker than the
    job's step to see the loss)? Both times are the controller's."""
    slurmd_started = show("node", node).get("SlurmdStartTime", "")
    job_started = show("job", job_id).get("StartTime", "")
    # ISO 8601 of one clock: the text orders as the time does.
    return bool(slurmd_started and job_started and slurmd_started[:1].isdigit() and slurmd_started >= job_started)


def newest_checkpoint_epoch(output: Path) -> int | None:
    """The epoch of the newest complete checkpoint in the run directory (what --resume starts after), or None."""
    from launcher.execute import results

    try:
        files = [results.RemoteFile(p.name, p.stat().st_size) for p in output.iterdir() if p.is_file()]
    except OSError:
        return None
    return results.resumes_after(results.checkpoint_index(files))


def _record_unrecorded_loss(output: Path, restart: int) -> None:
    """If the previous attempt's step died with its node (its batch host), its restart is in no record: write it
    now, naming that node; then note this attempt's batch host for the next one."""
    marker = output / restarts.BATCH_HOST_FILE
    history = restartlog.history(output)
    try:
        before = marker.read_text().split()[0]
    except (OSError, IndexError):
        before = None
    missing = restarts.unrecorded_loss(history, restart, before, newest_checkpoint_epoch(output))
    if missing is not None:
        restartlog.append(output, history, missing)
        say(f"attempt {restart}'s step was on {before or 'a node'}, which was lost; recorded")
    with contextlib.suppress(OSError):
        write_atomic(marker, f"{socket.gethostname()} {restart}\n")


def run_step(argv: list[str], stall_s: float, on_stall: Callable[[], None] | None = None,
             halt: Callable[[], str | None] | None = None) -> tuple[int, list[str], str | None]:
    """Run mpirun, relaying its lines; (exit code, lines, why it was stopped when the stall timeout or ``halt`` did).
    ``on_stall`` runs before a stalled run is stopped (the ranks' stacks are taken then); ``halt``, asked about once
    a second, says why to stop the run now (the budget spent: launcher/execute/budget.py; a straggler drained:
    launcher/execute/stragglerdrain.py)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                            start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    # Slurm's scancel, or a user's pkill on a node whose head node is lost, ends the step with SIGTERM: mpirun runs
    # in a session of its own, so it is stopped with it rather than left running.
    signal.signal(signal.SIGTERM, lambda *_: (_end(proc), sys.exit(143)))
    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    last = asked = time.monotonic()
    stopped = None
    while True:
        if halt is not None and stopped is None and time.monotonic() - asked >= 1.0:
            asked = time.monotonic()
            if why := halt():
                stopped = why
                say(f"{why}; stopping the run")
                _end(proc)
        try:
            line = lines.get(timeout=1.0)
        except queue.Empty:
            if stall_s and time.monotonic() - last > stall_s and stopped is None:
                stopped = f"the job printed nothing for {stall_s:g} s (--stall-timeout): a rank stuck in a collective"
                if on_stall is not None:
                    say(f"{stopped}; taking every rank's stack before stopping it")
                    try:
                        on_stall()
                    except Exception as e:  # the stacks are advice: the stop goes ahead
                        say(f"could not take the ranks' stacks: {e}")
                say(f"{stopped}; stopping it")
                _end(proc)
            continue
        if line is None:
            break
        last = time.monotonic()
        sys.stdout.write(line)
        sys.stdout.flush()
        seen.append(line.rstrip("\n"))
        seen = seen[-2000:]
    return proc.wait(), seen, stopped


def _end(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM to mpirun's process group, SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait or 5)
            return
        except subprocess.TimeoutExpired:
            continue


def _refuse_short_nodes(hosts: list[str], job_id: str, restart: int, a: argparse.Namespace) -> int | None:
    """Before the first step of every attempt: the node check (launcher/execute/nodecheck.py). A node that falls
    short is drained with its figures and the job requeued (a restart like a lost node's, in the run's record), to
    start again on the nodes that pass and the drained node's replacement; None when every node passes."""
    from launcher.execute import nodecheck

    short = nodecheck.refuse_short(hosts, node_addresses(hosts), job_id, say)
    if not short:
        return None
    output = Path(a.output)
    why = "; ".join(s.reason() for s in short)
    if restart >= a.max_restarts:
        print(f"error: job {job_id} refused {', '.join(s.node for s in short)} ({why}) and has no restart left "
              f"(--max-restarts {a.max_restarts}); the node is drained", flush=True)
        return 1
    newest = newest_checkpoint_epoch(output)
    step = restarts.Restart(attempt=restart + 1, why=why, lost=[s.node for s in short],
                            resumed_from_epoch=newest + 1 if newest is not None else 0, epochs_lost=0.0, progress=None)
    restartlog.append(output, restartlog.history(output), step)
    say(f"requeueing job {job_id} (restart {restart + 1} of {a.max_restarts}) without "
        f"{', '.join(s.node for s in short)}, before its first step")
    if (refused := restartlog.requeue(job_id, pending_ok=False)) is not None:
        print(f"error: Slurm would not requeue job {job_id}: {refused}", flush=True)
    return 1


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.execute.jobstep")
    p.add_argument("--max-restarts", type=int, default=0)
    p.add_argument("--stall-timeout", type=float, default=0.0)
    p.add_argument("--slots", type=int, required=True)
    p.add_argument("--hostfile", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--shared-memory-gib", type=float, default=None)
    p.add_argument("--rendezvous-port", type=int, default=None,
                   help="export MASTER_ADDR (the allocation's first node) and MASTER_PORT for mpirun to forward")
    p.add_argument("--reducers", type=int, default=0, help="reducer nodes in the allocation (an MPMD mpirun line)")
    p.add_argument("--no-resume", action="store_true",
                   help="add no --resume to a restarted job: a user's command (launch run) reads "
                        "SCALETRAIN_RESTART_COUNT instead")
    p.add_argument("--no-node-check", action="store_true",
                   help="start without the ring bandwidth test that drains a slow node (launcher/plans/nodecheck.py)")
    p.add_argument("--on-straggler", choices=("warn", "drain"), default="warn",
                   help="drain: drain a straggler, stop at its next checkpoint, requeue (launcher/plans/draining.py)")
    from launcher.execute import budget as spend

    spend.add_options(p)  # --max-cost: the run stops at the cap with a checkpoint (launcher/plans/budget.py)
    p.add_argument("mpirun", nargs=argparse.REMAINDER)
    a = p.parse_args(args)
    mpirun = a.mpirun[1:] if a.mpirun[:1] == ["--"] else a.mpirun
    job_id = os.environ.get("SLURM_JOB_ID", "?")
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    hosts = hosts_of(os.environ.get("SLURM_JOB_NODELIST", ""))
    say(f"job {job_id}, attempt {restart + 1} (at most {a.max_restarts + 1}), on {', '.join(hosts)}")
    if restart > a.max_restarts:
        print(f"error: job {job_id} was restarted {restart} time(s), more than --max-restarts {a.max_restarts}; "
              f"not running it again", flush=True)
        return 1
    workers, reducer_hosts = split_roles(hosts, a.reducers)
    if len(reducer_hosts) != a.reducers:
        print(f"error: job {job_id} asked for {a.reducers} reducer node(s) and got {len(reducer_hosts)} "
              f"({', '.join(hosts)})", flush=True)
        return 1
    write_atomic(Path(a.hostfile), "".join(f"{h} slots={a.slots}\n" for h in workers)
                 + "".join(f"{h} slots=1\n" for h in reducer_hosts))
    if reducer_hosts:
        mpirun = with_hosts(mpirun, [",".join(f"{h}:{a.slots}" for h in workers),
                                     ",".join(f"{h}:1" for h in reducer_hosts)])
    hosts = workers + reducer_hosts
    os.environ["SCALETRAIN_RESTART_COUNT"] = str(restart)
    _record_unrecorded_loss(Path(a.output), restart)
    if a.rendezvous_port is not None:
        # The rendezvous is where the allocation's first node is now (a replacement has a new address), as Slurm has
        # it; mpirun forwards both by name (-x MASTER_ADDR).
        os.environ["MASTER_ADDR"] = node_addresses(workers[:1]).get(workers[0], workers[0])
        os.environ["MASTER_PORT"] = str(a.rendezvous_port)
    if restart and not a.no_resume and "--resume" not in mpirun:
        mpirun = with_resume(mpirun)
    wait_whole(hosts)
    if not a.no_node_check and (refused := _refuse_short_nodes(hosts, job_id, restart, a)) is not None:
        return refused
    if isinstance(guard := spend.begin(a, job_id, say), int):  # the cap spent already: the run does not start
        return guard
    from launcher.execute import progresswatch, stragglerdrain

    stragglerdrain.set_aside_progress(Path(a.output), restart)
    drainer = stragglerdrain.Drainer(policy=a.on_straggler, output=Path(a.output), job_id=job_id, restart=restart,
                                     max_restarts=a.max_restarts, checkpoints=not a.no_resume, say=say)
    # names a straggler while the run goes on, and drains it with --on-straggler drain
    watcher = progresswatch.Watcher(Path(a.output), say, on_found=drainer.on_found).start()

    def located() -> None:
        from launcher.execute import stacks

        where = Path(a.output) / "stacks" / f"attempt-{restart + 1}"
        for line in stacks.collect(hosts, job_id, where, watcher.last_steps(), watcher.nodes):
            say(line)
        say(f"every rank's stack: {where}")

    try:
        code, lines, stopped = run_step(mpirun, a.stall_timeout, located,
                                        lambda: drainer.halt() or (guard.halt() if guard else None))
    finally:
        watcher.on_found = None  # the run has ended: its last look names, and drains, no one
        watcher.stop()
        if guard is not None:
            guard.stop()
    if guard is not None and guard.reached:  # stopped at the cap: one line, never requeued
        return spend.finish(guard, Path(a.output), job_id)
    if code == 0 and not stopped:
        say(f"job {job_id} finished")
        return 0
    if drainer.drained is not None and stopped and stopped.startswith(drainer.drained.node):
        return drainer.requeue(lines)
    silent = unreachable(hosts)
    # The nodes as the hostfile lays the ranks out, for naming the node of a rank that died.
    ranked = [Node(name=h, address=h, role="worker", slots=a.slots, cpus=1, workdir="/") for h in workers] + \
        [Node(name=h, address=h, role="reducer", slots=1, cpus=1, workdir="/") for h in reducer_hosts]
    why = stopped or faults.diagnose(lines, ranked, silent, shared_memory_gib=a.shared_memory_gib) \
        or f"mpirun exited {code}"
    lost = restarts.lost_nodes(lines, silent, hosts)
    history = restartlog.history(Path(a.output))
    at = restarts.progress(lines)
    verdict = restarts.decide(why, lost, trainer_error=restarts.trainer_error(lines), restarts_done=restart,
                              max_restarts=a.max_restarts, previous_lost=history[-1]["lost"] if history else None,
                              progressed=at is not None)
    if not verdict.retry:
        print(f"error: {'the command' if a.no_resume else 'training'} failed: {verdict.why}",
              flush=True)
        return code or 1
    newest = newest_checkpoint_epoch(Path(a.output))
    step = restarts.Restart(attempt=restart + 1, why=why, lost=list(lost),
                            resumed_from_epoch=newest + 1 if newest is not None else 0,
                            epochs_lost=restarts.work_lost(at, newest), progress=list(at) if at else None)
    restartlog.append(Path(a.output), history, step)
    causes = "; ".join(f"{n}: {silent.get(n, 'mpirun lost its daemon there')}" for n in lost)
    say(f"{', '.join(lost)} lost ({causes}); "
        f"requeueing job {job_id} (restart {restart + 1} of {a.max_restarts}); it resumes from the newest "
        f"complete checkpoint once the allocation is whole again")
    for node in lost:
        if replaced_since(node, job_id):  # a replacement already registered: DOWN would keep it out for good
            continue
        subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DOWN", f"Reason=lost during job {job_id}"],
                       capture_output=True)
    # Requeue only the attempt that failed: Slurm may already have requeued it for the node's failure (and counted
    # a restart), and a second requeue would count another and spend the bound.
    if int(show("job", job_id).get("Restarts", restart) or restart) > restart:
        say(f"Slurm has already requeued job {job_id}")
        return code or 1
    # Slurm may have been first: a node it saw fail requeues the job by itself ("Job is pending execution").
    if (refused := restartlog.requeue(job_id, pending_ok=True)) is not None:
        print(f"error: training failed: {why}, and Slurm would not requeue job {job_id}: {refused}", flush=True)
        return code or 1
    return code or 1


if __name__ == "__main__":
    sys.exit(main())
