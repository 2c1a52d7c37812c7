"""`--on-straggler warn|drain` (`launch train`, `launch run`): what the job's step does with a node the straggler rule
(plans/stragglers.py) named. ``warn`` names it only; ``drain`` has Slurm drain it with the reason, stops the run and
requeues the job, which resumes from its newest checkpoint on the node's replacement. Decided here: whether a named
node is drained, the reason it is drained with, when the run is stopped for the requeue, and which drained nodes a
replacement stands in for.

Loops. A drained-and-requeued job must not drain the whole cluster:
- at most one node per attempt (the slowest named), and the attempt then ends;
- only while a restart is left (--max-restarts): a drain is a restart, recorded in restarts.json as a lost node's
  is, so every drain of a run spends the same bound; with none left the node is named and the run goes on with it;
- not when more than half of the nodes are named at once: the rule compares each node with the median of the others,
  so a majority over it says the run, its data or the fabric is slow, not one node (as plans/nodecheck.py drains
  nothing when every node falls short).

The reason. Slurm keeps it with the node and `sinfo -R` shows it: "Reason=<reason> Identify the reason the node is in
a DOWN, DRAINED, DRAINING, FAILING or FAIL state" (scontrol(1), SchedMD,
https://slurm.schedmd.com/scontrol.html#OPT_Reason); plans/slurm.fit_reason keeps it to a line.

When to stop. A drain decided, the run still holds the work done since its newest checkpoint. Stopping at once
repeats that work after the requeue, at the healthy pace; waiting for the next checkpoint repeats none but goes on at
the straggler's pace. So the step waits for a newer checkpoint at most as long as repeating the work would take: the
seconds since the newest checkpoint (spent at the straggler's pace) divided by how much slower it is (the ratio the
rule measured); a checkpoint in that time ends the wait. A command that keeps no checkpoint the step can see (`launch
run`: its own) is stopped at once.

Replacement. A node drained with one of REPLACED's reasons (this one, or the node check's, plans/nodecheck.py) is
out of service until another instance stands in for it: on AWS its own health check marks its instance Unhealthy for
its Auto Scaling group (launcher/doctor/health.py), on the local cluster the keeper replaces it
(launcher/local/keeper.py). A node the health check drained (plans/slurm.DRAIN_PREFIX) returns to service by itself
once it passes again, and one an administrator drained stays as it is: neither is replaced, until the health
check has failed HEALTH_FAILS_TO_REPLACE times in a row (health_replacement below).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from launcher.plans import nodecheck
from launcher.plans.slurm import fit_reason
from launcher.plans.stragglers import Straggler

POLICIES = ("warn", "drain")
DEFAULT = "warn"
REASON_PREFIX = "scaletrain straggler: "
REPLACED = (REASON_PREFIX, nodecheck.REASON_PREFIX)
PHASE_WORDS = {"data": "waiting for data", "forward": "forward (compute)"}


def policy_problem(value: str) -> str | None:
    """The one line for a bad --on-straggler (None when it is one of POLICIES)."""
    if value in POLICIES:
        return None
    return f"--on-straggler must be {' or '.join(POLICIES)}, got {value!r}"


def restarts_problem(policy: str, max_restarts: int) -> str | None:
    """The one line for --on-straggler drain without a restart to spend: the drain requeues the job, which Slurm
    would start again only to have the step refuse it (plans/restarts.py), so the run would end at the drain."""
    if policy == "drain" and max_restarts < 1:
        return (f"--on-straggler drain requeues the job without the straggler, a restart: it needs --max-restarts 1 "
                f"or more, got {max_restarts}")
    return None


def slurm_problem(policy: str, why: str) -> str | None:
    """The one line for --on-straggler drain on a run with no job's step to drain and requeue (mpirun from the
    launcher's machine): ``why`` says which run that is."""
    if policy != "drain":
        return None
    return (f"--on-straggler drain is the job's step's (Slurm drains the node and requeues the job), and {why}; "
            f"leave it out or use a cluster with a head node (`launch local up --slurm`, or a stack with shared "
            f"storage)")


def reason(s: Straggler) -> str:
    """What the node is drained with: the node, by how much, the phase, since which step."""
    return fit_reason(f"{REASON_PREFIX}{s.node} {s.ratio:.1f}x slower than the other nodes in "
                      f"{PHASE_WORDS.get(s.phase, s.phase)} since step {s.since_step}")


@dataclass(frozen=True)
class Decision:
    drain: Straggler | None     # the node to drain now; None: none
    line: str | None            # what the job's step says about it; None: nothing


def decide(found: Sequence[Straggler], *, policy: str, drained: str | None, nodes: int, restarts_done: int,
           max_restarts: int) -> Decision:
    """What to do with the stragglers named now. ``drained``: the node this attempt already drained (None: none);
    ``nodes``: how many nodes the rule compared; ``restarts_done``: this attempt's restarts so far
    (SLURM_RESTART_COUNT)."""
    if not found or policy != "drain" or drained is not None:
        return Decision(None, None)
    names = ", ".join(s.node for s in found)
    if 2 * len(found) > nodes:
        return Decision(None, f"straggler: {names} named, {len(found)} of {nodes} nodes: more than half, so not "
                              f"one node's fault; none drained (--on-straggler drain)")
    if restarts_done >= max_restarts:
        return Decision(None, f"straggler: {names} not drained: no restart left (--max-restarts {max_restarts}, "
                              f"{restarts_done} done); the run goes on with it")
    slowest = max(found, key=lambda s: (s.ratio, s.node))
    return Decision(slowest, f"straggler: draining {slowest.node} ({reason(slowest)}); the job requeues without it "
                             f"(restart {restarts_done + 1} of {max_restarts})")


def wait_for_checkpoint_s(since_checkpoint_s: float, ratio: float) -> float:
    """How long the step waits for a newer checkpoint before it stops the run (above): the work since the newest
    one, as long as repeating it at the healthy pace takes."""
    if since_checkpoint_s <= 0 or not ratio > 1:
        return max(0.0, since_checkpoint_s)
    return since_checkpoint_s / ratio


def unhealthy_argv(aws_cli: str, instance_id: str, region: str) -> list[str]:
    """The AWS CLI call with which a drained node has its own instance replaced: "Set the health status of an
    instance ... Set to Unhealthy to have the instance be out of service. Amazon EC2 Auto Scaling terminates and
    replaces the unhealthy instance" (EC2 Auto Scaling API Reference, SetInstanceHealth,
    https://docs.aws.amazon.com/autoscaling/ec2/APIReference/API_SetInstanceHealth.html; the user guide's "Set up a
    custom health check for your Auto Scaling group"). ShouldRespectGracePeriod false: a node the node check drains
    right after it boots is inside the group's grace period, and the call would otherwise be ignored."""
    return [aws_cli, "autoscaling", "set-instance-health", "--instance-id", instance_id, "--health-status",
            "Unhealthy", "--no-should-respect-grace-period", "--region", region]


def to_replace(records: Mapping[str, Mapping[str, str]], replaced: Mapping[str, str] | None = None) -> list[str]:
    """The nodes a replacement must stand in for, from `scontrol show node` records (name -> fields): drained with
    one of REPLACED's reasons, and no job left on them. ``replaced``: node -> the SlurmdStartTime of the instance
    already replaced; until the replacement registers (a new SlurmdStartTime, then it returns itself to service:
    plans/slurm_rejoin.rejoin_commands) the record still reads drained, and that instance is not replaced twice. A node
    still DRAINING (ALLOCATED+DRAIN, MIXED+DRAIN, or COMPLETING) runs the job that drained it until that job stops
    for its requeue: replaced then, the job would fail as a lost node's does instead of stopping at its checkpoint.
    ("DRAINED: The node is unavailable for use per system administrator request"; "DRAINING: The node is currently
    executing a job, but will not be allocated additional jobs", sinfo(1), NODE STATE CODES,
    https://slurm.schedmd.com/sinfo.html#SECTION_NODE-STATE-CODES.)"""
    def idle_drained(state: str) -> bool:
        words = state.split("+")
        return "DRAIN" in words and words[0] in ("IDLE", "DOWN", "DRAIN") and "COMPLETING" not in words
    done = replaced or {}
    return sorted(name for name, f in records.items()
                  if idle_drained(f.get("State", "")) and f.get("Reason", "").startswith(REPLACED)
                  and (name not in done or done[name] != f.get("SlurmdStartTime", "")))


# --- a node whose health check keeps failing: replaced, not left drained ----------------------------------------------
# EC2's status checks do not see a GPU fallen off the bus or an EFA device gone (they check the instance's
# reachability and the host: "Status checks for your instances", EC2 User Guide,
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/monitoring-system-instance-status-check.html), so a node the
# health check drains for one would stay drained, billed and idle, until the stack's TTL. After three failed checks in
# a row it marks its own instance Unhealthy and its group replaces it. Three: at slurm.conf's HealthCheckInterval of
# 120 s that is a fault still there after four minutes and more, which outlasts what passes by itself (a driver
# initialising its GPUs, 1-3 s each; Lustre's client recovering after a server failover, within its recovery window
# of minutes at most; a check whose probe was starved of CPU counts as unchecked, not failed, and breaks no run) and is
# a small part of what a node left drained costs: billed, idle, until the stack's TTL (24 hours by default).
HEALTH_FAILS_TO_REPLACE = 3
# What stops a flapping check, or one fault every node shares, from replacing the whole group:
# - a pass resets the count: a check that fails and passes by turns never reaches three in a row;
# - no node marks itself while more than HEALTH_SHARED_FRACTION of the cluster's nodes are drained by the health
#   check at once: that is the image's, the storage's or the fabric's fault, not one instance's, and a replacement
#   from the same image drains in its turn, around the whole group (as plans/nodecheck.py drains nothing when every
#   node falls short). At least one node may always be replaced (one of a 2-node cluster).
HEALTH_SHARED_FRACTION = 0.25


def health_fails(previous: int, failed: bool) -> int:
    """The health check's failures in a row after this one (a pass resets them)."""
    return previous + 1 if failed else 0


def health_replacement(fails_in_a_row: int, drained_for_health: int, nodes: int) -> tuple[bool, str | None]:
    """Whether this node marks its own instance Unhealthy now, and the line it says: why it is replaced, or why a node
    that failed often enough is not (a shared fault); no line below HEALTH_FAILS_TO_REPLACE. ``drained_for_health``:
    the cluster's nodes the health check has drained now (this one among them); ``nodes``: all of its nodes."""
    if fails_in_a_row < HEALTH_FAILS_TO_REPLACE:
        return False, None
    allowed = max(1, int(nodes * HEALTH_SHARED_FRACTION))
    counts = f"{drained_for_health} of {nodes} nodes drained by the health check"
    if drained_for_health > allowed:
        return False, (f"failed {fails_in_a_row} health checks in a row, but {counts} (more than "
                       f"{HEALTH_SHARED_FRACTION:.0%}): a fault they share, which a replacement would not fix; "
                       "not replaced")
    return True, f"failed {fails_in_a_row} health checks in a row ({counts}): replaced"
