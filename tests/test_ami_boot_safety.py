"""The image build against the stock AMI's own first-boot apt work, and GPUs kept initialised (issue 47, items 2, 5).

Item 2: a stock Ubuntu AMI runs cloud-init, apt-daily and unattended-upgrades soon after its first boot; they hold the
dpkg lock ("Could not get lock /var/lib/dpkg/lock-frontend") and can install a newer linux-aws kernel before base.sh
holds the running one. base.sh waits for cloud-init, then stops and masks the apt timers and services, before its first
apt-get, and every apt-get of ami/ waits for the dpkg lock (-o DPkg::Lock::Timeout=600).
Item 5: nvidia.sh installs the driver from NVIDIA's runfile, which ships nvidia-persistenced's unit only as a sample:
without the daemon every CUDA process and every nvidia-smi initialises all GPUs again. nvidia.sh installs and enables
it after the driver, and image-test.sh fails an instance whose GPUs are not in persistence mode.

The scripts run for real against fakes that record their calls (tests/test_ami_scripts.py's approach), sandboxed as
every image script the tests run (tests/imagesandbox.py). SCALETRAIN_AMI_DIR points the module at another copy of
ami/ (how it was shown to fail on the scripts before the fix)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ami/ is a CDK app beside the package
    sys.path.insert(0, str(ROOT))

from test_ami_scripts import Host as ScriptHost  # noqa: E402
from test_ami_scripts import component_env  # noqa: E402

from ami import render  # noqa: E402

AMI = Path(os.environ.get("SCALETRAIN_AMI_DIR", ROOT / "ami"))
SCRIPTS = sorted([*(AMI / "components").glob("*.sh"), *(AMI / "rehearsal").glob("*.sh")])
VERSIONS = render.load_versions()
BANNER = ROOT / "tests" / "data" / "kernel-banners" / "ubuntu2204-6.8.0-1063-aws.txt"
LOCK_WAIT = 600  # seconds: what the recipe asks of apt-get, at least
APT_UNITS = ("apt-daily.timer", "apt-daily-upgrade.timer", "unattended-upgrades.service")
TOOLS = ("bash", "sh", "env", "cat", "grep", "awk", "sed", "cut", "head", "tail", "wc", "tr", "sort", "uniq", "mktemp",
         "rm", "mkdir", "install", "ln", "cp", "mv", "chmod", "dirname", "basename", "tee", "diff", "find", "tar",
         "gzip", "bzip2", "seq", "true", "false", "touch", "ls", "uname", "nproc", "cmp", "timeout")


class Host(ScriptHost):
    """tests/test_ami_scripts.py's host (fakes that record their calls, the sandbox), with this module's tools and
    its copy of ami/."""

    tools = TOOLS
    components = AMI / "components"


# --- Every apt-get of ami/ waits for the dpkg lock ------------------------------------------------------------------

def apt_get_calls(text: str) -> list[str]:
    """Each apt-get command of a shell script, as one line (continuations joined), comments left out."""
    joined = re.sub(r"\\\n\s*", " ", text)
    calls = []
    for line in joined.splitlines():
        code = line.strip()
        if not code or code.startswith("#"):
            continue
        calls += [m.group(0) for m in re.finditer(r"(?:^|(?<=[\s;&|(]))apt-get\s[^;&|]*", code)]
    return calls


def lock_wait(call: str) -> int | None:
    m = re.search(r"-o\s*DPkg::Lock::Timeout=(\d+)", call)
    return int(m.group(1)) if m else None


def test_every_apt_get_of_the_recipe_waits_for_the_dpkg_lock() -> None:
    found = {script.name: apt_get_calls(script.read_text()) for script in SCRIPTS}
    # The parser sees every script that runs apt-get at all (a regex that rots finds nothing, and passes nothing).
    assert {n for n, calls in found.items() if calls} >= {
        "base.sh", "nvidia.sh", "fabricmanager.sh", "nccl.sh", "aws-ofi-nccl.sh", "beegfs.sh", "lustre.sh", "slurm.sh",
        "instance.sh", "openmpi.sh"}
    unwaited = [f"{name}: {call}" for name, calls in found.items() for call in calls
                if (lock_wait(call) or 0) < LOCK_WAIT]
    assert not unwaited, "apt-get without -o DPkg::Lock::Timeout=600:\n" + "\n".join(unwaited)


def test_the_efa_installers_own_apt_get_waits_for_the_lock_too(tmp_path) -> None:
    """efa_installer.sh runs apt-get itself: it is handed an APT_CONFIG file (read before apt's own) that waits."""
    work = tmp_path / "src" / "aws-efa-installer"
    work.mkdir(parents=True)
    (work / "efa_installer.sh").write_text('#!/usr/bin/env bash\necho "efa_installer.sh $*" >>"$CALLS"\n'
                                           'cat "${APT_CONFIG:-/dev/null}" >"$STATE/apt-config"\n')
    (work / "efa_installer.sh").chmod(0o755)
    with tarfile.open(tmp_path / "efa.tar.gz", "w:gz") as tar:
        tar.add(work, arcname=work.name)
    kernel_cc = tmp_path / "kernel-cc"
    kernel_cc.write_text("gcc-12\n")
    host = Host(tmp_path, {"curl": f"cat {tmp_path / 'efa.tar.gz'}", "gcc-12": "true", "ldconfig": "true"})
    env = {**component_env("efa"), "SCALETRAIN_KERNEL_CC_FILE": str(kernel_cc)}
    host.run("efa.sh", "build", env, scratch=("/etc/ld.so.conf.d",))  # its verify fails here: no EFA in a sandbox
    assert any(c.startswith("efa_installer.sh -y") for c in host.called())
    config = (host.state / "apt-config").read_text()
    assert re.search(r'DPkg::Lock::Timeout\s+"(\d+)"', config) and int(
        re.search(r'DPkg::Lock::Timeout\s+"(\d+)"', config).group(1)) >= LOCK_WAIT, config


# --- base.sh: cloud-init done, the apt timers and services stopped and masked, before its first apt-get ------------

BASE_FAKES = {
    # cloud-init 23.4 and later: status --wait exits 0 when done, 2 when done with recoverable errors, 1 on a
    # critical failure (cloud-init docs, "Failure states").
    "cloud-init": 'case "$1 ${2:-}" in "status --wait") exit "${CLOUD_INIT_RC:-0}" ;;'
                  ' "status --long") echo "status: error"; exit 1 ;; esac',
    "systemctl": "exit 0",
    # apt-get install marks each package installed; dpkg -s answers for all the packages it is asked about.
    "apt-get": 'if [ "$1" = install ]; then for a in "$@"; do case "$a" in -*|install|*::*) ;;'
               ' *) touch "$STATE/pkg.$a" ;; esac; done; fi; true',
    "dpkg": 'if [ "$1" = -s ]; then shift; for p in "$@"; do test -f "$STATE/pkg.$p" || exit 1; done; fi',
    "apt-mark": "true",
}


def base_run(tmp_path: Path, *, booted: bool = True, **env: str) -> tuple[Host, subprocess.CompletedProcess]:
    host = Host(tmp_path, BASE_FAKES)
    booted_dir = tmp_path / "run-systemd-system"
    if booted:
        booted_dir.mkdir()
    full = {**component_env("base"), "SCALETRAIN_IMAGE_ENV_FILE": str(tmp_path / "etc" / "image.env"),
            "SCALETRAIN_KERNEL_CC_FILE": str(tmp_path / "etc" / "kernel-cc"),
            "SCALETRAIN_KERNEL_VERSION_FILE": str(BANNER), "SCALETRAIN_SD_BOOTED_DIR": str(booted_dir), **env}
    return host, host.run("base.sh", "build", full)


def first(calls: list[str], prefix: str) -> int:
    return next(i for i, c in enumerate(calls) if c.startswith(prefix))


@pytest.mark.parametrize("cloud_init_rc", ["0", "2"])  # 2: done, with recoverable errors (cloud-init >= 23.4)
def test_base_waits_for_cloud_init_and_masks_the_apt_units_before_its_first_apt_get(tmp_path, cloud_init_rc) -> None:
    host, result = base_run(tmp_path, CLOUD_INIT_RC=cloud_init_rc)
    assert result.returncode == 0, result.stderr
    calls = host.called()
    assert "cloud-init status --wait" in calls, calls
    apt = first(calls, "apt-get ")
    assert calls.index("cloud-init status --wait") < apt
    masked = [c for c in calls if c.startswith("systemctl mask ")]
    assert set(APT_UNITS) <= {u for c in masked for u in c.split()[2:]}, masked
    for unit in APT_UNITS:  # a stopped timer's run goes on: stopped first, where systemd runs
        assert calls.index(f"systemctl stop {unit}") < apt
    assert calls.index("cloud-init status --wait") < first(calls, "systemctl ") < apt
    for call in (c for c in calls if c.startswith("apt-get ")):
        assert (lock_wait(call) or 0) >= LOCK_WAIT, call
    # The kernel is held once its headers are in: base.sh's own install is the only apt work before that.
    assert first(calls, "apt-get install") < first(calls, "apt-mark hold")


def test_base_refuses_an_instance_whose_cloud_init_failed(tmp_path) -> None:
    host, result = base_run(tmp_path, CLOUD_INIT_RC="1")
    assert result.returncode == 1
    assert "cloud-init status --wait exited 1" in result.stderr and "status: error" in result.stderr
    assert not [c for c in host.called() if c.startswith(("apt-get", "systemctl"))]


def test_base_in_a_chroot_masks_offline_and_neither_waits_nor_stops(tmp_path) -> None:
    """The rehearsal root's chroot: systemd does not run it (no /run/systemd/system), cloud-init never ran there
    (status --wait would wait for ever), and `systemctl stop` cannot work; `systemctl mask` does."""
    host, result = base_run(tmp_path, booted=False, SCALETRAIN_REHEARSAL="1")
    assert result.returncode == 0, result.stderr
    calls = host.called()
    assert not [c for c in calls if c.startswith(("cloud-init", "systemctl stop"))]
    masked = [c for c in calls if c.startswith("systemctl mask ")]
    assert masked and set(APT_UNITS) <= set(masked[0].split()[2:])
    assert calls.index(masked[0]) < first(calls, "apt-get ")


# --- nvidia.sh: the persistence daemon, after the driver; image-test.sh: persistence mode on every GPU --------------

RUNFILE = """case "$1" in
  */driver.run) ;;
  *) exec /bin/sh "$@" ;;
esac
echo "driver.run CC=${CC:-cc}" >>"$CALLS"
echo "$NVIDIA_DRIVER_VERSION" >"$STATE/nvidia-module"
# What the runfile leaves for the persistence daemon: its sample init scripts (nvidia-persistenced(1)).
mkdir -p /usr/share/doc/NVIDIA_GLX-1.0/samples
cp "$SAMPLES" /usr/share/doc/NVIDIA_GLX-1.0/samples/nvidia-persistenced-init.tar.bz2
"""
# NVIDIA's install.sh (init/install.sh): creates the user, installs the unit, enables and starts it.
INSTALL_SH = ('#!/bin/sh\necho "install.sh $*" >>"$CALLS"\ntouch "$STATE/unit.nvidia-persistenced.service"\n'
              'touch "$STATE/enabled.nvidia-persistenced.service"\n')
SYSTEMCTL = """case "$1" in
  cat) test -f "$STATE/unit.$2" ;;
  enable) test -f "$STATE/unit.$2" || { echo "Failed to enable unit: Unit file $2 does not exist." >&2; exit 1; }
          touch "$STATE/enabled.$2" ;;
  is-enabled) test -f "$STATE/enabled.${!#}" ;;
  *) exit 0 ;;
esac"""


def samples_tarball(path: Path) -> Path:
    data = INSTALL_SH.encode()
    with tarfile.open(path, "w:bz2") as tar:
        info = tarfile.TarInfo("nvidia-persistenced-init/install.sh")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))
    return path


def nvidia_host(tmp_path: Path) -> tuple[Host, dict[str, str]]:
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text(f"#!/usr/bin/env bash\necho 'Cuda compilation tools, release "
                                       f"{VERSIONS.cuda.rsplit('.', 1)[0]}, V{VERSIONS.cuda}'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    kernel_cc = tmp_path / "kernel-cc"
    kernel_cc.write_text("gcc-12\n")
    host = Host(tmp_path, {**{k: v for k, v in BASE_FAKES.items() if k != "systemctl"}, "systemctl": SYSTEMCTL,
                           "curl": 'while [ $# -gt 0 ]; do if [ "$1" = -o ]; then echo fake >"$2"; shift; fi; shift;'
                                   ' done',
                           "modinfo": 'cat "$STATE/nvidia-module" 2>/dev/null || exit 1', "ldconfig": "true",
                           "sh": RUNFILE})
    env = {**component_env("nvidia"), "SCALETRAIN_CUDA_HOME": str(cuda), "SCALETRAIN_KERNEL_CC_FILE": str(kernel_cc),
           "SAMPLES": str(samples_tarball(tmp_path / "nvidia-persistenced-init.tar.bz2"))}
    return host, env


NVIDIA_SCRATCH = ("/etc/ld.so.conf.d", "/usr/share/doc")


def test_nvidia_installs_and_enables_the_persistence_daemon_after_the_driver(tmp_path) -> None:
    host, env = nvidia_host(tmp_path)
    result = host.run("nvidia.sh", "build", env, scratch=NVIDIA_SCRATCH)
    assert result.returncode == 0, result.stderr
    calls = host.called()
    assert "install.sh systemd" in calls and "systemctl enable nvidia-persistenced.service" in calls, calls
    driver, install = first(calls, "driver.run"), calls.index("install.sh systemd")
    assert driver < install < calls.index("systemctl enable nvidia-persistenced.service")
    assert host.run("nvidia.sh", "validate", env, scratch=NVIDIA_SCRATCH).returncode == 0
    # A second build finds the daemon enabled and installs nothing again.
    host.calls.write_text("")
    assert host.run("nvidia.sh", "build", env, scratch=NVIDIA_SCRATCH).returncode == 0
    assert not [c for c in host.called() if c.startswith(("driver.run", "install.sh", "apt-get"))]


def test_nvidia_validation_fails_while_the_persistence_daemon_is_not_enabled(tmp_path) -> None:
    host, env = nvidia_host(tmp_path)
    assert host.run("nvidia.sh", "build", env, scratch=NVIDIA_SCRATCH).returncode == 0
    (host.state / "enabled.nvidia-persistenced.service").unlink(missing_ok=True)  # a daemon disabled since
    result = host.run("nvidia.sh", "validate", env, scratch=NVIDIA_SCRATCH)
    assert result.returncode == 1
    assert "nvidia-persistenced.service is not enabled at boot" in result.stderr


def image_test_host(tmp_path: Path) -> tuple[Host, dict[str, str]]:
    """A g5-like host (no NVSwitch, no EFA) of 8 GPUs whose persistence mode is $MODES, one word per GPU."""
    host = Host(tmp_path, {
        "nvidia-smi": ('case "$*" in\n'
                       '  *--query-gpu=name*) for m in $MODES; do echo "NVIDIA A10G"; done ;;\n'
                       '  *--query-gpu=driver_version*) for m in $MODES; do echo 570.172.08; done ;;\n'
                       '  *--query-gpu=persistence_mode*) for m in $MODES; do echo "$m"; done ;;\n'
                       '  -q) i=0; for m in $MODES; do i=$((i + 1)); printf "GPU 0000:%02d:00.0\\n" $i\n'
                       '        printf "    Product Name                          : NVIDIA A10G\\n"\n'
                       '        printf "    Persistence Mode                      : %s\\n" "$m"; done ;;\n'
                       '  *) exit 1 ;;\n'
                       'esac'),
        "lspci": "exit 0", "horovodrun": 'echo "    [X] NCCL"', "fi_info": "echo 'provider: efa'"})
    perf = tmp_path / "nccl-tests" / "build" / "all_reduce_perf"
    perf.parent.mkdir(parents=True)
    perf.write_text('#!/usr/bin/env bash\necho "all_reduce_perf $*" >>"$CALLS"\necho "# Out of bounds values : 0 OK"\n')
    perf.chmod(0o755)
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/usr/bin/env bash\nexit 0\n")
    python.chmod(0o755)
    env = {**component_env("image-test"), "SCALETRAIN_BIN_PATH": str(host.bin),
           "SCALETRAIN_VENV": str(python.parents[1]), "SCALETRAIN_NCCL_TESTS_ROOT": str(perf.parents[1])}
    return host, env


def test_image_test_fails_an_instance_whose_gpus_are_not_persistent(tmp_path) -> None:
    host, env = image_test_host(tmp_path)
    result = host.run("image-test.sh", None, {**env, "MODES": " ".join(["Enabled"] * 7 + ["Disabled"])})
    assert result.returncode == 1, result.stdout
    assert "persistence mode is on for 7 of 8 GPUs" in result.stderr
    assert not [c for c in host.called() if c.startswith("all_reduce_perf")]
    passed = host.run("image-test.sh", None, {**env, "MODES": " ".join(["Enabled"] * 8)})
    assert passed.returncode == 0, passed.stderr
    assert "persistence mode on" in passed.stdout
