"""The launcher's side of a cluster's Slurm jobs: submit on the head node, follow, list, print, cancel.

Everything that keeps a run alive is on the cluster (launcher/plans/slurm.py, launcher/execute/jobstep.py); this
module only talks to the head node over SSH, as a user types `sbatch`, `squeue`, `scontrol` and `scancel` there. A
dropped connection is retried (with SSH keepalives, so a dead path is noticed); Ctrl-C detaches and leaves the job
running.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shlex
import sys
import time
from collections.abc import Callable

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.execute import remote
from launcher.plans import slurm, stragglers

KEEPALIVE_S = 15           # SSH keepalive on the follower's connection (paramiko's Transport.set_keepalive)
POLL_S = 2.0               # how often a followed job's state and output are read
RECONNECT_FOR_S = 600.0    # a connection lost for longer than this ends the follow (the job goes on)
CHUNK = 1 << 20            # at most this many bytes of output per poll


def head_of(c: Cluster) -> Node:
    if c.head is None:
        raise LaunchError(f"cluster '{c.name}' has no head node running Slurm; bring one up with "
                          f"`launch local up --slurm` (AWS stacks have one)")
    return c.head


def head_lost(c: Cluster) -> str | None:
    """None when the head node answers over SSH; else why it does not (one line)."""
    try:
        remote.check(c, head_of(c), "true", timeout_s=15)
    except LaunchError as e:
        return str(e)
    return None


def lost_head(c: Cluster, why: str) -> LaunchError:
    """The one line for a head node that is gone: what went with it, what did not, and how to go on. Slurm's state
    (the queue, StateSaveLocation) is on the head node's disk, as on ParallelCluster, whose head node is in no Auto
    Scaling group; the jobs' steps run on the nodes under slurmd and end on their own."""
    return LaunchError(f"the head node '{head_of(c).name}' does not answer ({why}): Slurm's queue went with it; jobs "
                       f"already running go on to their end on the nodes, their run directories and checkpoints are "
                       f"on the shared storage, and `launch train --resume --out DIR` continues one from here")


def _slurm_error(text: str, what: str) -> LaunchError:
    last = (text.strip().splitlines() or ["no output"])[-1]
    if "Unable to contact slurm controller" in text or "Connection refused" in text:
        return LaunchError(f"Slurm's controller on the head node does not answer ({last}); check it with "
                           f"`launch exec -- systemctl status slurmctld` on AWS, or bring the local cluster up again")
    return LaunchError(f"{what}: {last}")


def submit(c: Cluster, script: str, output: str) -> str:
    """Put the batch script in the run directory (shared storage) and `sbatch` it on the head node; the job id."""
    head = head_of(c)
    code, text = remote.check(c, head, f"mkdir -p {shlex.quote(output)} 2>&1")
    if code != 0:
        raise LaunchError(f"cannot make {output} on {head.name}: {text.strip()}")
    path = f"{output}/job.sbatch"
    remote.put_text(c, head, script, path, mode=0o644)
    code, text = remote.check(c, head, f"sbatch --parsable {shlex.quote(path)} 2>&1")
    if code != 0:
        raise _slurm_error(text, f"sbatch on {head.name} refused the job")
    try:
        return slurm.submitted_id(text)
    except ValueError as e:
        raise LaunchError(str(e)) from None


QUERY = f"scontrol show job --oneliner {{ids}} 2>&1; echo '@@jobcomp@@'; cat {slurm.JOBCOMP_LOG} 2>/dev/null"


def jobs(c: Cluster, job_id: str | None = None, *, conn=None) -> list[slurm.Job]:
    """The jobs the controller remembers and its job completion log holds, newest first (one, when ``job_id``)."""
    if job_id is not None and not job_id.isdigit():
        raise LaunchError(f"'{job_id}' is not a job id (a number, as `launch jobs` lists them)")
    command = QUERY.format(ids=job_id or "")
    if conn is not None:
        res = conn.run(command, hide=True, warn=True, in_stream=False, timeout=30)
        text = res.stdout
    else:
        try:
            _, text = remote.check(c, head_of(c), command, timeout_s=30)
        except LaunchError as e:  # the head node is gone, not only its controller
            raise lost_head(c, str(e)) from None
    live, _, done = text.partition("@@jobcomp@@")
    if "Invalid job id" in live:
        live = ""
    elif "error" in live.lower() and "JobId=" not in live:
        raise _slurm_error(live, "Slurm")
    found = slurm.parse_jobs(live, done)
    if job_id is not None:
        found = [j for j in found if j.id == job_id]
        if not found:
            raise LaunchError(f"no job {job_id} on cluster '{c.name}'; `launch jobs --cluster {c.name}` lists them")
    return found


STRAGGLER_JOBS = 20  # the newest jobs whose run directories `launch jobs` reads a straggler record from


def with_stragglers(c: Cluster, found: list[slurm.Job]) -> list[slurm.Job]:
    """The jobs, each with the stragglers its run directory's record names (progresswatch writes it on the job's
    first node; the head node mounts the same storage), read in one command for the newest that started."""
    outputs = list(dict.fromkeys(j.output for j in found[:STRAGGLER_JOBS] if j.output and j.state != "queued"))
    if not outputs:
        return found
    try:
        _, text = remote.check(c, head_of(c), stragglers.records_query(outputs), timeout_s=30)
    except LaunchError:
        return found  # the table without them, as before: the queue itself was read
    named = stragglers.parse_records(text)
    return [dataclasses.replace(j, stragglers=tuple(named.get(j.output, ()))) if j.output in named else j
            for j in found]


def cancel(c: Cluster, job_id: str) -> slurm.Job:
    job = jobs(c, job_id)[0]
    if job.state in slurm.FINISHED:
        raise LaunchError(f"job {job_id} has already finished ({job.state}); nothing to cancel")
    code, text = remote.check(c, head_of(c), f"scancel {job_id} 2>&1", timeout_s=30)
    if code != 0:
        raise _slurm_error(text, f"scancel {job_id}")
    return job


def _open(c: Cluster, node: Node):
    conn = remote.connect(c, node, timeout_s=30)
    conn.open()
    conn.client.get_transport().set_keepalive(KEEPALIVE_S)
    return conn


def follow(c: Cluster, job_id: str, *, write: Callable[[str], None] | None = None, offset: int = 0,
           until_end: bool = True) -> slurm.Job:
    """Print the job's output from byte ``offset`` as it grows, until the job has finished (or, without
    ``until_end``, once); a dropped connection is opened again. The job as it ended."""
    write = write or (lambda s: (sys.stdout.write(s), sys.stdout.flush()))
    with remote.interrupts() as interrupted:  # invoke swallows a Ctrl-C during a command: record it, act after
        return _follow(c, job_id, write, offset, until_end, interrupted)


def _follow(c: Cluster, job_id: str, write: Callable[[str], None], offset: int, until_end: bool,
            interrupted: list[int]) -> slurm.Job:
    head = head_of(c)
    conn, lost_at, job, reached = None, None, None, False
    while True:
        if interrupted:
            with contextlib.suppress(Exception):
                conn.close()
            raise KeyboardInterrupt
        try:
            conn = conn or _open(c, head)
            reached = True
            job = jobs(c, job_id, conn=conn)[0]
            if job.stdout:
                res = conn.run(f"tail -c +{offset + 1} {shlex.quote(job.stdout)} 2>/dev/null | head -c {CHUNK}",
                               hide=True, warn=True, in_stream=False, timeout=60)
                if res.stdout:
                    write(res.stdout)
                    offset += len(res.stdout.encode())
                    if len(res.stdout.encode()) >= CHUNK:
                        continue
            if lost_at is not None:
                write(f"[launch] reconnected to {head.name}\n")
                lost_at = None
            if job.state in slurm.FINISHED or not until_end:
                return job
        except LaunchError:
            raise
        except Exception as e:  # the connection dropped, timed out, or the head node went away
            with contextlib.suppress(Exception):
                conn.close()
            conn = None
            if not reached:  # never reached this time: the head node is gone, as `launch jobs` says it
                raise lost_head(c, remote._describe(e)) from None
            now = time.monotonic()
            if lost_at is None:
                lost_at = now
                write(f"[launch] lost the connection to {head.name} ({remote._describe(e)}); reconnecting "
                      f"(the job runs on)\n")
            elif now - lost_at > RECONNECT_FOR_S:
                raise LaunchError(f"no connection to {head.name} for {RECONNECT_FOR_S:.0f} s; job {job_id} runs on "
                                  f"the cluster: `launch logs {job_id} -f` follows it again") from None
        if not interrupted:
            time.sleep(POLL_S)


def detached(job_id: str, cluster: str) -> str:
    return (f"detached from job {job_id}; it runs on the cluster. Follow it again: `launch logs {job_id} -f "
            f"--cluster {cluster}`; stop it: `launch cancel {job_id} --cluster {cluster}`")
