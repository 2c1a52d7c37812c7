"""The image's component scripts run for real against a host made of fakes: the commands that would touch the
machine (apt-get, systemctl, nvidia-smi, lspci, curl, ...) are small scripts that record what they were asked and
answer as a real host would, and PATH holds nothing else but plain tools, so a script that reaches for anything
else fails here instead of changing the machine the tests run on.

Every script runs sandboxed (Host.run): in a private mount namespace where /etc, /usr and /opt are read-only, and the
few system directories a test lets a script write (``scratch``) are scratch directories of its own. The suite runs as
root on a build machine, where a script's `echo ... >/etc/apt/sources.list.d/beegfs.list` would otherwise land."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ami/ is a CDK app beside the package
    sys.path.insert(0, str(ROOT))

from imagesandbox import sandbox  # noqa: E402

from ami import paths, render  # noqa: E402

COMPONENTS = ROOT / "ami" / "components"
VERSIONS = render.load_versions()
# Plain tools the scripts may use as they are; everything with an effect on the host is a fake.
TOOLS = ("bash", "sh", "env", "cat", "grep", "awk", "sed", "cut", "head", "tail", "wc", "tr", "sort", "uniq",
         "mktemp", "rm", "mkdir", "install", "ln", "cp", "mv", "chmod", "dirname", "basename", "tee", "diff", "find",
         "tar", "gzip", "unzip", "gpg", "seq", "true", "false", "touch", "ls", "uname", "nproc", "cmp")


class Host:
    """A directory of fakes and tools that is a script's whole PATH, a state directory, and a log of calls. A test
    module whose scripts need other plain tools, or that runs another copy of ami/, sets ``tools`` and
    ``components`` in a subclass."""

    tools: tuple[str, ...] = TOOLS
    components: Path = COMPONENTS

    def __init__(self, tmp_path: Path, fakes: dict[str, str]) -> None:
        self.root = tmp_path
        self.bin = tmp_path / "bin"
        self.state = tmp_path / "state"
        self.calls = tmp_path / "calls.log"
        self.bin.mkdir()
        self.state.mkdir()
        self.calls.touch()
        for tool in self.tools:
            if real := shutil.which(tool):
                (self.bin / tool).symlink_to(real)
        for name, body in fakes.items():
            self.fake(name, body)

    def fake(self, name: str, body: str) -> None:
        path = self.bin / name
        path.unlink(missing_ok=True)
        path.write_text(f'#!/usr/bin/env bash\necho "{name} $*" >>"$CALLS"\n{body}\n')
        path.chmod(0o755)

    def run(self, script: str, phase: str | None, env: dict[str, str], *, scratch: tuple[str, ...] = (),
            timeout: int = 120) -> subprocess.CompletedProcess:
        """Run ``script`` sandboxed; each of ``scratch`` (system directories) is self.root/<its name> there."""
        full_env = {"PATH": str(self.bin), "HOME": str(self.root), "CALLS": str(self.calls),
                    "STATE": str(self.state), "LC_ALL": "C", **env}
        argv = [*sandbox(self.root, scratch), shutil.which("bash") or "/bin/bash", str(self.components / script),
                *([phase] if phase else [])]
        return subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=timeout)

    def called(self) -> list[str]:
        return self.calls.read_text().splitlines()


def component_env(key: str, **kwargs) -> dict[str, str]:
    return render.component_env(VERSIONS, next(c for c in render.COMPONENTS if c.key == key), **kwargs)


def test_the_sandbox_keeps_scripts_off_this_machines_system_directories(tmp_path) -> None:
    """What every Host.run gives a script: /etc, /usr and /opt read-only, the scratch directories its own."""
    marker = f"scaletrain-sandbox-{os.getpid()}"
    script = (f"echo x >/etc/apt/sources.list.d/{marker}.list; a=$?; echo x >/usr/{marker}; b=$?; "
              f"echo x >/opt/{marker}; c=$?; echo x >/etc/{marker}; d=$?; echo $a $b $c $d")
    done = subprocess.run([*sandbox(tmp_path, ("/etc/apt/sources.list.d",)), "/bin/sh", "-c", script],
                          capture_output=True, text=True, timeout=30)
    assert done.stdout.split() == ["0", "2", "2", "2"], done.stderr  # sh: a redirection that cannot open
    assert "Read-only file system" in done.stderr
    assert (tmp_path / "sources.list.d" / f"{marker}.list").read_text() == "x\n"
    for left in (f"/etc/apt/sources.list.d/{marker}.list", f"/usr/{marker}", f"/opt/{marker}", f"/etc/{marker}"):
        assert not os.path.exists(left)


# --- fabricmanager.sh: Fabric Manager at the driver's version (issue 14, item 6) ------------------------------------

# A Debian host: packages, holds and unit states live in $STATE.
APT_FAKES = {
    "apt-get": 'if [ "$1" = install ]; then for a in "$@"; do case "$a" in *=*)\n'
               '  echo "${a#*=}" >"$STATE/pkg.${a%%=*}"; echo "${a#*=}" >"$STATE/fm-version" ;; esac; done; fi',
    "dpkg-query": 'cat "$STATE/pkg.${!#}" 2>/dev/null | tr -d "\\n"',
    "dpkg": 'case "$1" in -s) test -f "$STATE/pkg.$2" ;; -i) echo 1.1-1 >"$STATE/pkg.cuda-keyring" ;; esac',
    "apt-mark": 'case "$1" in hold) shift; printf "%s\\n" "$@" >>"$STATE/held" ;;'
                ' showhold) cat "$STATE/held" 2>/dev/null ;; esac; true',
    "systemctl": 'case "$1" in enable) touch "$STATE/enabled.$2" ;; is-enabled) test -f "$STATE/enabled.${!#}" ;;'
                 ' is-active) test -f "$STATE/active.${!#}" ;; *) exit 1 ;; esac',
    "curl": 'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then echo fake >"$2"; shift; fi; shift; done',
    # Fabric Manager's binary reports the version of the package that put it there (revision stripped).
    "nv-fabricmanager": 'test -f "$STATE/fm-version" || exit 127\n'
                        'echo "Fabric Manager version is : $(sed "s/-[^-]*$//" "$STATE/fm-version")"',
    "modinfo": 'test -n "$DRIVER" && echo "$DRIVER"',
}


@pytest.mark.parametrize(("base", "driver", "package"), [
    ("ubuntu", VERSIONS.nvidia_driver, f"nvidia-fabricmanager-570={VERSIONS.nvidia_fabricmanager}"),
    ("dlami", "535.183.01", "nvidia-fabricmanager-535=535.183.01-1"),     # the base's own driver decides
    ("dlami", "580.95.05", "nvidia-fabricmanager=580.95.05-1"),            # R580 on: one package name
])  # fmt: skip
def test_fabric_manager_is_installed_at_the_drivers_version_held_and_enabled(tmp_path, base, driver, package) -> None:
    host = Host(tmp_path, APT_FAKES)
    env = {**component_env("fabricmanager", base=base), "DRIVER": driver}
    build = host.run("fabricmanager.sh", "build", env)
    assert build.returncode == 0, build.stderr
    calls = host.called()
    install = next(c for c in calls if c.startswith("apt-get install"))
    assert install.endswith(f" {package}")
    name = package.split("=")[0]
    assert f"apt-mark hold {name}" in calls and "systemctl enable nvidia-fabricmanager" in calls
    assert calls.index(install) < calls.index(f"apt-mark hold {name}")
    validate = host.run("fabricmanager.sh", "validate", env)
    assert validate.returncode == 0, validate.stderr
    # A second build finds everything in place and installs nothing.
    host.calls.write_text("")
    assert host.run("fabricmanager.sh", "build", env).returncode == 0
    assert not [c for c in host.called() if c.startswith("apt-get")]


def test_fabric_manager_of_another_version_than_the_driver_fails_validation(tmp_path) -> None:
    host = Host(tmp_path, APT_FAKES)
    env = {**component_env("fabricmanager", base="dlami"), "DRIVER": "535.183.01"}
    assert host.run("fabricmanager.sh", "build", env).returncode == 0
    # The driver moved on (a kernel update rebuilt a newer DKMS module) while Fabric Manager stayed.
    result = host.run("fabricmanager.sh", "validate", {**env, "DRIVER": "535.216.01"})
    assert result.returncode == 1
    assert "Fabric Manager is 535.183.01, the driver is 535.216.01: they must match" in result.stderr


def test_fabric_manager_refuses_a_driver_the_recipe_did_not_install(tmp_path) -> None:
    host = Host(tmp_path, APT_FAKES)
    result = host.run("fabricmanager.sh", "build", {**component_env("fabricmanager"), "DRIVER": "550.90.07"})
    assert result.returncode == 1
    assert f"the nvidia module is 550.90.07, the recipe installed {VERSIONS.nvidia_driver}" in result.stderr
    assert not [c for c in host.called() if c.startswith("apt-get install")]


# --- image-test.sh: the test phase catches a host whose NVSwitches have no Fabric Manager (item 6) ------------------

P4D_DRIVER = VERSIONS.nvidia_driver


def image_test_host(tmp_path: Path) -> tuple[Host, dict[str, str]]:
    """An 8-GPU host whose answers come from environment variables the test sets."""
    host = Host(tmp_path, {
        "nvidia-smi": (
            'case "$*" in\n'
            '  *--query-gpu=name*) for i in 1 2 3 4 5 6 7 8; do echo "$GPU"; done ;;\n'
            '  *--query-gpu=driver_version*) for i in 1 2 3 4 5 6 7 8; do echo "$DRIVER"; done ;;\n'
            '  -q) for i in 1 2 3 4 5 6 7 8; do printf "GPU 0000:%02d:00.0\\n    Persistence Mode : Enabled\\n" $i\n'
            '        printf "    Fabric\\n        State : %s\\n        Status : %s\\n" "$FABRIC_STATE" N/A; done ;;\n'
            '  *) exit 1 ;;\n'
            'esac'),
        "lspci": ('[ "$1" = -d ] && [ "$2" = "$NVSWITCH_ID" ] || exit 0\n'
                  'for i in $(seq 1 "$NVSWITCHES"); do\n'
                  '  echo "0$i:00.0 Bridge: NVIDIA Corporation Device ${2#*:}"; done'),
        "systemctl": '[ "$1 $2 $3" = "is-active --quiet nvidia-fabricmanager" ] && [ "$FM_ACTIVE" = yes ]',
        "nv-fabricmanager": 'echo "Fabric Manager version is : $FM_VERSION"',
        "horovodrun": 'echo "Available Tensor Operations:"; echo "    [X] NCCL"',
        "fi_info": "echo 'provider: efa'",
        "sleep": "true",
    })
    nccl_tests = tmp_path / "nccl-tests"
    (nccl_tests / "build").mkdir(parents=True)
    perf = nccl_tests / "build" / "all_reduce_perf"
    perf.write_text('#!/usr/bin/env bash\necho "all_reduce_perf $*" >>"$CALLS"\n'
                    'echo "# Out of bounds values : 0 OK"\necho "# Avg bus bandwidth    : 200.1"\n')
    perf.chmod(0o755)
    # The venv's python: `-m launcher.doctor.torchprobe --need ...` answers as TORCH_CHECK says (gpuarch's verdict is
    # tested in tests/test_doctor_gpuarch.py).
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.write_text('#!/usr/bin/env bash\necho "python $*" >>"$CALLS"\n[ "$TORCH_CHECK" = ok ] && exit 0\n'
                           'echo "torch cuda arch: fail: $TORCH_CHECK" >&2; exit 1\n')
    venv_python.chmod(0o755)
    env = {**component_env("image-test"), "SCALETRAIN_BIN_PATH": str(host.bin),
           "SCALETRAIN_VENV": str(venv_python.parents[1]), "TORCH_CHECK": "ok",
           "SCALETRAIN_NCCL_TESTS_ROOT": str(nccl_tests), "GPU": "NVIDIA A100-SXM4-40GB", "DRIVER": P4D_DRIVER,
           "FM_VERSION": P4D_DRIVER, "FM_ACTIVE": "yes", "NVSWITCH_ID": "10de:1af1", "NVSWITCHES": "6",
           "FABRIC_STATE": "N/A"}
    return host, env


@pytest.mark.parametrize(("case", "error"), [
    ({"FM_ACTIVE": "no"}, "6 NVSwitch(es) but nvidia-fabricmanager is not running: CUDA cannot initialise"),
    ({"FM_VERSION": "570.133.20"},
     f"Fabric Manager 570.133.20 with driver {P4D_DRIVER}: they must be the same version"),
    ({"NVSWITCH_ID": "10de:22a3", "NVSWITCHES": "4", "GPU": "NVIDIA H100 80GB HBM3", "FABRIC_STATE": "In Progress"},
     "GPUs have not joined the NVSwitch fabric"),
    ({"NVSWITCH_ID": "10de:22a3", "NVSWITCHES": "4", "FM_ACTIVE": "no"}, "4 NVSwitch(es) but nvidia-fabricmanager"),
])  # fmt: skip
def test_image_test_fails_on_an_nvswitch_host_without_a_matching_fabric_manager(tmp_path, case, error) -> None:
    host, env = image_test_host(tmp_path)
    result = host.run("image-test.sh", None, {**env, **case})
    assert result.returncode == 1, result.stdout
    assert error in result.stderr
    assert not [c for c in host.called() if c.startswith("all_reduce_perf")]


@pytest.mark.parametrize("case", [
    {},                                                                     # p4d: 6 NVSwitches, Fabric Manager up
    {"NVSWITCH_ID": "10de:22a3", "NVSWITCHES": "4", "FABRIC_STATE": "Completed"},   # p5
    {"NVSWITCHES": "0", "FM_ACTIVE": "no"},                                 # g5: no NVSwitch, nothing to manage
])  # fmt: skip
def test_image_test_passes_where_the_fabric_is_up_or_absent(tmp_path, case) -> None:
    host, env = image_test_host(tmp_path)
    result = host.run("image-test.sh", None, {**env, **case})
    assert result.returncode == 0, result.stderr
    assert "all_reduce_perf -b 8 -e 64M -f 2 -g 8" in host.called()
    expected = "Fabric Manager check skipped" if case.get("NVSWITCHES") == "0" else "Fabric Manager 570.172.08 running"
    assert expected in result.stdout


@pytest.mark.parametrize(("modules", "needs"), [("open", "--need 8.0 --need 8.6 --need 9.0"),
                                                ("proprietary", "--need 7.0")])
def test_image_test_asks_torch_for_the_gpus_its_build_is_for_and_stops_when_it_has_no_kernels(tmp_path, modules,
                                                                                            needs) -> None:
    """Issue 37 item 1: the build instance is a g5, the image's nodes P types; the V100 build's torch had no sm_70."""
    host, env = image_test_host(tmp_path)
    env |= {"SCALETRAIN_GPU_CAPABILITIES": component_env("image-test", kernel_module_type=modules)[
        "SCALETRAIN_GPU_CAPABILITIES"], "NVSWITCHES": "0", "FM_ACTIVE": "no"}
    result = host.run("image-test.sh", None, env)
    assert result.returncode == 0, result.stderr
    assert f"python -I -m launcher.doctor.torchprobe {needs} --what the GPUs this image is for" in host.called()
    bad = "torch 2.7.1+cu128 has no kernels for compute capability 7.0"
    result = host.run("image-test.sh", None, {**env, "TORCH_CHECK": bad})
    assert result.returncode == 1
    assert bad in result.stderr and "the image's PyTorch cannot run on the GPUs it is built for" in result.stderr
    assert not [c for c in host.called() if c.startswith("all_reduce_perf")][1:]  # only the first run's


# --- aws-cli.sh: AWS CLI v2 from AWS's signed installer (item 7) ----------------------------------------------------

AWS_CLI_TEAM_KEY = "FB5DB77FD5C118B80511ADA8A6310ACC4672475C"  # the AWS CLI User Guide's fingerprint


def gpg(home: Path, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """gpg on its own home; the agent a key generation starts is stopped again (a test leaves no daemon behind)."""
    home.mkdir(mode=0o700, exist_ok=True)
    try:
        return subprocess.run(["gpg", "--homedir", str(home), "--batch", *args], input=stdin, capture_output=True,
                              text=True, timeout=120)
    finally:
        subprocess.run(["gpgconf", "--homedir", str(home), "--kill", "all"], capture_output=True, timeout=30)


def embedded_key() -> str:
    text = (COMPONENTS / "aws-cli.sh").read_text()
    return text[text.index("-----BEGIN PGP PUBLIC KEY BLOCK-----"):text.index("-----END PGP PUBLIC KEY BLOCK-----")
                + len("-----END PGP PUBLIC KEY BLOCK-----")] + "\n"


@pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg is not installed")
def test_the_embedded_key_is_the_aws_cli_teams(tmp_path) -> None:
    shown = gpg(tmp_path / "gnupg", "--with-colons", "--show-keys", stdin=embedded_key())
    assert shown.returncode == 0, shown.stderr
    fingerprints = [line.split(":")[9] for line in shown.stdout.splitlines() if line.startswith("fpr:")]
    assert fingerprints == [AWS_CLI_TEAM_KEY]
    assert "AWS CLI Team <aws-cli@amazon.com>" in shown.stdout
    assert f"KEY_FINGERPRINT={AWS_CLI_TEAM_KEY}" in (COMPONENTS / "aws-cli.sh").read_text()


def aws_cli_host(tmp_path: Path) -> tuple[Host, dict[str, str]]:
    """curl serves an installer zip (whose aws/install would drop a marker) and the signature in $SIGNATURE."""
    payload = tmp_path / "payload"
    payload.mkdir()
    with zipfile.ZipFile(payload / "awscli.zip", "w") as z:
        info = zipfile.ZipInfo("aws/install")
        info.external_attr = 0o755 << 16
        z.writestr(info, '#!/usr/bin/env bash\necho "aws/install $*" >>"$CALLS"\ntouch "$STATE/installed"\n')
    host = Host(tmp_path, {"curl": (
        'out=; url=; while [ $# -gt 0 ]; do case "$1" in -o) out=$2; shift ;; -*) ;; *) url=$1 ;; esac; shift; done\n'
        f'case "$url" in *.sig) cp "$SIGNATURE" "$out" ;; *) cp {payload}/awscli.zip "$out" ;; esac')})
    env = {**component_env("aws-cli"), "SCALETRAIN_AWS_CLI": str(tmp_path / "usr-local-bin" / "aws")}
    return host, env


@pytest.mark.skipif(shutil.which("gpg") is None, reason="gpg is not installed")
def test_an_installer_not_signed_by_aws_is_refused(tmp_path) -> None:
    host, env = aws_cli_host(tmp_path)
    other = tmp_path / "other-gnupg"
    assert gpg(other, "--passphrase", "", "--quick-gen-key", "Mallory <m@example.com>", "rsa2048", "sign",
               "1d").returncode == 0
    signed = gpg(other, "--detach-sign", "-o", str(tmp_path / "bad.sig"), str(tmp_path / "payload" / "awscli.zip"))
    assert signed.returncode == 0, signed.stderr
    result = host.run("aws-cli.sh", "build", {**env, "SIGNATURE": str(tmp_path / "bad.sig")})
    assert result.returncode == 1
    assert (f"https://awscli.amazonaws.com/awscli-exe-linux-x86_64-{VERSIONS.aws_cli}.zip is not signed by the AWS "
            f"CLI Team key {AWS_CLI_TEAM_KEY}") in result.stderr
    assert not (host.state / "installed").exists()
    urls = [c for c in host.called() if c.startswith("curl")]
    assert [u.rsplit(" ", 1)[-1] for u in urls] == [
        f"https://awscli.amazonaws.com/awscli-exe-linux-x86_64-{VERSIONS.aws_cli}.zip",
        f"https://awscli.amazonaws.com/awscli-exe-linux-x86_64-{VERSIONS.aws_cli}.zip.sig"]


@pytest.mark.parametrize(("version_line", "ok"), [
    (f"aws-cli/{VERSIONS.aws_cli} Python/3.13.7 Linux/6.8.0-1029-aws exe/x86_64.ubuntu.22", True),
    ("aws-cli/1.36.40 Python/3.10.12 Linux/6.8.0-1029-aws botocore/1.35.99", False),   # v1 from pip or apt
])  # fmt: skip
def test_the_aws_cli_is_checked_by_its_version(tmp_path, version_line, ok) -> None:
    host, env = aws_cli_host(tmp_path)
    aws = Path(env["SCALETRAIN_AWS_CLI"])
    aws.parent.mkdir()
    aws.write_text(f"#!/usr/bin/env bash\necho '{version_line}'\n")
    aws.chmod(0o755)
    result = host.run("aws-cli.sh", "validate", env)
    assert (result.returncode == 0) is ok, result.stderr
    if not ok:
        assert f"expected aws-cli/{VERSIONS.aws_cli}" in result.stderr


# --- aws-ofi-nccl.sh: hwloc headers before configure (item 10) ------------------------------------------------------

CONFIGURE = """#!/usr/bin/env bash
# Stands for aws-ofi-nccl's configure: m4/check_pkg_hwloc.m4 needs hwloc.h and libhwloc.
echo "configure $*" >>"$CALLS"
test -f "$SYSROOT/usr/include/hwloc.h" || { echo "configure: error: hwloc not found" >&2; exit 1; }
for a in "$@"; do case "$a" in --prefix=*) echo "${a#--prefix=}" >prefix ;; esac; done
"""
# make install puts the plugin's libraries, which carry "Initializing aws-ofi-nccl VERSION" as the real ones do.
MAKE = ('if [ "${1:-}" = install ]; then p=$(cat prefix); mkdir -p "$p/lib";'
        ' for l in libnccl-net.so libnccl-net-ofi.so; do'
        ' printf "\\177ELF\\0Initializing aws-ofi-nccl %s\\0" "$AWS_OFI_NCCL_VERSION" >"$p/lib/$l"; done; fi')


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
    # /etc/ld.so.conf.d is the one system path the script writes: the sandbox gives it a scratch one.
    ldconf = tmp_path / "ld.so.conf.d"
    result = host.run("aws-ofi-nccl.sh", "build", env, scratch=("/etc/ld.so.conf.d",))
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


# --- The kernel's compiler: read from the kernel, used for every module built against it (issue 25, item 2) --------

BANNERS = Path(__file__).parent / "data" / "kernel-banners"
KERNEL_68 = BANNERS / "ubuntu2204-6.8.0-1063-aws.txt"
KERNEL_515 = BANNERS / "ubuntu2204-5.15.0-1031-aws.txt"


def base_env(tmp_path: Path, banner: Path) -> dict[str, str]:
    return {**component_env("base"), "SCALETRAIN_IMAGE_ENV_FILE": str(tmp_path / "etc" / "image.env"),
            "SCALETRAIN_KERNEL_CC_FILE": str(tmp_path / "etc" / "kernel-cc"),
            "SCALETRAIN_KERNEL_VERSION_FILE": str(banner)}


@pytest.mark.parametrize(("banner", "compiler"), [
    ("ubuntu2204-6.8.0-1063-aws.txt", "gcc-12"),     # Ubuntu 22.04's current AWS kernel
    ("ubuntu2204-5.15.0-1031-aws.txt", "gcc-11"),    # its GA kernel: build-essential's compiler
    ("ubuntu2204-6.5.0-1014-aws.txt", "gcc-11"),     # the x86_64-linux-gnu-gcc-N name, version 11
    ("ubuntu1804-4.15.0-1065-aws.txt", "gcc-7"),     # the old "gcc version X.Y.Z" form
])  # fmt: skip
def test_the_kernels_compiler_is_read_from_its_version_banner(tmp_path, banner, compiler) -> None:
    host = Host(tmp_path, {})
    result = host.run("base.sh", "kernel-cc", base_env(tmp_path, BANNERS / banner))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{compiler}\n"


def test_a_kernel_not_built_with_gcc_is_refused_by_name(tmp_path) -> None:
    banner = tmp_path / "clang-banner"  # NOT recorded: the shape of a clang-built kernel's banner
    banner.write_text("Linux version 6.8.0-1 (builder@host) (Ubuntu clang version 18.1.3 (1ubuntu1), Ubuntu LLD 18.1.3)"
                      " #1 SMP\n")
    result = Host(tmp_path, {}).run("base.sh", "kernel-cc", base_env(tmp_path, banner))
    assert result.returncode == 1
    assert result.stderr.startswith("error: the kernel was not built with gcc: Linux version 6.8.0-1")


# apt-get install marks each package installed; dpkg -s answers for all the packages it is asked about.
PACKAGE_FAKES = {
    "apt-get": 'if [ "$1" = install ]; then for a in "$@"; do case "$a" in -*|install) ;; *) touch "$STATE/pkg.$a" ;;'
               ' esac; done; fi; true',
    "dpkg": 'if [ "$1" = -s ]; then shift; for p in "$@"; do test -f "$STATE/pkg.$p" || exit 1; done; fi',
    "apt-mark": "true",
}


@pytest.mark.parametrize(("banner", "compiler", "other"), [(KERNEL_68, "gcc-12", "gcc-11"),
                                                           (KERNEL_515, "gcc-11", "gcc-12")])
def test_base_installs_the_compiler_the_kernel_was_built_with_and_records_it(tmp_path, banner, compiler,
                                                                            other) -> None:
    """build-essential brings gcc-11; Ubuntu 22.04's 6.8 AWS kernels are built with gcc-12, and every module built
    against them (NVIDIA, EFA, BeeGFS) needs gcc-12 (AWS ParallelCluster's cookbook PR 2852 hit the same failure)."""
    host = Host(tmp_path, PACKAGE_FAKES)
    env = base_env(tmp_path, banner)
    result = host.run("base.sh", "build", env)
    assert result.returncode == 0, result.stderr
    install = next(c for c in host.called() if c.startswith("apt-get install"))
    assert f" {compiler} " in install and other not in install
    assert Path(env["SCALETRAIN_KERNEL_CC_FILE"]).read_text() == f"{compiler}\n"
    assert host.run("base.sh", "validate", env).returncode == 0
    # The same image booted on a kernel another compiler built no longer matches its record.
    moved = host.run("base.sh", "validate", {**env, "SCALETRAIN_KERNEL_VERSION_FILE": str(
        KERNEL_515 if banner == KERNEL_68 else KERNEL_68)})
    assert moved.returncode == 1


NVIDIA_RUNFILE = """#!/usr/bin/env bash
# Stands for NVIDIA's .run installer: it builds the module with $CC (default cc, which is build-essential's gcc-11)
# and refuses a compiler that is not the kernel's.
echo "driver.run CC=${CC:-cc} $*" >>"$CALLS"
if [ "${CC:-cc}" != "$KERNEL_CC" ]; then
    echo "Compiler version check failed: the kernel was built with $KERNEL_CC, not ${CC:-cc}" >&2
    echo "It is recommended to set the CC environment variable to the compiler that was used to compile the kernel." >&2
    exit 1
fi
echo "$NVIDIA_DRIVER_VERSION" >"$STATE/nvidia-module"
"""


def test_the_nvidia_driver_is_built_with_the_kernels_compiler(tmp_path) -> None:
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text(f"#!/usr/bin/env bash\necho 'Cuda compilation tools, release "
                                       f"{VERSIONS.cuda.rsplit('.', 1)[0]}, V{VERSIONS.cuda}'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    host = Host(tmp_path, {**PACKAGE_FAKES, "curl": 'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then echo fake >"$2";'
                                                    ' shift; fi; shift; done',
                           "modinfo": 'cat "$STATE/nvidia-module" 2>/dev/null || exit 1', "ldconfig": "true"})
    host.fake("sh", NVIDIA_RUNFILE.split("\n", 1)[1])
    kernel_cc = tmp_path / "kernel-cc"
    kernel_cc.write_text("gcc-12\n")  # what base.sh recorded on a 6.8 kernel
    env = {**component_env("nvidia"), "SCALETRAIN_CUDA_HOME": str(cuda), "SCALETRAIN_KERNEL_CC_FILE": str(kernel_cc),
           "KERNEL_CC": "gcc-12"}
    result = host.run("nvidia.sh", "build", env, scratch=("/etc/ld.so.conf.d",))
    assert result.returncode == 0, result.stderr
    (run,) = [c for c in host.called() if c.startswith("driver.run")]
    assert run.startswith("driver.run CC=gcc-12 ") and run.endswith(
        "/driver.run --silent --dkms --no-questions --kernel-module-type=open")


@pytest.mark.parametrize("script", ["efa.sh", "beegfs.sh"])
def test_module_builds_name_the_missing_kernel_compiler_before_building(tmp_path, script) -> None:
    """The EFA and BeeGFS modules build through the kernel's own build files, which call the kernel's compiler: a
    build that lacks it says so before it adds a package repository or downloads anything. Run sandboxed: an
    earlier order wrote /etc/apt/sources.list.d/beegfs.list on the machine running the tests."""
    kernel_cc = tmp_path / "kernel-cc"
    kernel_cc.write_text("gcc-12\n")
    key = script.removesuffix(".sh")
    host = Host(tmp_path, {"curl": "exit 0", "gpg": "exit 0", "apt-get": "exit 0", "systemctl": "exit 0",
                           "dpkg-query": "exit 1", "tar": "exit 0"})
    env = {**component_env(key), "SCALETRAIN_KERNEL_CC_FILE": str(kernel_cc)}
    result = host.run(script, "build", env, scratch=("/etc/ld.so.conf.d", "/etc/apt/sources.list.d"))
    assert result.returncode == 1
    assert "(gcc-12) is not installed; the base component installs it" in result.stderr
    assert list((tmp_path / "sources.list.d").iterdir()) == []  # no repository added before the check
    assert not [c for c in host.called() if c.split()[0] in ("curl", "apt-get", "tar")]  # nothing fetched either


# --- aws-ofi-nccl.sh: exactly one plugin on the image, the pinned one (issue 25, item 8) ----------------------------

OFI_DPKG = """case "$1" in
  -S) if grep -qxF "$2" "$STATE/owned.libnccl-ofi" 2>/dev/null; then echo "libnccl-ofi: $2"
      else echo "dpkg-query: no path found matching pattern $2" >&2; exit 1; fi ;;
  --purge) shift; for p in "$@"; do while read -r f; do rm -f "$f"; done <"$STATE/owned.$p"; rm -f "$STATE/owned.$p"
           done ;;
esac"""
# The loader's cache: the loose plugin of a base image, where it still exists.
OFI_LDCONFIG = 'if [ "${1:-}" = -p ]; then for f in $LOOSE; do [ -f "$f" ] && printf "\\tlibnccl-net.so (libc6,x86-64) => %s\\n" "$f"; done; fi; true'  # noqa: E501


def test_the_image_keeps_only_the_pinned_aws_ofi_nccl(tmp_path) -> None:
    """EFA installer 1.38 ships a plugin (its libnccl-ofi package, below /opt/amazon/ofi-nccl); a base image may carry
    a loose one in the loader's cache. NCCL would load whichever the search path finds first: only the build's own,
    at the pinned version, may remain."""
    version = VERSIONS.aws_ofi_nccl
    source = tmp_path / "src" / f"aws-ofi-nccl-{version}"
    source.mkdir(parents=True)
    (source / "configure").write_text(CONFIGURE.replace('test -f "$SYSROOT/usr/include/hwloc.h" || ', "true || "))
    (source / "configure").chmod(0o755)
    with tarfile.open(tmp_path / "release.tar.gz", "w:gz") as tar:
        tar.add(source, arcname=source.name)
    prefix = tmp_path / "opt" / "amazon" / "ofi-nccl"
    packaged = prefix / "lib" / "x86_64-linux-gnu" / "libnccl-net-ofi.so"   # the EFA installer's package
    loose = tmp_path / "opt" / "aws-ofi-nccl" / "lib" / "libnccl-net.so"      # a base image's own build
    for plugin, other in ((packaged, "1.13.2"), (loose, "1.7.3-aws")):
        plugin.parent.mkdir(parents=True)
        plugin.write_bytes(f"\x7fELF\x00Initializing aws-ofi-nccl {other}\x00".encode())
    host = Host(tmp_path, {"curl": f"cat {tmp_path / 'release.tar.gz'}", "apt-get": "true", "make": MAKE,
                           "ldconfig": OFI_LDCONFIG, "dpkg": OFI_DPKG})
    (host.state / "owned.libnccl-ofi").write_text(f"{packaged}\n")
    env = {**component_env("aws-ofi-nccl"), "SCALETRAIN_OFI_NCCL_PREFIX": str(prefix), "LOOSE": str(loose),
           "SCALETRAIN_LIB_PATH": f"{prefix}/lib:{tmp_path}/opt/amazon/efa/lib"}
    ldconf = ("/etc/ld.so.conf.d",)
    result = host.run("aws-ofi-nccl.sh", "build", env, scratch=ldconf)
    assert result.returncode == 0, result.stderr
    calls = host.called()
    purge = calls.index("dpkg --purge libnccl-ofi")
    assert purge < next(i for i, c in enumerate(calls) if c.startswith("configure "))
    assert not packaged.exists() and not loose.exists()
    left = sorted(p.relative_to(prefix).as_posix() for p in prefix.rglob("libnccl-net*.so*"))
    assert left == ["lib/libnccl-net-ofi.so", "lib/libnccl-net.so"]
    assert all(f"Initializing aws-ofi-nccl {version}".encode() in (prefix / p).read_bytes() for p in left)
    assert host.run("aws-ofi-nccl.sh", "validate", env, scratch=ldconf).returncode == 0
    # A copy that comes back (a package reinstalled, a file copied in) fails the image's validation by name.
    loose.write_bytes(b"\x7fELF\x00Initializing aws-ofi-nccl 1.7.3-aws\x00")
    again = host.run("aws-ofi-nccl.sh", "validate", env, scratch=ldconf)
    assert again.returncode == 1
    assert f"other aws-ofi-nccl plugins NCCL could load instead of {prefix}/lib's: {loose}" in again.stderr


# --- slurm.sh: Slurm with its cgroup/v2 plugin, and no daemon enabled in the image ----------------------------------

def slurm_host(tmp_path: Path, *, drop: str = "") -> tuple[Host, dict[str, str]]:
    """A host for slurm.sh: apt-get "installs" into SCALETRAIN_SLURM_ROOT what the packages would (Debian's Slurm
    with its plugins; munge and its key), curl serves a SchedMD tarball whose configure finds dbus only where
    libdbus-1-dev and pkg-config were installed, and whose make install builds cgroup/v2 only then (src/plugins/
    cgroup/Makefile.am). ``drop``: a package apt-get leaves out."""
    root = tmp_path / "root"
    tag = f"slurm-{VERSIONS.slurm.replace('.', '-')}-1"
    source = tmp_path / "src" / f"slurm-{tag}"
    source.mkdir(parents=True)
    (source / "configure").write_text(
        '#!/usr/bin/env bash\necho "configure $*" >>"$CALLS"\n'
        'if [ -f "$STATE/pkg.libdbus-1-dev" ] && [ -f "$STATE/pkg.pkg-config" ]; then touch "$STATE/with-dbus"; fi\n')
    (source / "configure").chmod(0o755)
    with tarfile.open(tmp_path / "slurm.tar.gz", "w:gz") as tar:
        tar.add(source, arcname=source.name)
    daemons = tmp_path / "daemons"  # what -V prints: SchedMD's build, Debian's package
    daemons.mkdir()
    for name, banner in (("source", f"slurm {VERSIONS.slurm}"), ("debian", "slurm-wlm 22.05.8")):
        (daemons / name).write_text(f"#!/usr/bin/env bash\necho '{banner}'\n")
        (daemons / name).chmod(0o755)
    host = Host(tmp_path, {
        "apt-get": (
            'if [ "$1" = install ]; then for p in "$@"; do [ "$p" = "$DROP" ] && continue; touch "$STATE/pkg.$p"\n'
            ' case "$p" in\n'
            '  munge) mkdir -p "$R/usr/sbin" "$R/etc/munge"; cp "$DAEMONS/debian" "$R/usr/sbin/munged";'
            ' touch "$R/etc/munge/munge.key" ;;\n'
            '  slurmd|slurmctld) mkdir -p "$R/usr/sbin" "$R/usr/lib/x86_64-linux-gnu/slurm-wlm";'
            ' cp "$DAEMONS/debian" "$R/usr/sbin/$p"; touch "$R/usr/lib/x86_64-linux-gnu/slurm-wlm/cgroup_v2.so" ;;\n'
            ' esac; done; fi; true'),
        "curl": f'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then cp {tmp_path / "slurm.tar.gz"} "$2"; shift; fi;'
                ' shift; done',
        "make": ('if [ "${1:-}" = install ]; then mkdir -p "$R/usr/sbin" "$R/usr/lib/slurm";'
                 ' for d in slurmd slurmctld; do cp "$DAEMONS/source" "$R/usr/sbin/$d"; done;'
                 ' if [ -f "$STATE/with-dbus" ]; then touch "$R/usr/lib/slurm/cgroup_v2.so"; fi; fi; true'),
        "systemctl": "true", "id": "true", "useradd": "true", "ldconfig": "true",
        **{tool: "true" for tool in ("sbatch", "squeue", "scontrol", "scancel", "srun")}})
    env = {**component_env("slurm"), "SCALETRAIN_SLURM_ROOT": str(root), "R": str(root), "DROP": drop,
           "DAEMONS": str(daemons)}
    return host, env


def test_slurm_is_built_with_dbus_and_pkg_config_for_its_cgroup_v2_plugin(tmp_path) -> None:
    host, env = slurm_host(tmp_path)
    result = host.run("slurm.sh", "build", env)
    assert result.returncode == 0, result.stderr
    calls = host.called()
    deps = next(i for i, c in enumerate(calls) if c.startswith("apt-get install") and "libmunge-dev" in c)
    assert {"libdbus-1-dev", "pkg-config", "linux-libc-dev"} <= set(calls[deps].split())
    assert deps < next(i for i, c in enumerate(calls) if c.startswith("configure "))
    assert (tmp_path / "root" / "usr/lib/slurm/cgroup_v2.so").exists()
    assert host.run("slurm.sh", "validate", env).returncode == 0


def test_a_slurm_without_the_cgroup_v2_plugin_fails_the_image_by_name(tmp_path) -> None:
    """Without dbus the build has no cgroup/v2, and slurmd exits 1 on Ubuntu 22.04's cgroup v2 at its first start."""
    host, env = slurm_host(tmp_path, drop="libdbus-1-dev")
    result = host.run("slurm.sh", "build", env)
    assert result.returncode == 1
    assert "no cgroup/v2 plugin" in result.stderr


@pytest.mark.parametrize("rehearsal", [False, True])
def test_the_image_enables_no_slurm_or_munge_daemon_and_carries_no_key(tmp_path, rehearsal) -> None:
    """The packages enable their units; a node's boot enables what its role runs once its key and options are
    written (launcher/plans/slurm.py). Debian's package path (rehearsal) has its plugin under slurm-wlm. The Image
    Builder instance runs systemd (munged was started by its package): stopped there; the rehearsal root is built
    in a chroot, where only the links are removed."""
    host, env = slurm_host(tmp_path)
    if rehearsal:
        env["SCALETRAIN_REHEARSAL"] = "1"
    else:
        (tmp_path / "root" / "run/systemd/system").mkdir(parents=True)
    result = host.run("slurm.sh", "build", env)
    assert result.returncode == 0, result.stderr
    calls = host.called()
    installed = next(i for i, c in enumerate(calls) if c.startswith("apt-get install"))
    for unit in ("munge.service", "slurmd.service", "slurmctld.service"):
        assert calls.index(f"systemctl disable {unit}") > installed
        assert (f"systemctl stop {unit}" in calls) != rehearsal
    assert not [c for c in calls if c.startswith(("systemctl enable", "systemctl start"))]
    assert not (tmp_path / "root" / "etc/munge/munge.key").exists()
    plugin = "usr/lib/x86_64-linux-gnu/slurm-wlm" if rehearsal else "usr/lib/slurm"
    assert (tmp_path / "root" / plugin / "cgroup_v2.so").exists()


# --- pytorch.sh: the index's CUDA build, by its local version label (issue 37 item 1) -------------------------------

@pytest.mark.parametrize(("have", "rehearsal", "ok"), [
    ("2.7.1+cu126 True", "0", True),
    ("2.7.1+cu128 True", "0", False),     # another index's build: 2.7's cu128 has no sm_70, so no V100 runs it
    ("2.7.1 True", "0", False),           # PyPI's, whatever CUDA it was built for
    ("2.7.1+cu126 False", "0", False),
    ("2.13.0+cpu False", "1", True), ("2.13.0 False", "1", True), ("2.13.0+cu126 True", "1", False),
])  # fmt: skip
def test_pytorch_validate_wants_the_pinned_indexs_cuda_build(tmp_path, have, rehearsal, ok) -> None:
    host = Host(tmp_path, {})
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/usr/bin/env bash\necho "{have}"\n')
    (venv / "bin" / "python").chmod(0o755)
    version = "2.13.0" if rehearsal == "1" else VERSIONS.torch
    env = {**component_env("pytorch"), "SCALETRAIN_VENV": str(venv), "TORCH_VERSION": version,
           "SCALETRAIN_REHEARSAL": rehearsal}
    assert env["TORCH_INDEX"].endswith("/cu126")
    result = host.run("pytorch.sh", "validate", env)
    assert (result.returncode == 0) is ok, result.stderr
    if not ok:
        assert f"torch in {venv} is '{have}', expected" in result.stderr
