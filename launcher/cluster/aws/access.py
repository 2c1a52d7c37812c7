"""Reaching AWS nodes that have no public address: pure text for ssh_config and known_hosts, and the decisions of
putting the launcher's key on the nodes over SSM.

- The launcher's own ssh_config goes through SSM Session Manager (``ProxyCommand aws ssm start-session
  --document-name AWS-StartSSHSession``, HostName = the instance id), the only way in: the node subnet has no
  internet gateway, so nothing outside the VPC can open a connection to a node, through a bastion or otherwise.
- The nodes' ssh_config (what mpirun on the first node uses) names private addresses directly: the nodes
  share a subnet and a security group open to itself.
- Host keys are pinned from what each instance printed on its console at first boot (cloud-init's
  ``-----BEGIN SSH HOST KEY KEYS-----`` block), read with EC2 GetConsoleOutput, never accepted on first use.
- The launcher's public keys reach each node with SSM SendCommand (AWS-RunShellScript), once per instance: the
  shell (launcher.cluster.aws.api.install_keys) asks, these functions decide what to send where and what came back.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Literal

from launcher.errors import LaunchError
from launcher.render import environment

__all__ = ["SSM_MAX_TARGETS", "authorize_key_script", "buffered_console_notice", "host_keys_from_console",
           "invocation_error", "invocation_outcome", "key_install_batches", "key_install_targets", "known_host_name",
           "known_hosts_aws", "node_ssh_config", "refuses_latest_console", "send_retry_delay", "ssh_config_ssm",
           "ssm_proxy_command"]

_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
_END = "-----END SSH HOST KEY KEYS-----"
_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
_KEY_LINE = re.compile(r"^(?P<type>[a-z0-9-]+) (?P<blob>[A-Za-z0-9+/=]{40,})(?: .*)?$")


def host_keys_from_console(console: str) -> list[str]:
    """The public host keys (``TYPE BASE64``) cloud-init printed between the BEGIN/END markers.

    Console lines may carry a kernel-log prefix (``[   12.3] cloud-init[123]: ``) or a carriage return; both are
    stripped. Only known key types are kept, in the order printed; an absent block gives [].
    """
    keys: list[str] = []
    inside = False
    for raw in console.replace("\r", "").splitlines():
        line = raw.strip()
        if _BEGIN in line:
            inside, keys = True, []  # a later boot's block replaces an earlier one
            continue
        if _END in line:
            inside = False
            continue
        if not inside:
            continue
        start = min((line.find(t + " ") for t in _KEY_TYPES if t + " " in line), default=-1)
        if start < 0:
            continue
        m = _KEY_LINE.match(line[start:])
        if m and m["type"] in _KEY_TYPES:
            keys.append(f"{m['type']} {m['blob']}")
    return keys


def known_hosts_aws(entries: list[tuple[list[str], list[str]]]) -> str:
    """entries: (names the node is reached by, its host keys). One line per key, names comma-joined."""
    lines = []
    for names, keys in entries:
        if not keys:
            raise LaunchError(f"no host key pinned for {names[0]}; refusing to connect to an unverified host")
        lines += [f"{','.join(names)} {key}\n" for key in keys]
    return "".join(lines)


def ssm_proxy_command(region: str, profile: str | None = None) -> str:
    """The ProxyCommand that opens SSH over an SSM session (%h = the instance id, %p = 22)."""
    aws = "aws ssm start-session --target %h --document-name AWS-StartSSHSession --parameters 'portNumber=%p'"
    aws += f" --region {region}" + (f" --profile {profile}" if profile else "")
    return f'sh -c "{aws}"'


def _render(cluster: str, how: str, nodes: list[tuple[str, str]], *, user: str, identity_file: str,
            known_hosts: str, proxy_command: str | None = None, ports: dict[str, int] | None = None) -> str:
    ports = {n: p for n, p in (ports or {}).items() if p != 22}  # the shared block's Port 22 covers the rest
    return environment.get_template("ssh_config_aws.j2").render(
        cluster=cluster, how=how, user=user, identity_file=identity_file, known_hosts=known_hosts,
        proxy_command=proxy_command,
        nodes=[{"name": n, "host": h, "port": ports.get(n)} for n, h in nodes], names=[n for n, _ in nodes])


def ssh_config_ssm(cluster: str, nodes: list[tuple[str, str]], *, user: str, identity_file: str, known_hosts: str,
                   region: str, profile: str | None = None) -> str:
    """nodes: (name, instance id). SSH through Session Manager: no public address, no inbound port."""
    return _render(cluster, "through SSM Session Manager", nodes, user=user, identity_file=identity_file,
                   known_hosts=known_hosts, proxy_command=ssm_proxy_command(region, profile))


def node_ssh_config(cluster: str, nodes: list[tuple[str, str]], *, user: str, identity_file: str,
                    known_hosts: str, ports: dict[str, int] | None = None) -> str:
    """nodes: (name, private address). What mpirun on the first node uses to start the others.

    ``ports``: node name -> SSH port where it is not 22 (nodes sharing one address, as on loopback)."""
    return _render(cluster, "between the nodes", nodes, user=user, identity_file=identity_file,
                   known_hosts=known_hosts, ports=ports)


def known_host_name(address: str, port: int = 22) -> str:
    """How OpenSSH names a host in known_hosts: the address, or ``[address]:port`` off port 22."""
    return address if port == 22 else f"[{address}]:{port}"


def authorize_key_script(user: str, public_key: str) -> str:
    """Shell run on a node (SSM RunShellScript, as root) that lets the launcher's key log in as ``user``.

    Idempotent: the key is appended once. Only a public key ever travels through SSM.
    """
    key = public_key.strip()
    if not _KEY_LINE.match(key) or "\n" in key:
        raise LaunchError("the launcher's public key is not one OpenSSH public key line")
    home = f"$(getent passwd {shlex.quote(user)} | cut -d: -f6)"
    return "\n".join([
        "set -eu",
        f"home={home}",
        'install -d -m 700 -o "$(stat -c %U "$home")" "$home/.ssh"',
        'touch "$home/.ssh/authorized_keys"',
        f"grep -qxF {shlex.quote(key)} \"$home/.ssh/authorized_keys\" || "
        f"echo {shlex.quote(key)} >> \"$home/.ssh/authorized_keys\"",
        f'chown {shlex.quote(user)} "$home/.ssh/authorized_keys"',
        'chmod 600 "$home/.ssh/authorized_keys"',
    ]) + "\n"


# EC2 GetConsoleOutput. "By default, the console output returns buffered information that was posted shortly after an
# instance transition state (start, stop, reboot, or terminate) ... You can optionally retrieve the latest serial
# console output at any time during the instance lifecycle. This option is supported on instance types that use the
# Nitro hypervisor." (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_GetConsoleOutput.html). P3 (but
# not P3dn) runs on Xen, so EC2 refuses Latest=True there; "UnsupportedOperation" is EC2's common client error for
# a request the resource does not support (https://docs.aws.amazon.com/AWSEC2/latest/APIReference/errors-overview.html,
# "Common client error codes").
def refuses_latest_console(code: str, message: str) -> bool:
    """Whether EC2 refused GetConsoleOutput(Latest=True) because this instance cannot give its latest output (then
    the buffered output is the one to read), as opposed to any other failure, which stays an error."""
    if code == "UnsupportedOperation":
        return True
    text = message.lower()
    return code.startswith("InvalidParameter") and ("latest" in text or "nitro" in text)


def buffered_console_notice(instance_id: str) -> str:
    """Said once when a node's console can only be read buffered: why discovery may wait longer for its host keys."""
    return (f"note: EC2 gives the latest console output on Nitro instances only; reading the buffered console "
            f"output of {instance_id} (and of others like it) instead, which EC2 posts shortly after boot: their "
            f"SSH host keys may take several minutes to appear")


# SSM SendCommand: "InstanceIds ... Array Members: Maximum number of 50 items."
# (https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_SendCommand.html, "Request Parameters").
SSM_MAX_TARGETS = 50

Outcome = Literal["pending", "success", "failed"]

# GetCommandInvocation's Status: Pending | InProgress | Delayed | Success | Cancelled | TimedOut | Failed | Cancelling
# (https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_GetCommandInvocation.html, "Status"; what
# each means: https://docs.aws.amazon.com/systems-manager/latest/userguide/monitor-commands.html). Success is the
# only good end; Cancelling can only end in Cancelled. Pending, InProgress and Delayed (the node was not reachable;
# SSM tries again) are still under way.
_FAILED = ("Failed", "TimedOut", "Cancelled", "Cancelling")


def key_install_targets(nodes: Iterable[tuple[str, str]], *, installed: set[str],
                        online: set[str]) -> list[tuple[str, str]]:
    """(name, instance id) of the nodes to send the keys to now: each instance once (a replacement is a new
    instance id, so it gets them too), and only once its SSM agent answers: SendCommand to an instance whose agent
    is not running or not registered yet fails with InvalidInstanceId
    (https://docs.aws.amazon.com/systems-manager/latest/APIReference/API_SendCommand.html, "Errors")."""
    return [(name, iid) for name, iid in nodes if iid and iid not in installed and iid in online]


def key_install_batches(targets: list[tuple[str, str]]) -> list[list[tuple[str, str]]]:
    """The targets in SendCommand-sized batches."""
    return [targets[i:i + SSM_MAX_TARGETS] for i in range(0, len(targets), SSM_MAX_TARGETS)]


def send_retry_delay(attempt: int, *, base_s: float = 2.0, cap_s: float = 30.0) -> float:
    """Seconds to wait before SendCommand's attempt ``attempt + 1`` after InvalidInstanceId (exponential, capped):
    an agent that has just come online may not be registered for commands yet."""
    return min(cap_s, base_s * 2 ** attempt)


def invocation_outcome(status: str) -> Outcome:
    """One node's key installation as GetCommandInvocation reports it."""
    if status == "Success":
        return "success"
    return "failed" if status in _FAILED else "pending"


def invocation_error(node: str, instance_id: str, status: str, details: str = "", stderr: str = "") -> str:
    """What went wrong on one node, in a few words: its status, the detail when it says more, and the script's
    last line on stderr."""
    text = f"{node} ({instance_id}): {status}"
    if details and details.replace(" ", "") != status:
        text += f" ({details})"
    last = next((line.strip() for line in reversed(stderr.splitlines()) if line.strip()), "")
    return text + (f": {last[:200]}" if last else "")
