"""What the stack's instances run at first boot (their EC2 user data), as pure text: the head node enables Slurm's
controller, every worker and reducer ``slurmd -Z``, which registers itself with it, each with the cluster's munge key,
as systemd units that start again at every boot after. The Slurm decisions themselves (slurm.conf, the units, each
daemon's options) are :mod:`launcher.plans.slurm`'s; this module only places them in a boot script, which assumes
nothing beyond a systemd host with the image's packages (rehearsal nodes run the same scripts). Nothing here imports
aws-cdk-lib: the stack passes CloudFormation tokens in as strings (the head node's address, the secret's ARN), which
CDK resolves wherever they land in the text.

A script is run once, as root, by cloud-init on the instance's first boot (``scripts-user``:
https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/user-data.html, "Run commands when you launch an EC2 instance
with user data input": "scripts entered as user data are run as the root user" and "only during the boot cycle when
you first launch an instance"). A script that exits non-zero leaves cloud-init's status at error, which the
launcher's readiness check reports.
"""

from __future__ import annotations

import functools
import shlex

from ami import paths
from launcher.plans import slurm
from launcher.plans import storage as storage_plan

__all__ = [
    "HEAD_ROLE",
    "REPLACEMENT_SPARE_MIN",
    "head_script",
    "image_slurm",
    "max_nodes",
    "munge_key_argv",
    "node_script",
    "storage_script",
    "slurmd_line",
]

HEAD_ROLE = "head"  # the head node's scaletrain:role tag; discovery lists only worker and reducer instances

# A dynamic node registers under its host name, which on EC2 is its private address (ip-10-0-1-23), so a replacement
# from an Auto Scaling group is a new node to slurmctld, and the one it replaced stays, DOWN, until someone deletes it
# ("scontrol delete nodename=", https://slurm.schedmd.com/dynamic_nodes.html). MaxNodeCount must leave room for them:
# every node replaced once, and at least this many more on a small cluster.
REPLACEMENT_SPARE_MIN = 8

# Values only the instance knows at boot, written as placeholders into the text rendered here and filled in by the
# script from the shell variables of the same purpose.
_HEAD_HOST, _HEAD_ADDR, _NODE_ADDR = "@HEAD_HOST@", "@HEAD_ADDR@", "@NODE_ADDR@"
_CONF_END = "SLURM_CONF"  # the here-document's delimiter
_EPILOG_END = "SLURM_EPILOG"
# munged refuses a key file shorter than 32 bytes (munge's src/munged/conf.c: "Keyfile must be at least %d bytes",
# MUNGE_MINIMUM_SECRET_KEY_LEN 32, https://github.com/dun/munge); 1024 bytes is the length its documented way of making
# one writes (dd if=/dev/urandom bs=1 count=1024). Letters and digits only: no punctuation for the shell to mangle.
MUNGE_KEY_LENGTH = 1024
KEY_TRIES, KEY_RETRY_S = 30, 10  # how long a node waits for the munge key: 5 minutes

# IMDSv2: a session token from a PUT, then the metadata with the token in a header; the launch templates require
# tokens (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-retrieval.html, "Instance metadata
# service version 2"). local-ipv4 is "the private IPv4 address of the instance ... the eth0 device (the device for
# which the device number is 0)" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/instancedata-data-categories.html),
# which on an EFA node is the primary interface, the only one with an address (infra/layout.py).
_IMDS = (
    "imds() {\n"
    "  local token\n"
    "  token=$(curl -sSf --retry 5 -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 300' "
    "http://169.254.169.254/latest/api/token)\n"
    '  curl -sSf --retry 5 -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/meta-data/$1"\n'
    "}"
)


@functools.cache
def image_slurm() -> str:
    """The Slurm release of the stack's image: ami/versions.json's ``slurm``, which ami/components/slurm.sh builds.
    The units' shape follows it (:func:`launcher.plans.slurm.units`); an image of the user's own (``-c ami=``) is
    expected to carry the same pinned versions as the project's."""
    from ami import render

    return render.load_versions().slurm


def max_nodes(*, workers: int, reducers: int) -> int:
    """slurm.conf's MaxNodeCount: the workers and reducers, and room for each to be replaced once (at least
    :data:`REPLACEMENT_SPARE_MIN` more), since a replacement registers as a new node (see above)."""
    if workers < 1 or reducers < 0:
        raise ValueError(f"a cluster has at least one worker and no negative reducers, got {workers} and {reducers}")
    total = workers + reducers
    return total + max(total, REPLACEMENT_SPARE_MIN)


def munge_key_argv(*, region: str, secret_id: str, aws_cli: str = paths.AWS_CLI) -> list[str]:
    """The one AWS CLI call that reads the cluster's munge key: GetSecretValue, the secret's string only, as text.

    ``--region`` is explicit: the nodes have no AWS configuration, and the secret lives in the stack's region
    (https://docs.aws.amazon.com/cli/latest/reference/secretsmanager/get-secret-value.html; ``--query SecretString
    --output text`` prints the value alone, followed by a newline, the same bytes on every node).
    """
    return [aws_cli, "--region", region, "secretsmanager", "get-secret-value", "--secret-id", secret_id,
            "--query", "SecretString", "--output", "text"]


def teardown_argv_line(*, region: str, cluster_name: str, aws_cli: str = paths.AWS_CLI) -> list[str]:
    """What the head node's epilog runs after a `launch train --teardown` job: the stack's TTL parameter moved to
    now, so that the TTL guard deletes the stack at its next run (infra/ttl.py; the head role may put this one
    parameter: "ssm:PutParameter", https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_PutParameter.html)."""
    from infra import ttl

    return [f"{aws_cli} --region {shlex.quote(region)} ssm put-parameter --name "
            f"{shlex.quote(ttl.parameter_name(cluster_name))} --type String --overwrite "
            f'--value "$(date -u +{ttl.EXPIRY_FORMAT})"']


def _fetch_munge_key(*, region: str, secret_id: str) -> list[str]:
    """Write the munge key (mode 0400 under umask 077 from the start, never world-readable), retried for a while: the
    instance profile's credentials and a new VPC endpoint's DNS can lag the first seconds of boot (IAM is eventually
    consistent: https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_general.html, "Changes that I make are
    not always immediately visible")."""
    call = shlex.join(munge_key_argv(region=region, secret_id=secret_id))
    return [
        "install -d -o munge -g munge -m 0700 /etc/munge",
        "tries=0",
        f"until (umask 077 && {call} > {slurm.MUNGE_KEY}); do",
        f'  tries=$((tries + 1)); if [ "$tries" -ge {KEY_TRIES} ]; then',
        '    echo "scaletrain: could not read the munge key from Secrets Manager" >&2; exit 1',
        "  fi",
        f"  sleep {KEY_RETRY_S}",
        "done",
    ]


def _script(lines: list[str]) -> str:
    return "\n".join(["#!/bin/bash", "set -euo pipefail", *lines]) + "\n"


def _mount(storage: dict | None) -> list[str]:
    """The shared storage's mount, made by the instance's own boot before its Slurm daemon starts, and at every
    boot after from /etc/fstab (:func:`launcher.plans.storage.boot_mount_commands`): FSx for Lustre on AWS, from
    the stack's outputs passed in as tokens; the storage host's sshfs on a rehearsal node. None: storage the
    launcher sets up after boot (BeeGFS on the nodes' RAM disks) or none at all."""
    return storage_plan.boot_mount_commands(storage) if storage else []


def storage_script(*, storage: dict) -> str:
    """The storage part alone: a rehearsal cluster without Slurm runs it (the stack always has Slurm)."""
    return _script(_mount(storage))


def head_script(*, cluster_name: str, region: str, secret_id: str, max_nodes: int,
                slurm_version: str | None = None, storage: dict | None = None,
                cgroup_plugin: str = slurm.CGROUP_PLUGIN) -> str:
    """The head node's boot: slurm.conf, rendered here by :func:`launcher.plans.slurm.slurm_conf`, the epilog, the
    munge key, then munge.service and slurmctld.service written, enabled and started
    (:func:`launcher.plans.slurm.controller_boot_commands`; ``slurm_version``: the release the units are shaped for,
    :func:`image_slurm` unless given, "22.05" on a rehearsal node).

    The controller's host name and address are the instance's own, read at boot (``hostname -s``, which slurmctld
    compares SlurmctldHost with, and IMDSv2's local-ipv4). The address is not pinned in the template: a pinned
    private IP makes the instance impossible to replace by CloudFormation, which creates the new instance before it
    deletes the old one and cannot give the same address to both; and an address picked at synth time could collide
    with the nodes' own, which the subnet hands out. The nodes learn it from CloudFormation
    (Fn::GetAtt PrivateIp, see :func:`node_script`).
    """
    conf = slurm.slurm_conf(slurm.SlurmCluster(name=cluster_name, controller=_HEAD_HOST, controller_addr=_HEAD_ADDR,
                                               max_nodes=max_nodes, epilog_ctld=slurm.EPILOG_PATH,
                                               health_check=slurm.HEALTH_CHECK,
                                               health_check_interval_s=slurm.HEALTH_CHECK_INTERVAL_S))
    assert _CONF_END not in conf.splitlines()
    epilog = slurm.epilog_script(action=teardown_argv_line(region=region, cluster_name=cluster_name))
    assert _EPILOG_END not in epilog.splitlines()
    return _script([
        _IMDS,
        "HEAD_HOST=$(hostname -s)",
        "HEAD_ADDR=$(imds local-ipv4)",
        f"install -d -m 0755 {slurm.CONF_PATH.rsplit('/', 1)[0]}",
        f"cat > {slurm.CONF_PATH} <<'{_CONF_END}'",
        conf.rstrip("\n"),
        _CONF_END,
        f'sed -i -e "s/{_HEAD_HOST}/$HEAD_HOST/g" -e "s/{_HEAD_ADDR}/$HEAD_ADDR/g" {slurm.CONF_PATH}',
        f"cat > {slurm.EPILOG_PATH} <<'{_EPILOG_END}'",
        epilog.rstrip("\n"),
        _EPILOG_END,
        f"chmod 0755 {slurm.EPILOG_PATH}",
        *(slurm.write_commands(slurm.CGROUP_CONF, cgroup) if (cgroup := slurm.cgroup_conf(cgroup_plugin)) else []),
        *_mount(storage),
        *_fetch_munge_key(region=region, secret_id=secret_id),
        *slurm.controller_boot_commands(slurm_version or image_slurm()),
    ])


def _expand(command: str, placeholder: str, variable: str) -> str:
    """``command`` with each ``placeholder`` replaced by the shell variable ``variable``, as one word wherever it
    stands: inside single quotes ``'"$VAR"'`` (close the quotes, the variable in double quotes, reopen them), inside
    double quotes ``${VAR}``, bare ``"$VAR"``. The quoting is followed character by character (POSIX sh, "Quoting")."""
    out, quote, i = [], "", 0
    while i < len(command):
        if command.startswith(placeholder, i):
            out.append({"'": f"'\"${variable}\"'", '"': f"${{{variable}}}", "": f'"${variable}"'}[quote])
            i += len(placeholder)
            continue
        c = command[i]
        if c == "\\" and quote != "'":  # an escaped character, outside single quotes
            out.append(command[i:i + 2])
            i += 2
            continue
        if c in "'\"" and quote in ("", c):
            quote = "" if quote else c
        out.append(c)
        i += 1
    assert not quote, f"unbalanced quotes in {command!r}"
    return "".join(out)


def slurmd_line(*, controller_addr: str, role: str, cpus: int, address_variable: str = "NODE_ADDR",
                health_check: list[str] | None = None, slurm_version: str | None = None) -> list[str]:
    """:func:`launcher.plans.slurm.worker_boot_commands` with the node's own address taken from a shell variable at
    boot: rendered as a placeholder, which becomes the variable wherever it lands (the ``--conf`` value in slurmd's
    environment file, written as one single-quoted ``printf`` word; the replacement's own NodeAddr update,
    :func:`launcher.plans.slurm_rejoin.rejoin_commands`, a bare word), so the shell expands it and each value stays one
    word."""
    commands = slurm.worker_boot_commands(slurm_version or image_slurm(), controller_addr=controller_addr, role=role,
                                          cpus=cpus, address=_NODE_ADDR, health_check=health_check)
    return [_expand(command, _NODE_ADDR, address_variable) for command in commands]


def node_script(*, region: str, secret_id: str, controller_addr: str, role: str, cpus: int,
                health_check: list[str] | None = None, slurm_version: str | None = None,
                storage: dict | None = None) -> str:
    """A worker's or reducer's boot: the munge key, then munge.service and slurmd.service (``slurmd -Z``, registering
    with the head node at ``controller_addr``, the head's private IP, and fetching slurm.conf from it, with ``role``'s
    feature and ``cpus``, the catalog's vCPUs) written, enabled and started. An Auto Scaling group's replacement runs
    the same and joins with nobody attached. ``slurm_version``: as for :func:`head_script`."""
    return _script([
        _IMDS,
        "NODE_ADDR=$(imds local-ipv4)",
        *_mount(storage),
        *_fetch_munge_key(region=region, secret_id=secret_id),
        *slurmd_line(controller_addr=controller_addr, role=role, cpus=cpus, health_check=health_check,
                     slurm_version=slurm_version),
    ])
