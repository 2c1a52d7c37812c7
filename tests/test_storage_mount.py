"""The mount a node's own boot makes (launcher/plans/storage.py: fstab_line, boot_mount_commands): FSx for Lustre on
AWS as AWS documents it, the storage host's sshfs on a rehearsal node, one function writing both."""

from __future__ import annotations

import subprocess

import pytest

from launcher.errors import LaunchError
from launcher.plans import rehearsal as plan
from launcher.plans import storage

FSX = {"type": "fsx", "dns_name": "fs-0123.fsx.us-east-1.amazonaws.com", "mount_name": "abcdefgh",
       "mount_point": "/fsx"}


def test_fsx_is_mounted_from_fstab_as_aws_documents_it():
    # https://docs.aws.amazon.com/fsx/latest/LustreGuide/mount-fs-auto-mount-onreboot.html
    assert storage.fstab_line(FSX) == ("fs-0123.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh /fsx lustre "
                                       "defaults,relatime,flock,_netdev 0 0")


def test_the_rehearsals_line_differs_in_the_file_system_only():
    line = storage.fstab_line(plan.storage_mount("10.213.0.253"))
    source, point, kind, options, dump, passno = line.split()
    assert (source, point, kind, dump, passno) == ("root@10.213.0.253:/", "/fsx", "fuse.sshfs", "0", "0")
    opts = options.split(",")
    assert "_netdev" in opts and "allow_other" in opts and "StrictHostKeyChecking=yes" in opts
    # coherent across nodes, as Lustre is: nothing cached
    assert {"dir_cache=no", "attr_timeout=0", "entry_timeout=0", "negative_timeout=0"} <= set(opts)
    assert f"IdentityFile={plan.STORAGE_KEY}" in opts and f"UserKnownHostsFile={plan.STORAGE_KNOWN_HOSTS}" in opts


def test_an_unknown_kind_is_one_line():
    with pytest.raises(LaunchError, match="'beegfs' is not mounted by a node's boot; fsx or sshfs are"):
        storage.fstab_line({"type": "beegfs", "mount_point": "/fsx"})


def _run(commands: list[str], tmp_path, mount_ok_after: int) -> subprocess.CompletedProcess:
    """The boot's commands under bash, /etc/fstab and the mount point moved under tmp_path, `mount` failing until
    its Nth call and `mountpoint` saying no until then, `sleep` instant."""
    fstab, point = tmp_path / "fstab", tmp_path / "fsx"
    text = "\n".join(commands).replace("/etc/fstab", str(fstab)).replace("/fsx", str(point))
    calls = tmp_path / "calls"
    prelude = "\n".join([
        f"mount() {{ echo mount >> {calls}; [ $(grep -c mount {calls}) -ge {mount_ok_after} ] "
        f"&& touch {tmp_path}/up; }}",
        f"mountpoint() {{ [ -e {tmp_path}/up ]; }}",
        "sleep() { :; }"])
    return subprocess.run(["bash", "-c", "set -euo pipefail\n" + prelude + "\n" + text], capture_output=True,
                          text=True, timeout=30)


def test_the_boot_writes_fstab_once_and_retries_the_mount(tmp_path):
    commands = storage.boot_mount_commands(FSX)
    proc = _run(commands, tmp_path, mount_ok_after=3)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "fstab").read_text().count(" lustre ") == 1
    made = tmp_path / "fsx/scaletrain"
    assert made.is_dir() and oct(made.stat().st_mode & 0o7777) == "0o1777"
    (tmp_path / "calls").unlink()
    (tmp_path / "up").unlink()
    assert _run(commands, tmp_path, mount_ok_after=1).returncode == 0  # a second boot adds no second line
    assert (tmp_path / "fstab").read_text().count(" lustre ") == 1


def test_a_storage_that_never_comes_fails_the_boot_by_name(tmp_path):
    proc = _run(storage.boot_mount_commands(FSX), tmp_path, mount_ok_after=10 ** 6)
    assert proc.returncode == 1 and "could not mount /fsx" in proc.stderr.replace(str(tmp_path), "")
    assert (tmp_path / "calls").read_text().count("mount") == storage.MOUNT_TRIES  # tried, then gave up


def test_storage_comes_before_the_slurm_daemon_in_every_boot():
    from infra import boot

    mount = plan.storage_mount("10.213.0.253")
    for script in (boot.head_script(cluster_name="c", region="us-east-1", secret_id="arn", max_nodes=4,
                                    storage=mount),
                   boot.node_script(region="us-east-1", secret_id="arn", controller_addr="10.0.0.4", role="worker",
                                    cpus=4, storage=mount)):
        lines = script.splitlines()
        mounted = next(i for i, ln in enumerate(lines) if "mount /fsx" in ln)
        daemon = next(i for i, ln in enumerate(lines) if "enable --now" in ln and "slurm" in ln)
        assert mounted < daemon
    assert "fstab" not in boot.node_script(region="us-east-1", secret_id="arn", controller_addr="10.0.0.4",
                                           role="worker", cpus=4)  # BeeGFS or none: the launcher's, after boot
