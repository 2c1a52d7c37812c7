"""The image's component scripts run for real against a host made of fakes: the commands that would touch the
machine (apt-get, systemctl, nvidia-smi, lspci, curl, ...) are small scripts that record what they were asked and
answer as a real host would, and PATH holds nothing else but plain tools, so a script that reaches for anything
else fails here instead of changing the machine the tests run on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ami/ is a CDK app beside the package
    sys.path.insert(0, str(ROOT))

from ami import paths, render  # noqa: E402

COMPONENTS = ROOT / "ami" / "components"
VERSIONS = render.load_versions()
# Plain tools the scripts may use as they are; everything with an effect on the host is a fake.
TOOLS = ("bash", "sh", "env", "cat", "grep", "awk", "sed", "cut", "head", "tail", "wc", "tr", "sort", "uniq",
         "mktemp", "rm", "mkdir", "install", "ln", "cp", "mv", "chmod", "dirname", "basename", "tee", "diff", "find",
         "tar", "gzip", "unzip", "gpg", "seq", "true", "false", "touch", "ls", "uname", "nproc", "cmp")


class Host:
    """A directory of fakes and tools that is a script's whole PATH, a state directory, and a log of calls."""

    def __init__(self, tmp_path: Path, fakes: dict[str, str]) -> None:
        self.root = tmp_path
        self.bin = tmp_path / "bin"
        self.state = tmp_path / "state"
        self.calls = tmp_path / "calls.log"
        self.bin.mkdir()
        self.state.mkdir()
        self.calls.touch()
        for tool in TOOLS:
            if real := shutil.which(tool):
                (self.bin / tool).symlink_to(real)
        for name, body in fakes.items():
            self.fake(name, body)

    def fake(self, name: str, body: str) -> None:
        path = self.bin / name
        path.unlink(missing_ok=True)
        path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"$CALLS"\n{body}\n')
        path.chmod(0o755)

    def run(self, script: str, phase: str | None, env: dict[str, str], *, wrap: list[str] | None = None,
            timeout: int = 120) -> subprocess.CompletedProcess:
        full_env = {"PATH": str(self.bin), "HOME": str(self.root), "CALLS": str(self.calls),
                    "STATE": str(self.state), "LC_ALL": "C", **env}
        argv = [*(wrap or []), shutil.which("bash") or "/bin/bash", str(COMPONENTS / script),
                *([phase] if phase else [])]
        return subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=timeout)

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines()


def component_env(key: str, **kwargs) -> dict[str, str]:
    return render.component_env(VERSIONS, next(c for c in render.COMPONENTS if c.key == key), **kwargs)


# --- aws-ofi-nccl.sh: hwloc headers before configure (item 10) ------------------------------------------------------

CONFIGURE = """#!/usr/bin/env bash
# Stands for aws-ofi-nccl's configure: m4/check_pkg_hwloc.m4 needs hwloc.h and libhwloc.
echo "configure $*" >>"$CALLS"
test -f "$SYSROOT/usr/include/hwloc.h" || { echo "configure: error: hwloc not found" >&2; exit 1; }
for a in "$@"; do case "$a" in --prefix=*) echo "${a#--prefix=}" >prefix ;; esac; done
"""
MAKE = 'if [ "${1:-}" = install ]; then p=$(cat prefix); mkdir -p "$p/lib"; touch "$p/lib/libnccl-net-ofi.so"; fi'


@pytest.mark.skipif(shutil.which("unshare") is None, reason="unshare (util-linux) is not installed")
def test_aws_ofi_nccl_installs_the_hwloc_headers_its_configure_needs(tmp_path) -> None:
    version = VERSIONS.aws_ofi_nccl
    source = tmp_path / "src" / f"aws-ofi-nccl-{version}"
    source.mkdir(parents=True)
    (source / "configure").write_text(CONFIGURE)
    (source / "configure").chmod(0o755)
    with tarfile.open(tmp_path / "release.tar.gz", "w:gz") as tar:
        tar.add(source, arcname=source.name)
    sysroot = tmp_path / "sysroot"
    host = Host(tmp_path, {
        "curl": f"cat {tmp_path / 'release.tar.gz'}",
        "apt-get": ('if [ "$1" = install ]; then for a in "$@"; do [ "$a" = libhwloc-dev ] && mkdir -p '
                    '"$SYSROOT/usr/include" && touch "$SYSROOT/usr/include/hwloc.h"; done; fi; true'),
        "make": MAKE, "ldconfig": "true"})
    prefix = tmp_path / "ofi-nccl"
    env = {**component_env("aws-ofi-nccl"), "SCALETRAIN_OFI_NCCL_PREFIX": str(prefix), "SYSROOT": str(sysroot)}
    # /etc/ld.so.conf.d is the one system path the script writes: a private mount namespace gives it a scratch one.
    ldconf = tmp_path / "ld.so.conf.d"
    ldconf.mkdir()
    unshare = [shutil.which("unshare"), "--user", "--map-root-user", "--mount", "--",
               shutil.which("bash") or "/bin/bash", "-c",
               f'{shutil.which("mount")} --bind {ldconf} /etc/ld.so.conf.d && exec "$@"', "sandbox"]
    probe = subprocess.run([*unshare, "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.strip()}")
    result = host.run("aws-ofi-nccl.sh", "build", env, wrap=unshare)
    assert result.returncode == 0, result.stderr
    calls = host.called()
    hwloc = next(i for i, c in enumerate(calls) if c.startswith("apt-get install") and "libhwloc-dev" in c)
    configure = next(i for i, c in enumerate(calls) if c.startswith("configure "))
    assert hwloc < configure
    assert f"--with-mpi={paths.MPI_PREFIX}" in calls[configure] and f"--with-libfabric={paths.EFA_PREFIX}" in calls[
        configure]
    assert (prefix / "VERSION").read_text().strip() == version
    assert (ldconf / "100-aws-ofi-nccl.conf").read_text().strip() == f"{prefix}/lib"
    assert os.listdir(ldconf) == ["100-aws-ofi-nccl.conf"]
