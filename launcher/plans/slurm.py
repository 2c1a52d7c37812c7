"""Slurm on the cluster, as pure decisions: the controller's slurm.conf, how each node starts munge and its Slurm
daemon, the batch script of a training job, and what a job's Slurm state means to the user.

The cluster owns its jobs, as on AWS ParallelCluster and SageMaker HyperPod: a head node (never spot) runs
``slurmctld``; every worker runs ``slurmd -Z`` and registers itself with the controller (dynamic nodes), fetching
the configuration from it (configless), so an Auto Scaling group's replacement joins with nobody attached. The
launcher only renders, submits (``sbatch``), follows, detaches and reattaches.

Everything here is pure; launcher/local/ (the local head node) and infra/ (the stack's head node) carry it out.
The rules each setting follows are cited beside it from Slurm 22.05's slurm.conf(5), sbatch(1) and slurmd(8)
(https://slurm.schedmd.com/archive/slurm-22.05.8/), the release Debian 12 ships and the rehearsal nodes run.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from launcher.plans.slurm_rejoin import rejoin_commands  # a replacement's last boot steps

# The units and their environment files; REHEARSAL_SLURM and the paths re-exported for the boots' callers.
from launcher.plans.slurm_units import (  # noqa: F401
    CGROUP_CONF,
    CGROUP_PLUGIN,
    CONF_PATH,
    REHEARSAL_CGROUP_PLUGIN,
    REHEARSAL_SLURM,
    SLURMCTLD_ENV,
    SLURMCTLD_SERVICE,
    SLURMCTLD_UNIT,
    SLURMD_ENV,
    SLURMD_SERVICE,
    SLURMD_START_WAIT_S,
    SLURMD_UNIT,
    cgroup_conf,
    enable_commands,
    environment_file,
    units,
    write_commands,
)

SLURMCTLD_PORT = 6817
SLURMD_PORT = 6818
MUNGE_KEY = "/etc/munge/munge.key"
STATE_DIR = "/var/spool/slurmctld"
SPOOL_DIR = "/var/spool/slurmd"
LOG_DIR = "/var/log/slurm"
JOBCOMP_LOG = f"{LOG_DIR}/jobcomp.log"        # one line per finished job: the record after slurmctld forgets it
PARTITION = "train"
WORKER_FEATURE = "worker"
REDUCER_FEATURE = "reducer"
# A lost node is noticed within SlurmdTimeout: "the interval, in seconds, that the Slurm controller waits for
# slurmd to respond before configuring that node's state to DOWN" (slurm.conf(5)). The default, 300 s, is five
# minutes of eight idle p4d; ParallelCluster keeps 180 s for EC2 with health checks besides. One minute here.
SLURMD_TIMEOUT_S = 60
# Finished jobs stay in the controller's memory (squeue, scontrol show job: state, restarts, output) this long;
# the default 300 s would forget a run before its user is back from lunch (slurm.conf(5), MinJobAge).
MIN_JOB_AGE_S = 7 * 24 * 3600
# A requeued job may start again only after the step credentials' lifetime (slurm.conf(5), AuthInfo cred_expire:
# "also used to set the time before a requeued job can start"; default 120 s, minimum 5 s).
CRED_EXPIRE_S = 30


@dataclass(frozen=True)
class SlurmCluster:
    """What the controller's configuration is made from: one description for the stack and the local cluster."""

    name: str                                # the scaletrain cluster's name
    controller: str                          # the head node's host name (what its gethostname() says)
    controller_addr: str                     # ... and its address, which every node dials
    max_nodes: int                           # dynamic nodes the controller may hold (workers, reducers, spares)
    health_check: str | None = None          # a program run on every node; non-zero drains it
    health_check_interval_s: int = 300
    epilog_ctld: str | None = None           # run on the head node by slurmctld after every job
    cred_expire_s: int = CRED_EXPIRE_S


def cluster_name(name: str) -> str:
    """Slurm's ClusterName: lower case, and the characters a file name holds (slurm.conf(5): "ClusterName ...
    names are converted to lower case")."""
    return re.sub(r"[^a-z0-9_]", "_", f"scaletrain_{name}".lower())[:40]


def slurm_conf(c: SlurmCluster) -> str:
    """The controller's slurm.conf. Nodes are dynamic: none is listed; each registers itself with ``slurmd -Z``
    and a Feature that puts it in the partition's NodeSet."""
    if c.max_nodes < 1:
        raise ValueError(f"max_nodes must be >= 1, got {c.max_nodes}")
    lines = [
        "# Rendered by launcher/plans/slurm.py (slurm_conf); Slurm 22.05 or later.",
        f"ClusterName={cluster_name(c.name)}",
        f"SlurmctldHost={c.controller}({c.controller_addr})",
        f"SlurmctldPort={SLURMCTLD_PORT}",
        f"SlurmdPort={SLURMD_PORT}",
        "SlurmUser=slurm",
        "AuthType=auth/munge",
        "CryptoType=crypto/munge",
        f"AuthInfo=cred_expire={c.cred_expire_s}",
        # Configless: the nodes fetch this file from slurmctld (slurmd --conf-server), so it lives on the head
        # node only and a replacement needs nothing but the munge key (https://slurm.schedmd.com/configless_slurm.html).
        "SlurmctldParameters=enable_configless",
        # Dynamic nodes: "MaxNodeCount ... the maximum number of nodes that can be created dynamically" and the
        # controller talks to each directly (https://slurm.schedmd.com/dynamic_nodes.html: "TreeWidth=65533").
        f"MaxNodeCount={c.max_nodes}",
        "TreeWidth=65533",
        f"StateSaveLocation={STATE_DIR}",
        f"SlurmdSpoolDir={SPOOL_DIR}",
        f"SlurmctldLogFile={LOG_DIR}/slurmctld.log",
        f"SlurmdLogFile={LOG_DIR}/slurmd.log",
        "SlurmctldPidFile=/run/slurmctld.pid",
        "SlurmdPidFile=/run/slurmd.pid",
        # Processes are tracked by parent pid and tasks are not bound, on AWS as on a rehearsal node, whose cgroup
        # tree has no controllers to constrain with (its machine's are bound to cgroup v1); a job's ranks are
        # mpirun's children (plm slurm starts its daemons through srun) and mpirun binds them itself. slurmd loads
        # its cgroup plugin all the same (slurmd.c, cgroup_g_init): see slurm_units.CGROUP_PLUGIN.
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        # A job's locked-memory limit is slurmd's (unlimited: units), not the one of the shell that ran sbatch, which
        # Slurm propagates by default (https://slurm.schedmd.com/faq.html#memlock; slurm.conf(5),
        # PropagateResourceLimitsExcept): EFA's libfabric registers its buffers as locked memory.
        "PropagateResourceLimitsExcept=MEMLOCK",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        # A node that registers again after it was DOWN (a replacement under the same name) takes jobs again.
        "ReturnToService=2",
        f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
        "SlurmctldTimeout=120",
        "InactiveLimit=0",
        "KillWait=30",
        "JobRequeue=1",
        f"MinJobAge={MIN_JOB_AGE_S}",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={JOBCOMP_LOG}",
        "AccountingStorageType=accounting_storage/none",
        "JobAcctGatherType=jobacct_gather/none",
    ]
    if c.health_check:
        lines += [f"HealthCheckProgram={c.health_check}", f"HealthCheckInterval={c.health_check_interval_s}",
                  "HealthCheckNodeState=ANY"]
    if c.epilog_ctld:
        lines.append(f"EpilogSlurmctld={c.epilog_ctld}")
    lines += [
        f"NodeSet=workers Feature={WORKER_FEATURE}",
        f"NodeSet=reducers Feature={REDUCER_FEATURE}",
        f"PartitionName={PARTITION} Nodes=workers,reducers Default=YES MaxTime=INFINITE State=UP "
        "OverSubscribe=EXCLUSIVE",
    ]
    return "\n".join(lines) + "\n"


# -- how a node starts its daemons by hand (no systemd) ----------------------------------------------------------------
# For a node whose first process is not systemd (a rehearsal node as launcher/local/rehearsal_cluster.py booted it):
# nothing restarts these after a reboot. On a systemd host: controller_boot_commands, worker_boot_commands below.

def node_conf(*, role: str, cpus: int, address: str) -> str:
    """``slurmd --conf``: what a dynamic node says of itself (slurmd(8): "the same syntax and parameters used to
    define nodes in the slurm.conf"; NodeName is the host name)."""
    feature = WORKER_FEATURE if role == "worker" else REDUCER_FEATURE
    return f"NodeAddr={address} CPUs={cpus} Feature={feature}"


HEALTH_CHECK = "/etc/slurm/healthcheck.sh"   # on every node: slurmd runs it as HealthCheckProgram
HEALTH_CHECK_INTERVAL_S = 120
DRAIN_PREFIX = "scaletrain health: "         # the Reason a failed health check drains a node with
REASON_LIMIT = 200                           # a drain Reason's length, short enough for a line of sinfo -R


def fit_reason(text: str) -> str:
    """A drain Reason cut to REASON_LIMIT, ending in "..." where it was cut (every Reason scaletrain drains with)."""
    return text if len(text) <= REASON_LIMIT else text[:REASON_LIMIT - 3] + "..."


def health_check_argv(*, python: str, backend: str, mpirun: str, shared_mount: str | None = None,
                      instance_type: str | None = None, storage: str | None = None,
                      efa_devices: int | None = None) -> list[str]:
    """The doctor's node checks run on the node itself (launcher/doctor/health.py), what the node's health check
    script runs."""
    argv = [python, "-m", "launcher.doctor.health", "--backend", backend, "--python", python, "--mpirun", mpirun]
    for flag, value in (("--shared-mount", shared_mount), ("--instance-type", instance_type),
                        ("--storage", storage), ("--efa-devices", efa_devices)):
        if value is not None:
            argv += [flag, str(value)]
    return argv


def health_check_script(argv: list[str]) -> str:
    """HealthCheckProgram takes a program without arguments: "Fully qualified pathname of a script to execute as
    user root periodically on all compute nodes" (slurm.conf(5)). This script is it."""
    return "#!/bin/bash\n# Rendered by launcher/plans/slurm.py (health_check_script).\nexec " + shlex.join(argv) + "\n"


def drain_reason(failed: list[tuple[str, str]]) -> str:
    """The Reason a node drains itself with: each failed check and why, one line, short enough for sinfo -R."""
    text = DRAIN_PREFIX + "; ".join(f"{name}: {detail}" for name, detail in failed)
    return fit_reason(" ".join(text.split()))


def health_restored(node_fields: dict[str, str]) -> bool:
    """Should a node that passes its health check return to service: only when it drained itself for a failed
    check (its Reason is ours), never when an administrator drained it."""
    return "DRAIN" in node_fields.get("State", "") and node_fields.get("Reason", "").startswith(DRAIN_PREFIX)


def slurmd_options(*, controller_addr: str, role: str, cpus: int, address: str) -> list[str]:
    """slurmd's arguments on a worker or reducer: a dynamic node (``-Z``) that fetches its configuration from the
    controller (``--conf-server``) and says what it is (``--conf``, :func:`node_conf`)."""
    return ["-Z", "--conf-server", f"{controller_addr}:{SLURMCTLD_PORT}",
            "--conf", node_conf(role=role, cpus=cpus, address=address)]


def _health_check_commands(health_check: list[str] | None) -> list[str]:
    return write_commands(HEALTH_CHECK, health_check_script(health_check), 0o755) if health_check else []


# -- how a node runs its daemons: systemd units (launcher/plans/slurm_units.py) ----------------------------------------

def munge_key_commands() -> list[str]:
    """The key the boot wrote (as root) made munge's, readable by it alone (munged refuses a key others may read),
    and munged's own directories, as the package makes them."""
    return [f"chown munge:munge {MUNGE_KEY} && chmod 0400 {MUNGE_KEY}",
            "install -d -o munge -g munge -m 0700 /var/log/munge /var/lib/munge"]


def controller_boot_commands(version: str) -> list[str]:
    """The head node's daemons on a systemd host, once the key and slurm.conf are in place: munge's key, slurmctld's
    directories (StateSaveLocation on the head node's own disk, owned by SlurmUser), its unit and options, then
    munge.service and slurmctld.service enabled and started (``systemctl`` waits until slurmctld is up)."""
    return [*munge_key_commands(),
            f"install -d -o slurm -g slurm -m 0755 {STATE_DIR} {LOG_DIR}",
            *write_commands(SLURMCTLD_UNIT, units(version)[SLURMCTLD_UNIT]),
            *write_commands(SLURMCTLD_ENV, environment_file("SLURMCTLD_OPTIONS", [])),
            *enable_commands(SLURMCTLD_SERVICE)]


def worker_boot_commands(version: str, *, controller_addr: str, role: str, cpus: int, address: str,
                         health_check: list[str] | None = None) -> list[str]:
    """A worker's or reducer's daemons on a systemd host, once the key is in place: munge's key, slurmd's
    directories and health check, its unit and options (:func:`slurmd_options` in ``SLURMD_OPTIONS``), then
    munge.service and slurmd.service enabled and started, the boot waiting up to SLURMD_START_WAIT_S for slurmd
    (:func:`launcher.plans.slurm_units.enable_commands`); then a replacement under a known name rejoins
    (:func:`rejoin_commands`, through scontrol)."""
    options = slurmd_options(controller_addr=controller_addr, role=role, cpus=cpus, address=address)
    return [*munge_key_commands(),
            f"install -d -m 0755 {SPOOL_DIR} {LOG_DIR}",
            *_health_check_commands(health_check),
            *write_commands(SLURMD_UNIT, units(version)[SLURMD_UNIT]),
            *write_commands(SLURMD_ENV, environment_file("SLURMD_OPTIONS", options)),
            *enable_commands(SLURMD_SERVICE, wait_s=SLURMD_START_WAIT_S),
            *rejoin_commands(address)]


# -- what a job's state means ------------------------------------------------------------------------------------------

QUEUED, RUNNING, SUCCEEDED, FAILED, CANCELLED = "queued", "running", "succeeded", "failed", "cancelled"
_STATES = {
    "PENDING": QUEUED, "CONFIGURING": QUEUED, "REQUEUED": QUEUED, "REQUEUE_FED": QUEUED, "REQUEUE_HOLD": QUEUED,
    "RESV_DEL_HOLD": QUEUED, "SUSPENDED": QUEUED, "STOPPED": QUEUED, "RESIZING": QUEUED, "SPECIAL_EXIT": FAILED,
    "RUNNING": RUNNING, "COMPLETING": RUNNING, "SIGNALING": RUNNING, "STAGE_OUT": RUNNING,
    "COMPLETED": SUCCEEDED,
    "FAILED": FAILED, "TIMEOUT": FAILED, "NODE_FAIL": FAILED, "OUT_OF_MEMORY": FAILED, "BOOT_FAIL": FAILED,
    "DEADLINE": FAILED, "PREEMPTED": FAILED, "REVOKED": FAILED,
    "CANCELLED": CANCELLED,
}
FINISHED = (SUCCEEDED, FAILED, CANCELLED)


def state_of(slurm_state: str) -> str:
    """Our five states from Slurm's JobState (squeue(1), "JOB STATE CODES"); unknown ones count as running."""
    return _STATES.get(slurm_state.split()[0].rstrip("+"), RUNNING)


# -- a training run as a Slurm job -------------------------------------------------------------------------------------

OUTPUT_FILE = "slurm-%j.out"                 # in the run directory; %j: the job id (sbatch(1), "filename pattern")
HOSTFILE = "hostfile"                        # written by the job's step from its allocation


@dataclass(frozen=True)
class BatchJob:
    """What one training job's batch script is made from (paths as the nodes see them)."""

    name: str                                # the job's name in squeue
    nodes: int
    slots: int                               # ranks per node
    output: str                              # the run directory, on shared storage
    python: str                              # the image's Python, with scaletrain installed
    mpirun: tuple[str, ...]                  # the run's mpirun line (launcher/plans/job.py), hostfile OUTPUT/hostfile
    max_restarts: int = 0
    stall_timeout_s: float = 1800.0
    teardown: bool = False                   # the cluster removes itself when the job has ended (epilog_script)
    shared_memory_gib: float | None = None   # the local cluster: the memory all its nodes share (faults.diagnose)
    reducers: int = 0                        # reducer nodes besides the workers (seed 004's tier; MPMD mpirun)
    rendezvous_port: int | None = None       # DDP, a user's command: the step exports MASTER_ADDR/PORT
    resume_flag: bool = True                 # a restarted job's command gets --resume (the trainer's option)
    node_check: bool = True                  # the step's ring test before each attempt (plans/nodecheck.py)
    budget: tuple[str, ...] = ()             # the step's --max-cost options (plans/budget.step_args)
    on_straggler: str = "warn"               # warn or drain a named straggler (plans/draining.py)
    submitted_by: str = "launch train"


def job_mpirun(cluster, workers: list, spec, *, fabric_env: dict[str, str], mca: list[tuple[str, str]],
               reducers: list = ()) -> list[str]:
    """The run's mpirun line inside the allocation (launcher/plans/job.py's, hostfile OUTPUT/hostfile). Open MPI
    starts its daemons through Slurm there (its slurm launcher runs srun, which munge authenticates), not over SSH:
    a replacement node, whose host key no launcher pinned, takes part as soon as it registers. ParallelCluster runs
    its own EFA tests this way, a bare mpirun in an sbatch script (aws/aws-parallelcluster,
    tests/integration-tests/tests/efa/test_efa/test_efa/nccl_benchmarks/nccl_tests_submit_openmpi.sh)."""
    from launcher.plans import job

    argv = job.launch_argv(cluster, workers, list(reducers), spec, f"{spec.output}/{HOSTFILE}",
                           fabric_env=fabric_env, mca=[*mca, ("plm", "slurm")])
    # The job's step exports the rendezvous from the allocation (BatchJob.rendezvous_port).
    if spec.engine in ("ddp", "reducer"):
        argv = forward_by_name(argv, ("MASTER_ADDR", "MASTER_PORT"))
    return argv


def forward_by_name(argv: list[str], names: tuple[str, ...]) -> list[str]:
    """``-x NAME=value`` of ``names`` becomes ``-x NAME``: mpirun forwards its own value, the job step's, which names
    the allocation's first node as it is now (a replacement has a new address)."""
    return [a.split("=", 1)[0] if i and argv[i - 1] == "-x" and a.split("=", 1)[0] in names else a
            for i, a in enumerate(argv)]


def batch_script(b: BatchJob) -> str:
    """The job as awsome-distributed-training writes one: its allocation in #SBATCH lines, then one line that starts
    the step (launcher/execute/jobstep.py) on the allocation's first node. The step writes the hostfile from the
    allocation, adds --resume when Slurm restarted the job, enforces the stall timeout, and asks Slurm to requeue
    the job when a node was lost, up to --max-restarts times."""
    if b.nodes < 1 or b.slots < 1 or b.reducers < 0:
        raise ValueError(f"a job needs nodes >= 1, slots >= 1 and reducers >= 0, got {b.nodes}, {b.slots} and "
                         f"{b.reducers}")
    q = shlex.quote
    # With reducers, the allocation is both kinds of node in their counts (sbatch(1), --constraint, "Multiple Counts":
    # "--constraint="[rack1*2&rack2*4]""), and the step names them in the MPMD line (its -host lists).
    constraint = f"[{WORKER_FEATURE}*{b.nodes}&{REDUCER_FEATURE}*{b.reducers}]" if b.reducers else WORKER_FEATURE
    step = [b.python, "-m", "launcher.execute.jobstep", "--max-restarts", str(b.max_restarts),
            "--stall-timeout", f"{b.stall_timeout_s:g}", "--slots", str(b.slots),
            "--hostfile", f"{b.output}/{HOSTFILE}", "--output", b.output,
            *(["--shared-memory-gib", f"{b.shared_memory_gib:.1f}"] if b.shared_memory_gib else []),
            *(["--rendezvous-port", str(b.rendezvous_port)] if b.rendezvous_port is not None else []),
            *([] if b.resume_flag else ["--no-resume"]), *(["--reducers", str(b.reducers)] if b.reducers else []),
            *([] if b.node_check else ["--no-node-check"]), *b.budget,
            *(["--on-straggler", b.on_straggler] if b.on_straggler != "warn" else []),
            "--",
            *b.mpirun]
    return "\n".join([
        "#!/bin/bash",
        f"#SBATCH --job-name={b.name}",
        f"#SBATCH --nodes={b.nodes + b.reducers}",
        f"#SBATCH --ntasks-per-node={b.slots}",
        f"#SBATCH --constraint={constraint}",
        "#SBATCH --exclusive",
        # Requeued when a node fails (sbatch(1), --requeue: "the batch job should be eligible for requeuing"),
        # appending to the same output (--open-mode=append) so one file tells the whole run.
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --chdir={b.output}",
        f"#SBATCH --output={b.output}/{OUTPUT_FILE}",
        *([f"#SBATCH --comment={TEARDOWN_COMMENT}"] if b.teardown else []),
        f"# Submitted by `{b.submitted_by}`; the cluster owns this run: it outlives the launcher, and Slurm",
        "# requeues it when a node is lost. Follow it with `launch logs ID -f`, stop it with `launch cancel ID`.",
        "exec " + " ".join(q(a) for a in step),
        ""])


TEARDOWN_COMMENT = "scaletrain:teardown"    # a job whose end takes the cluster down (launch train --teardown)
EPILOG_PATH = "/etc/slurm/epilog-teardown.sh"


def epilog_script(*, action: list[str]) -> str:
    """EpilogSlurmctld: slurmctld runs it on the head node when any job ends (slurm.conf(5)), with the job's
    SLURM_JOB_ID and SLURM_JOB_COMMENT in its environment (https://slurm.schedmd.com/prolog_epilog.html). For a job
    submitted with --teardown, once it has really ended (not when it is being requeued: a requeued job is pending
    again), it runs ``action``: on AWS moving the stack's TTL parameter to now, so that the TTL guard deletes the
    stack; on the local cluster writing the marker the keeper acts on. No launcher needs to be attached."""
    return "\n".join([
        "#!/bin/bash",
        "# Rendered by launcher/plans/slurm.py (epilog_script).",
        f'[ "${{SLURM_JOB_COMMENT:-}}" = {TEARDOWN_COMMENT} ] || exit 0',
        'state=$(scontrol --oneliner show job "$SLURM_JOB_ID" 2>/dev/null | grep -o "JobState=[A-Z_]*")',
        'case "$state" in JobState=PENDING|JobState=REQUEUE*) exit 0 ;; esac',
        *action,
        "exit 0",
        ""])


def submitted_id(sbatch_output: str) -> str:
    """The job id `sbatch --parsable` printed ("ID" or "ID;CLUSTER")."""
    first = sbatch_output.strip().splitlines()[-1] if sbatch_output.strip() else ""
    job_id = first.split(";")[0].strip()
    if not job_id.isdigit():
        raise ValueError(f"sbatch printed no job id: {sbatch_output.strip()[:200]!r}")
    return job_id


@dataclass(frozen=True)
class Job:
    """One job as `launch jobs` shows it."""

    id: str
    name: str
    state: str                               # queued, running, succeeded, failed or cancelled
    slurm_state: str
    started: str | None                      # ISO 8601, the cluster's clock
    ended: str | None
    nodes: str                               # the node list, or the count asked for while queued
    restarts: int
    output: str | None                       # the run directory
    stdout: str | None                       # the job's output file
    exit_code: str
    reason: str | None                       # why it waits, or why it failed (Slurm's Reason)
    stragglers: tuple[dict, ...] = ()        # what its run directory's stragglers.json names (plans/stragglers.py)

    def as_json(self) -> dict:
        return {"id": self.id, "name": self.name, "state": self.state, "slurm_state": self.slurm_state,
                "started": self.started, "ended": self.ended, "nodes": self.nodes, "restarts": self.restarts,
                "output": self.output, "stdout": self.stdout, "exit_code": self.exit_code, "reason": self.reason,
                "stragglers": list(self.stragglers)}


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z:/]*)=")


def fields(line: str) -> dict[str, str]:
    """``Key=Value`` pairs of one `scontrol show job --oneliner` line, or of one jobcomp/filetxt line; a value may
    hold spaces (up to the next `` Key=``)."""
    found = list(_FIELD.finditer(line))
    out = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(line)
        out[m[1]] = line[m.end():end].strip()
    return out


def _time(value: str | None) -> str | None:
    return value if value and value not in ("Unknown", "None", "(null)") else None


def job_of(f: dict[str, str]) -> Job:
    slurm_state = f.get("JobState", "UNKNOWN")
    nodes = f.get("NodeList") or ""
    if not nodes or nodes == "(null)":
        nodes = f.get("NumNodes", f.get("NodeCnt", "?"))
    reason = f.get("Reason")
    return Job(id=f.get("JobId", "?"), name=f.get("JobName", f.get("Name", "")), state=state_of(slurm_state),
               slurm_state=slurm_state, started=_time(f.get("StartTime")), ended=_time(f.get("EndTime")),
               nodes=nodes, restarts=int(f.get("Restarts", "0") or 0), output=f.get("WorkDir") or None,
               stdout=f.get("StdOut") or None, exit_code=f.get("ExitCode", ""),
               reason=None if reason in (None, "None") else reason)


def parse_jobs(scontrol_text: str, jobcomp_text: str = "") -> list[Job]:
    """Every job the controller remembers (`scontrol show job --oneliner`), then the older ones only its job
    completion log has (the newest line of each), newest first."""
    jobs: dict[str, Job] = {}
    for line in jobcomp_text.splitlines():
        f = fields(line)
        if "JobId" in f:
            jobs[f["JobId"]] = job_of(f)
    for line in scontrol_text.splitlines():
        f = fields(line)
        if "JobId" in f:
            jobs[f["JobId"]] = job_of(f)
    return sorted(jobs.values(), key=lambda j: int(j.id) if j.id.isdigit() else 0, reverse=True)
