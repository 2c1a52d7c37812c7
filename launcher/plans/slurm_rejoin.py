"""How a replacement instance rejoins the cluster under a name the controller already knows: it sets its own
address, returns itself to service from DOWN or DRAIN, and requeues the batch jobs whose script was on the instance
it replaces. Shell lines for the node's user data (plans/slurm.worker_boot_commands runs them last); pure."""

from __future__ import annotations


def rejoin_commands(address: str) -> list[str]:
    """A replacement that registers under a name the controller knows keeps the old record's NodeAddr (Slurm 22.05
    takes a dynamic node's --conf only when it creates the record), so the controller would go on dialling the lost
    instance: the node sets its own address, then returns itself to service if the record was DOWN or DRAINED (its
    predecessor was lost or failed its health check; this instance is new). Client commands find the configuration
    slurmd fetched (configless: /run/slurm/conf)."""
    me = "$(hostname -s)"
    return [f"for i in $(seq 1 30); do scontrol update NodeName={me} NodeAddr={address} NodeHostname={me} "
            "2>/dev/null && break; sleep 1; done",
            f"if scontrol show node {me} | grep -Eq 'State=(DOWN|[A-Z_+]*DRAIN)'; then "
            f"scontrol update NodeName={me} State=RESUME || true; fi",
            lost_batch_requeue(me)]


def lost_batch_requeue(me: str, wait_s: int = 30) -> str:
    """Requeue the running jobs whose batch script was on the instance this one replaces: Slurm names them only at
    a registration ("Batch JobId=# missing from batch node", slurmctld's _purge_missing_jobs, which spares a job
    started less than BatchStartTimeout + MessageTimeout, 20 s, before), and the controller asks a node to
    register again only every 20th ping, about every 400 s (ping_nodes.c, MAX_REG_FREQUENCY; Slurm 22.05 and
    23.11): a replacement that registered within 20 s of the job's start under its predecessor's name left the job
    "running" on no instance for minutes. This runs once, at the instance's first boot (user data). It waits (up
    to ``wait_s``) until the controller's record of the node is this instance's slurmd (SlurmdStartTime, set at
    registration, not before this instance booted: until then the record is the predecessor's, and the boot's
    own steps may all be done before slurmd registers); a job this node is the batch host of that started before
    that slurmd did cannot have its script here, and Slurm requeues it as it would have at the registration
    (JobRequeue). A job started after is this instance's own and stays. On AWS a replacement's name is new (its
    address's host name) unless the address is reused: then this is the same case, and otherwise the record is
    new, so nothing started before it."""
    return ("booted=$(date -u -d @$(( $(date +%s) - $(cut -d. -f1 /proc/uptime) )) +%Y-%m-%dT%H:%M:%S); "
            f"for i in $(seq 1 {wait_s}); do "
            f"started=$(TZ=UTC scontrol show node {me} 2>/dev/null | grep -o 'SlurmdStartTime=[^ ]*' | "
            "cut -d= -f2 || true); "
            '[[ -n "$started" && ! "$started" < "$booted" ]] && break; started=; sleep 1; done; '
            'if [ -n "$started" ]; then '
            f"{{ TZ=UTC squeue -h -w {me} -t RUNNING -o '%i %B %S' 2>/dev/null || true; }} | "
            f"awk -v me={me} -v started=\"$started\" '$2 == me && $3 < started {{print $1}}' | "
            "while read -r job; do echo \"requeueing job $job: its batch script was on the instance this one "
            "replaces\"; scontrol requeue \"$job\" || true; done; fi")
