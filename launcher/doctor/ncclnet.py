"""Which network plugin NCCL loaded, read from its ``NCCL_DEBUG=INFO`` lines: pure (the doctor's allreduce prints them).

The image carries one aws-ofi-nccl, the version ami/versions.json pins; a second copy earlier in the library search
path (the EFA installer ships its own) would be the one NCCL loads. Only NCCL itself can say which it took, in lines
like these (real output, tests/data/doctor/nccl-info/):

    host:188:585 [0] NCCL INFO NET/Plugin: Loaded net plugin Libfabric (v10)
    host:188:585 [0] NCCL INFO Successfully loaded external plugin libnccl-net.so
    host:77729:77729 [0] NCCL INFO Successfully loaded external network plugin /opt/aws-ofi-nccl/lib/libnccl-net.so
    host:188:585 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.2
    host:188:585 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 1 nics)
    host:188:585 [0] NCCL INFO Using network Libfabric
    host:556:556 [0] NCCL INFO NET/Plugin: No plugin found (libnccl-net.so)
    host:556:574 [0] NCCL INFO Using network Socket

The plugin logs ``"Initializing " PACKAGE_STRING`` when NCCL initialises it (aws-ofi-nccl, src/nccl_ofi_net.cpp; its
log prefix is "NET/OFI "; releases before 1.5 logged "NET/OFI Using aws-ofi-nccl 1.4.0aws"); NCCL names the network
it chose per communicator ("Using network Libfabric", or "AWS Libfabric" from plugins before 1.13, "Socket" when it
fell back to TCP). Each line starts ``HOST:PID:TID [CUDA device]``, so every rank is told apart.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from infra.catalog import InstanceType
from launcher.doctor.checks import Check, fail, ok, skip

__all__ = ["DEBUG_ENV", "NAME", "RankNet", "check_nccl_net", "parse_nccl_info"]

NAME = "nccl plugin"
# NCCL's environment for the lines above: INIT and NET are the subsystems that print them (NCCL User Guide,
# "Environment Variables", NCCL_DEBUG and NCCL_DEBUG_SUBSYS:
# https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
DEBUG_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}

_LINE = re.compile(r"([A-Za-z0-9_.-]+):(\d+):\d+ \[\d+\] NCCL INFO (.*?)\s*$")
_VERSION = re.compile(r"NET/OFI (?:Initializing|Using) aws-ofi-nccl (\S+)")
_PATH = re.compile(r"Successfully loaded external (?:network )?plugin (\S+)")
_PROVIDER = re.compile(r"NET/OFI Selected [Pp]rovider is ([A-Za-z0-9_;+-]+)")
_NETWORK = re.compile(r"^Using network (.+)$")
_NO_PLUGIN = re.compile(r"NET/Plugin ?: (?:No plugin found \(([^)]+)\)|Could not find: (libnccl-net\S*?))\.?$")


@dataclass
class RankNet:
    """What one NCCL process (host, pid) said about its network plugin."""

    host: str
    plugin_version: str | None = None
    plugin_path: str | None = None
    provider: str | None = None
    networks: list[str] = field(default_factory=list)
    missing: str | None = None      # the plugin library NCCL looked for and did not find


def parse_nccl_info(text: str) -> list[RankNet]:
    """Every NCCL process's plugin facts, in the order the processes first spoke."""
    ranks: dict[tuple[str, str], RankNet] = {}
    for line in text.splitlines():
        found = _LINE.search(line)
        if not found:
            continue
        host, pid, message = found.groups()
        rank = ranks.setdefault((host, pid), RankNet(host))
        if m := _VERSION.search(message):
            rank.plugin_version = m.group(1)
        elif (m := _PATH.search(message)) and "tuner" not in message:
            rank.plugin_path = m.group(1)
        elif m := _PROVIDER.search(message):
            rank.provider = m.group(1)
        elif m := _NETWORK.search(message):
            rank.networks.append(m.group(1))
        elif m := _NO_PLUGIN.search(message):
            rank.missing = m.group(1) or m.group(2)
    return [r for r in ranks.values() if r.plugin_version or r.networks or r.missing or r.provider]


def _bare(version: str) -> str:
    """'v1.14.0-aws' and '1.4.0aws' compare as '1.14.0' and '1.4.0' (releases before 1.13 carried an -aws suffix)."""
    return re.sub(r"-?aws$", "", version.strip().lstrip("vV"))


def _libfabric(network: str) -> bool:
    return network in ("Libfabric", "AWS Libfabric")


def check_nccl_net(output: str, instance: InstanceType, *, pinned: str | None, efa_devices: int | None = None
                   ) -> Check:
    """The plugin NCCL loaded on every rank of the allreduce: aws-ofi-nccl at the ``pinned`` version (the image's
    ``scaletrain:aws-ofi-nccl`` tag, from ami/versions.json), on libfabric's efa provider, carrying NCCL's network."""
    if not instance.has_efa or efa_devices == 0:
        return skip(NAME, f"{instance.name}'s workers have no EFA; NCCL uses TCP sockets")
    ranks = parse_nccl_info(output)
    if not ranks:
        return fail(NAME, "all_reduce_perf printed no NCCL INFO lines about its network (NCCL_DEBUG=INFO, "
                          "NCCL_DEBUG_SUBSYS=INIT,NET), so which plugin NCCL loaded is unknown")
    for rank in ranks:
        socket = next((n for n in rank.networks if not _libfabric(n)), None)
        if socket or (rank.missing and not rank.plugin_version):
            why = f"NCCL found no plugin ({rank.missing})" if rank.missing else "aws-ofi-nccl did not load"
            return fail(NAME, f"NCCL used network {socket or 'Socket'} on {rank.host}, not EFA: {why}")
        if rank.provider and rank.provider != "efa":
            return fail(NAME, f"aws-ofi-nccl {rank.plugin_version} on {rank.host} chose libfabric's "
                              f"{rank.provider} provider, not efa")
    loaded = sorted({r.plugin_version for r in ranks if r.plugin_version})
    if not loaded:
        return fail(NAME, f"NCCL used network {', '.join(sorted({n for r in ranks for n in r.networks}))} but no rank "
                          "logged which aws-ofi-nccl it loaded (NET/OFI Initializing aws-ofi-nccl ...)")
    if len(loaded) > 1:
        where = "; ".join(f"{v} on {', '.join(sorted({r.host for r in ranks if r.plugin_version == v}))}"
                          for v in loaded)
        return fail(NAME, f"ranks loaded different aws-ofi-nccl plugins: {where}")
    version = loaded[0]
    path = next((r.plugin_path for r in ranks if r.plugin_path), None)
    source = f" from {path}" if path else ""
    if pinned and _bare(version) != _bare(pinned):
        return fail(NAME, f"NCCL loaded aws-ofi-nccl {version}{source}, but the image pins {pinned} "
                          "(ami/versions.json): another plugin comes first in the library search path")
    networks = sorted({n for r in ranks for n in r.networks}) or ["Libfabric"]
    providers = sorted({r.provider for r in ranks if r.provider})
    return ok(NAME, f"aws-ofi-nccl {version}{source}, network {', '.join(networks)}"
                    + (f", provider {', '.join(providers)}" if providers else "")
                    + f" ({len({r.host for r in ranks})} node(s))")
