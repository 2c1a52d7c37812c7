"""The systemd units Slurm's daemons run in on every node, as pure text: SchedMD's own slurmd.service and
slurmctld.service of the node's release, and the environment files that carry each daemon's options. What a node's
boot does with them (write, enable, start) is :mod:`launcher.plans.slurm`'s (controller_boot_commands,
worker_boot_commands), which re-exports what is here.

A daemon started by the first boot's user data does not come back after a reboot, and inherits cloud-final.service's
limits: slurmstepd gives slurmd's locked-memory limit to every job (slurm_conf: PropagateResourceLimitsExcept), and
EFA needs it unlimited (Slurm's FAQ, https://slurm.schedmd.com/faq.html#memlock: "ensuring that slurmd takes full
advantage of this limit (e.g. by adding "LimitMEMLOCK=infinity" to your systemd's slurmd.service file)"). So the boot
writes SchedMD's own units (etc/slurmd.service.in and etc/slurmctld.service.in at tags slurm-23-11-10-1 and
slurm-22-05-8-1, https://github.com/SchedMD/slurm), enables them, and they start at every boot after. munge is the
distribution's own munge.service (Debian 12's munge package ships it, Type=forking, User=munge,
RuntimeDirectory=munge, and Ubuntu's, from the same Debian source): nothing to add to it. ami/components/slurm.sh
leaves all three disabled in the image, so that nothing starts before the boot has put the key and the
configuration in place.
"""

from __future__ import annotations

import re
import shlex

CONF_PATH = "/etc/slurm/slurm.conf"          # Debian's and SchedMD's default (--sysconfdir=/etc/slurm)
REHEARSAL_SLURM = "22.05"        # Debian 12's slurm-wlm (22.05.8): what rehearsal nodes run; AWS: ami/versions.json
UNIT_DIR = "/etc/systemd/system"  # the administrator's units: they take precedence over the packages' in /lib/systemd
SLURMD_SERVICE, SLURMCTLD_SERVICE, MUNGE_SERVICE = "slurmd.service", "slurmctld.service", "munge.service"
SLURMD_UNIT = f"{UNIT_DIR}/{SLURMD_SERVICE}"
SLURMCTLD_UNIT = f"{UNIT_DIR}/{SLURMCTLD_SERVICE}"
# The units' EnvironmentFile: /etc/default on Debian and Ubuntu (SchedMD's units read /etc/sysconfig too; not here).
SLURMD_ENV = "/etc/default/slurmd"
SLURMCTLD_ENV = "/etc/default/slurmctld"
# A dynamic node's slurmd exits 1 when it cannot fetch its configuration from slurmctld (slurmd.c, main: "slurmd
# initialization failed"), as when a worker boots, or reboots, before the head node's slurmctld is up. SchedMD's unit
# does not restart it; this one does, every SLURMD_RESTART_S, without a start limit, so the node joins whenever the
# controller comes (an addition to SchedMD's unit, with StartLimitIntervalSec=0: systemd.unit(5)).
SLURMD_RESTART_S = 10
SLURMD_START_WAIT_S = 600         # how long the first boot waits for slurmd to be up before it reports failure
# No cgroup.conf: CgroupPlugin's default is autodetect (cgroup.conf(5), 22.05 and 23.11: 'The default value is
# "autodetect"'), which takes cgroup/v2 on Ubuntu 22.04's and Debian 12's unified hierarchy. slurmd initializes it with
# proctrack/linuxproc and task/none too, so the image must have the plugin (ami/components/slurm.sh builds it, with
# dbus) and slurmd must run in a unit with Delegate=yes (cgroup_v2.c, init: "Systemd MUST have Delegated it to us").
CGROUP_PLUGIN = "autodetect"
CGROUP_CONF = "/etc/slurm/cgroup.conf"        # beside slurm.conf on the head node; configless nodes fetch it too
# Rehearsal nodes only: the machine they run on may mount cgroup v1 controllers beside its cgroup2 hierarchy (the
# development machine does), and every process on it then lists those in /proc/self/cgroup, whatever its namespaces;
# Slurm 22.05's cgroup/v2 plugin refuses that at init ("Hybrid mode is not supported", cgroup_v2.c,
# _get_self_cgroup_path), while cgroup/v1 loads and, with proctrack/linuxproc and task/none, touches no controller.
# The one named difference of the rehearsal's Slurm from the stack's: on AWS there is no cgroup.conf.
REHEARSAL_CGROUP_PLUGIN = "cgroup/v1"


def cgroup_conf(plugin: str) -> str | None:
    """cgroup.conf for ``plugin``, or None where Slurm's default (autodetect) is wanted: no file at all."""
    if plugin == CGROUP_PLUGIN:
        return None
    return f"# Rendered by launcher/plans/slurm_units.py (cgroup_conf).\nCgroupPlugin={plugin}\n"


def release(version: str) -> tuple[int, int]:
    """Slurm's release (major, minor) from "23.11.10" or "22.05"; dynamic nodes (slurmd -Z) need 22.05 or later."""
    m = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?", version.strip())
    if not m:
        raise ValueError(f"not a Slurm version: {version!r} (e.g. 23.11.10 or 22.05)")
    found = (int(m[1]), int(m[2]))
    if found < (22, 5):
        raise ValueError(f"Slurm {version} has no dynamic nodes (slurmd -Z): 22.05 or later")
    return found


def _notify(version: str) -> bool:
    """From 23.11 SchedMD's units are Type=notify and start the daemons with --systemd (slurmd(8): "Use when
    starting the daemon with systemd"); up to 23.02 they are Type=simple with -D (run in the foreground) and -s."""
    return release(version) >= (23, 11)


def units(version: str) -> dict[str, str]:
    """slurmd.service and slurmctld.service for Slurm ``version``, by path under /etc/systemd/system: SchedMD's units
    of that release, with configure's substitutions made (@sbindir@ /usr/sbin, @SYSTEMD_TASKSMAX_OPTION@
    TasksMax=infinity), /etc/default for the options, and slurmd restarted until it reaches the controller."""
    notify = _notify(version)
    tag = "slurm-23-11-10-1" if notify else "slurm-22-05-8-1"
    header = f"# Rendered by launcher/plans/slurm_units.py (units) for Slurm {version}: etc/%s.service.in at {tag}."
    after = "After=munge.service network-online.target remote-fs.target" + (" sssd.service" if notify else "")
    slurmd = [
        header % "slurmd",
        "[Unit]",
        "Description=Slurm node daemon",
        after,
        "Wants=network-online.target",
        # No ConditionPathExists=/etc/slurm/slurm.conf (SchedMD's is commented out; Debian's package has it): a
        # configless node has none, it fetches the configuration from slurmctld.
        "StartLimitIntervalSec=0",
        "",
        "[Service]",
        f"Type={'notify' if notify else 'simple'}",
        f"EnvironmentFile=-{SLURMD_ENV}",
        *(["RuntimeDirectory=slurm", "RuntimeDirectoryMode=0755"] if notify else []),
        f"ExecStart=/usr/sbin/slurmd {'--systemd' if notify else '-D -s'} $SLURMD_OPTIONS",
        "ExecReload=/bin/kill -HUP $MAINPID",
        # Only slurmd itself is stopped with the unit: the jobs' slurmstepd survive a restart of slurmd.
        "KillMode=process",
        "LimitNOFILE=131072",
        # Every job inherits it through slurmstepd: EFA registers its buffers as locked memory.
        "LimitMEMLOCK=infinity",
        "LimitSTACK=infinity",
        # slurmd's cgroup plugin needs its subtree delegated (CGROUP_PLUGIN).
        "Delegate=yes",
        "TasksMax=infinity",
        "Restart=on-failure",
        f"RestartSec={SLURMD_RESTART_S}",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    slurmctld = [
        header % "slurmctld",
        "[Unit]",
        "Description=Slurm controller daemon",
        after,
        "Wants=network-online.target",
        "ConditionPathExists=" + CONF_PATH,
        "",
        "[Service]",
        f"Type={'notify' if notify else 'simple'}",
        f"EnvironmentFile=-{SLURMCTLD_ENV}",
        # From 23.11 slurmctld runs as SlurmUser from the start (it owns StateSaveLocation and the log directory:
        # controller_boot_commands); up to 23.02 it starts as root and drops to SlurmUser itself.
        *(["User=slurm", "Group=slurm", "RuntimeDirectory=slurmctld", "RuntimeDirectoryMode=0755"] if notify else []),
        f"ExecStart=/usr/sbin/slurmctld {'--systemd' if notify else '-D -s'} $SLURMCTLD_OPTIONS",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "LimitNOFILE=65536",
        "TasksMax=infinity",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
    ]
    return {SLURMD_UNIT: "\n".join(slurmd) + "\n", SLURMCTLD_UNIT: "\n".join(slurmctld) + "\n"}


def environment_file(variable: str, argv: list[str]) -> str:
    """A unit's EnvironmentFile setting ``variable`` to ``argv``. systemd keeps a double-quoted value as it is (single
    quotes included), and a unit's ``$VARIABLE`` "will be replaced by the value of the environment variable split at
    whitespace" (systemd.service(5)), quotes removed (env-util.c, replace_env_argv: EXTRACT_UNQUOTE): so each word
    is shell-quoted inside one pair of double quotes, which a shell reads the same way."""
    value = shlex.join(argv)
    if any(c in value for c in '"\\\n'):
        raise ValueError(f"{variable}: a double quote, backslash or newline cannot be written here: {value!r}")
    return f'# Rendered by launcher/plans/slurm_units.py (environment_file).\n{variable}="{value}"\n'


def write_commands(path: str, text: str, mode: int = 0o644) -> list[str]:
    """Commands that write ``text`` to ``path`` byte for byte (one shell word, ``printf %s``: no here-document
    delimiter to collide with, nothing expanded) and set its mode."""
    return [f"install -d -m 0755 {path.rsplit('/', 1)[0]}",
            f"printf %s {shlex.quote(text)} > {path}",
            f"chmod {mode:04o} {path}"]


def enable_commands(service: str, *, wait_s: int | None = None) -> list[str]:
    """Load the units just written, then enable munge and ``service`` and start them now: enabled, they start again
    at every boot (the user data runs only at the first). ``systemctl enable --now`` waits for a service to be up;
    with ``wait_s`` it does not (slurmd is restarted until the controller answers, and a start job would wait as
    long), and the boot waits up to ``wait_s`` for the service to be active (from 23.11: SchedMD's Type=notify, so
    slurmd has fetched its configuration), then fails naming it."""
    first = ["systemctl daemon-reload", f"systemctl enable --now {MUNGE_SERVICE}"]
    if wait_s is None:
        return [*first, f"systemctl enable --now {service}"]
    failed = f"scaletrain: {service} is not active after {wait_s} s (journalctl -u {service})"
    return [*first, f"systemctl enable --now --no-block {service}",
            f"timeout {wait_s} bash -c 'until systemctl is-active --quiet {service}; do sleep 1; done' || "
            f'{{ echo "{failed}" >&2; exit 1; }}']
