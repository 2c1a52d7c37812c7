"""Reaching AWS nodes that have no public address: pure text for ssh_config and known_hosts.

- The launcher's own ssh_config goes through SSM Session Manager by default (``ProxyCommand aws ssm
  start-session --document-name AWS-StartSSHSession``, HostName = the instance id), or through a bastion
  the user names (``ProxyJump``, HostName = the private address).
- The nodes' ssh_config (what mpirun on the first node uses) names private addresses directly: the nodes
  share a subnet and a security group open to itself.
- Host keys are pinned from what each instance printed on its console at first boot (cloud-init's
  ``-----BEGIN SSH HOST KEY KEYS-----`` block), read with EC2 GetConsoleOutput, never accepted on first use.
"""

from __future__ import annotations

import re
import shlex

from launcher.errors import LaunchError
from launcher.render import _env

__all__ = ["BASTION_RE", "authorize_key_script", "host_keys_from_console", "known_host_name", "known_hosts_aws",
           "node_ssh_config", "ssh_config_bastion", "ssh_config_ssm", "ssm_proxy_command"]

_BEGIN = "-----BEGIN SSH HOST KEY KEYS-----"
_END = "-----END SSH HOST KEY KEYS-----"
_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
_KEY_LINE = re.compile(r"^(?P<type>[a-z0-9-]+) (?P<blob>[A-Za-z0-9+/=]{40,})(?: .*)?$")
BASTION_RE = re.compile(r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9.-]+)(?::(?P<port>[0-9]{1,5}))?$")


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
            known_hosts: str, proxy_command: str | None = None, proxy_jump: str | None = None,
            ports: dict[str, int] | None = None) -> str:
    ports = {n: p for n, p in (ports or {}).items() if p != 22}  # the shared block's Port 22 covers the rest
    return _env.get_template("ssh_config_aws.j2").render(
        cluster=cluster, how=how, user=user, identity_file=identity_file, known_hosts=known_hosts,
        proxy_command=proxy_command, proxy_jump=proxy_jump,
        nodes=[{"name": n, "host": h, "port": ports.get(n)} for n, h in nodes], names=[n for n, _ in nodes])


def ssh_config_ssm(cluster: str, nodes: list[tuple[str, str]], *, user: str, identity_file: str, known_hosts: str,
                   region: str, profile: str | None = None) -> str:
    """nodes: (name, instance id). SSH through Session Manager: no public address, no inbound port."""
    return _render(cluster, "through SSM Session Manager", nodes, user=user, identity_file=identity_file,
                   known_hosts=known_hosts, proxy_command=ssm_proxy_command(region, profile))


def ssh_config_bastion(cluster: str, nodes: list[tuple[str, str]], *, user: str, identity_file: str,
                       known_hosts: str, bastion: str) -> str:
    """nodes: (name, private address). SSH through a bastion host, ``[user@]host[:port]``."""
    if not BASTION_RE.match(bastion):
        raise LaunchError(f"--bastion '{bastion}' is not [user@]host[:port]")
    return _render(cluster, f"through bastion {bastion}", nodes, user=user, identity_file=identity_file,
                   known_hosts=known_hosts, proxy_jump=bastion)


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
