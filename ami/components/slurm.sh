#!/usr/bin/env bash
# Slurm and munge: the head node runs slurmctld, every worker and reducer node slurmd as a dynamic node (slurmd -Z,
# Slurm 22.05 and later: https://slurm.schedmd.com/dynamic_nodes.html), so that the cluster, not the launcher, owns
# its jobs (launcher/plans/slurm.py renders the configuration; the node's boot starts the daemons). Nothing starts
# here: the image carries no munge key and no slurm.conf. The key comes from the cluster at boot (the stack's
# secret), the configuration from the controller (configless: https://slurm.schedmd.com/configless_slurm.html).
# Ubuntu 22.04's slurm-wlm is 21.08, which has no dynamic normal nodes, so the image builds the pinned release from
# SchedMD's source as ParallelCluster's cookbook does (https://slurm.schedmd.com/quickstart_admin.html, "Building
# and Installing Slurm"); munge is Ubuntu's. Rehearsal nodes take Debian 12's packages (22.05.8).
# The daemons run as systemd units the node's boot writes and enables (launcher/plans/slurm.py, units); the packages'
# own units are left disabled here (no_boot_daemons).
# Reads: SLURM_VERSION. SCALETRAIN_SLURM_ROOT: where verify and the cleanups look for the system's files (empty, the
# root, on an image; a scratch tree in tests/test_ami_scripts.py).
set -euo pipefail
: "${SLURM_VERSION:?set by the Image Builder component from ami/versions.json}"
export DEBIAN_FRONTEND=noninteractive
ROOT=${SCALETRAIN_SLURM_ROOT:-}
WANT="$SLURM_VERSION"
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then WANT=22.05; fi
TAG="slurm-${SLURM_VERSION//./-}-1"
SOURCE="https://github.com/SchedMD/slurm/archive/refs/tags/${TAG}.tar.gz"
# slurmd initializes its cgroup plugin whatever ProctrackType and TaskPlugin say (slurmd.c, _slurmd_init:
# cgroup_g_init), and cgroup.conf's default CgroupPlugin=autodetect takes cgroup/v2 on Ubuntu 22.04's unified
# hierarchy: without the plugin slurmd exits 1. The source build has it at --prefix's /usr/lib/slurm, Debian's
# package (slurm-wlm-basic-plugins) in /usr/lib/<triplet>/slurm-wlm. verify() expands the glob when it runs.

verify() {
    local d have plugin found=""
    for d in slurmctld slurmd; do
        have=$("$ROOT/usr/sbin/$d" -V 2>/dev/null) || { echo "error: /usr/sbin/$d does not run" >&2; return 1; }
        case "$have" in
            "slurm $WANT"*|"slurm-wlm $WANT"*) ;;   # SchedMD's build; Debian's package
            *) echo "error: /usr/sbin/$d is '$have', expected slurm $WANT" >&2; return 1 ;;
        esac
    done
    for d in sbatch squeue scontrol scancel srun; do
        command -v "$d" >/dev/null || { echo "error: no $d on PATH" >&2; return 1; }
    done
    for plugin in "$ROOT"/usr/lib/slurm/cgroup_v2.so "$ROOT"/usr/lib/*/slurm-wlm/cgroup_v2.so; do
        if [ -f "$plugin" ]; then found=$plugin; fi
    done
    [ -n "$found" ] || { echo "error: no cgroup/v2 plugin (/usr/lib/slurm/cgroup_v2.so or" \
        "/usr/lib/*/slurm-wlm/cgroup_v2.so): slurmd would exit on a cgroup v2 host" >&2; return 1; }
    test -x "$ROOT/usr/sbin/munged" || { echo "error: no /usr/sbin/munged" >&2; return 1; }
    id slurm >/dev/null 2>&1 || { echo "error: no user slurm (SlurmUser)" >&2; return 1; }
}

# Debian's and Ubuntu's munge make a key when installed: an image must not carry one (every cluster made from it
# would trust every other), as cloud-init deletes an image's SSH host keys.
no_image_secrets() {
    rm -f "$ROOT/etc/munge/munge.key" "$ROOT/etc/slurm/slurm.conf"
}

# The packages enable their units (Debian's munge, slurmd and slurmctld; Ubuntu's munge): a node made from the image
# would start munged before its boot has written the cluster's key, and slurmd before its options exist. The boot
# enables what the node's role runs (launcher/plans/slurm.py, enable_commands). One unit at a time: a unit the build
# does not have (SchedMD's source installs none) must not keep the others enabled. `disable` works offline, in the
# rehearsal root's chroot too; `stop` only where systemd runs this system (the Image Builder instance, where munge's
# postinst started munged): /run/systemd/system exists exactly then (sd_booted(3)), never in a chroot.
no_boot_daemons() {
    local unit
    for unit in munge.service slurmd.service slurmctld.service; do
        systemctl disable "$unit" 2>/dev/null || true
        if [ -d "$ROOT/run/systemd/system" ]; then systemctl stop "$unit" 2>/dev/null || true; fi
    done
}

install_rehearsal() {
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends munge slurmctld slurmd slurm-client \
        >/dev/null
}

install_source() {
    local work
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    # cgroup/v2 is built only where configure finds dbus-1 through pkg-config and linux/bpf.h (auxdir/x_ac_cgroup.m4:
    # PKG_CHECK_MODULES([dbus], [dbus-1]) and X_AC_BPF; src/plugins/cgroup/Makefile.am: "if WITH_BPF / if WITH_DBUS /
    # SUBDIRS += v2"): libdbus-1-dev, pkg-config and linux-libc-dev (bpf.h; build-essential brings it too).
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends munge libmunge-dev build-essential \
        python3 libjson-c-dev libhttp-parser-dev libyaml-dev libdbus-1-dev pkg-config linux-libc-dev >/dev/null
    id slurm >/dev/null 2>&1 || useradd --system --home-dir /var/lib/slurm --shell /usr/sbin/nologin slurm
    work=$(mktemp -d)
    curl -fsSL -o "$work/slurm.tar.gz" "$SOURCE"
    tar -xzf "$work/slurm.tar.gz" -C "$work"
    (cd "$work/slurm-$TAG" \
        && ./configure --quiet --prefix=/usr --sbindir=/usr/sbin --sysconfdir=/etc/slurm --with-munge \
        && make -j"$(nproc)" >/dev/null && make install >/dev/null)
    ldconfig
    rm -rf "$work"
}

case "${1:-build}" in
    build)
        if ! verify 2>/dev/null; then
            if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then install_rehearsal; else install_source; fi
        fi
        no_boot_daemons
        no_image_secrets
        verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
