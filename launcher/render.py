"""Text the launcher writes for a cluster, rendered from templates: pure functions of their inputs."""

from __future__ import annotations

from jinja2 import Environment, PackageLoader, StrictUndefined

environment = Environment(loader=PackageLoader("launcher", "templates"), undefined=StrictUndefined,
                   keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def ssh_config(cluster: str, nodes: list[tuple[str, str, int]], *, user: str, identity_file: str,
               known_hosts: str) -> str:
    """nodes: (name, host, port) for each node."""
    return environment.get_template("ssh_config.j2").render(
        cluster=cluster, user=user, identity_file=identity_file, known_hosts=known_hosts,
        nodes=[{"name": n, "host": h, "port": p} for n, h, p in nodes], names=[n for n, _, _ in nodes])


def sshd_config(cluster: str, node: str, *, port: int, host_key: str, pid_file: str, authorized_keys: str,
                user: str, workdir: str) -> str:
    return environment.get_template("sshd_config.j2").render(
        cluster=cluster, node=node, port=port, host_key=host_key, pid_file=pid_file,
        authorized_keys=authorized_keys, user=user, workdir=workdir)


def known_hosts(entries: list[tuple[str, int, str]]) -> str:
    """entries: (host, port, public host key line). OpenSSH's and paramiko's `[host]:port` form."""
    return "".join(f"[{host}]:{port} {key.strip()}\n" if port != 22 else f"{host} {key.strip()}\n"
                   for host, port, key in entries)
