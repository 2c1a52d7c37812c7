#!/usr/bin/env bash
# Base packages, the kernel held (the NVIDIA, Lustre and BeeGFS modules are built for it), the compiler that kernel
# was built with, and the image's record of its versions in SCALETRAIN_IMAGE_ENV_FILE (/etc/scaletrain/image.env;
# launch doctor reads it).
# Reads: SCALETRAIN_IMAGE_ENV (every pinned version and path, KEY=VALUE lines, from ami/versions.json and
# ami/paths.py), SCALETRAIN_IMAGE_ENV_FILE (where it goes) and SCALETRAIN_KERNEL_CC_FILE (where the kernel's compiler,
# e.g. gcc-12, is recorded for the components that build kernel modules).
set -euo pipefail
: "${SCALETRAIN_IMAGE_ENV:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_IMAGE_ENV_FILE:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_KERNEL_CC_FILE:?set by the Image Builder component from ami/paths.py}"
export DEBIAN_FRONTEND=noninteractive
RECORD=$SCALETRAIN_IMAGE_ENV_FILE
# sd_booted(3): this exists exactly when systemd runs this system, never in the rehearsal root's chroot (the tests
# point it elsewhere).
SYSTEMD_RUNS=${SCALETRAIN_SD_BOOTED_DIR:-/run/systemd/system}
# The running kernel's version banner names the compiler that built it (proc(5), /proc/version). The tests point this
# at recorded banners.
KERNEL_BANNER=${SCALETRAIN_KERNEL_VERSION_FILE:-/proc/version}

# kernel_cc: the gcc package that built a kernel, from its version banner on stdin. Out-of-tree modules (the NVIDIA
# driver, EFA, BeeGFS) must be built with it: Ubuntu 22.04's 6.8 AWS kernels are built with gcc-12, e.g.
#   Linux version 6.8.0-1063-aws (buildd@lcy02-amd64-060) (x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04.3)
#   12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #66~22.04.1-Ubuntu SMP ...
# while build-essential installs gcc-11 (5.15's compiler), and NVIDIA's installer refuses a compiler whose major and
# minor differ from the kernel's ("It is recommended to set the CC environment variable to the compiler that was used
# to compile the kernel"). AWS ParallelCluster builds the driver the same way: "On Ubuntu22, install the NVIDIA driver
# using the gcc version used to compile the kernel" (https://github.com/aws/aws-parallelcluster-cookbook/pull/2852).
# The version is the first X.Y.Z after "gcc" (older banners say "gcc version 7.5.0 (Ubuntu ...)").
kernel_cc() {
    local banner rest
    banner=$(cat)
    case "$banner" in
        *gcc*) rest=${banner#*gcc} ;;
        *) echo "error: the kernel was not built with gcc: ${banner:0:160}" >&2; return 1 ;;
    esac
    if [[ $rest =~ ([0-9]+)\.[0-9]+\.[0-9]+ ]]; then
        echo "gcc-${BASH_REMATCH[1]}"
    else
        echo "error: no gcc version in the kernel's banner: ${banner:0:160}" >&2
        return 1
    fi
}

# The kernel's headers, DKMS and the kernel's compiler, for the modules built below. Rehearsal nodes
# (launcher/plans/rehearsal.py) run on the launcher's kernel and build no modules: they skip these, and only these.
KERNEL_CC=""
KERNEL_PACKAGES=()
if [ "${SCALETRAIN_REHEARSAL:-0}" != 1 ] && [ "${1:-build}" != kernel-cc ]; then
    KERNEL_CC=$(kernel_cc <"$KERNEL_BANNER")
    KERNEL_PACKAGES=(dkms "linux-headers-$(uname -r)" "$KERNEL_CC")
fi

# quiet_apt: before base.sh's first apt-get, the stock AMI's own apt work is over and cannot start again. At first boot
# cloud-init may run apt (package_update, user data), and apt-daily.timer and apt-daily-upgrade.timer start
# `apt-get update` and unattended-upgrades, which installs security updates, a newer linux-aws kernel among them
# (Ubuntu Server docs, "Automatic updates": installed and enabled by default), while the build takes the dpkg lock
# ("Could not get lock /var/lib/dpkg/lock-frontend") or builds modules for the kernel it replaces.
# `cloud-init status --wait` blocks until cloud-init is done. Exit 2 is "done, with recoverable errors" (cloud-init
# 23.4 on: docs "Failure states" and "Why did cloud-init status start returning exit code 2?"): its apt work is over,
# all that matters here. 1 is a critical failure ("something is likely seriously wrong with the system"): no image.
# Stopping a timer does not stop the run it started, so the services stop too, and all are masked: nothing starts
# them again, on the image's nodes either (the image is rebuilt for updates; its kernel is held). `mask` works
# offline, in the rehearsal root's chroot too, and on units a system lacks; `stop` only where systemd runs. A run
# that outlives its stop (apt-daily-upgrade.service is KillMode=process: unattended-upgrades finishes its package)
# holds the dpkg lock a while: every apt-get of the recipe waits up to 10 minutes for it, -o DPkg::Lock::Timeout=600
# (apt >= 1.9.11, apt-pkg/deb/debsystem.cc; apt-get waits for none by default). `apt-get update` takes only the lists
# lock, for which apt waits for nothing (apt-pkg/acquire.cc): apt-daily.service, which holds it, is stopped first.
quiet_apt() {
    local rc=0 unit
    local units=(apt-daily.timer apt-daily-upgrade.timer apt-daily.service apt-daily-upgrade.service
                 unattended-upgrades.service)
    if command -v cloud-init >/dev/null && [ -d "$SYSTEMD_RUNS" ]; then
        timeout 1800 cloud-init status --wait >/dev/null || rc=$?
        if [ "$rc" != 0 ] && [ "$rc" != 2 ]; then
            echo "error: cloud-init status --wait exited $rc (124: still running after 30 minutes):" >&2
            cloud-init status --long >&2 || true
            return 1
        fi
    fi
    command -v systemctl >/dev/null || return 0
    if [ -d "$SYSTEMD_RUNS" ]; then
        for unit in "${units[@]}"; do systemctl stop "$unit" 2>/dev/null || true; done
    fi
    systemctl mask "${units[@]}" >/dev/null
}

verify() {
    test -s "$RECORD" || { echo "error: $RECORD is missing" >&2; return 1; }
    diff <(printf '%s\n' "$SCALETRAIN_IMAGE_ENV") "$RECORD" >/dev/null \
        || { echo "error: $RECORD differs from the versions this component pins" >&2; return 1; }
    dpkg -s build-essential "${KERNEL_PACKAGES[@]}" >/dev/null
    if [ -n "$KERNEL_CC" ]; then
        [ "$(cat "$SCALETRAIN_KERNEL_CC_FILE" 2>/dev/null)" = "$KERNEL_CC" ] \
            || { echo "error: $SCALETRAIN_KERNEL_CC_FILE does not name $KERNEL_CC, the compiler kernel $(uname -r)" \
                      "was built with" >&2; return 1; }
    fi
}

install_() {
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq build-essential "${KERNEL_PACKAGES[@]}" curl \
        ca-certificates gnupg unzip bzip2 python3-venv python3-dev git chrony jq pciutils >/dev/null
    # The kernel modules built below match this kernel only: hold it so an upgrade cannot strand them. Nothing else
    # installs packages before this (quiet_apt), and the install above names this kernel's own headers only.
    if [ "${#KERNEL_PACKAGES[@]}" -gt 0 ]; then
        apt-mark hold "linux-image-$(uname -r)" "linux-headers-$(uname -r)" >/dev/null
        for meta in linux-aws linux-image-aws linux-headers-aws; do
            if dpkg -s "$meta" >/dev/null 2>&1; then apt-mark hold "$meta" >/dev/null; fi
        done
        install -d -m 0755 "$(dirname "$SCALETRAIN_KERNEL_CC_FILE")"
        echo "$KERNEL_CC" >"$SCALETRAIN_KERNEL_CC_FILE"
    fi
    install -d -m 0755 "$(dirname "$RECORD")"
    printf '%s\n' "$SCALETRAIN_IMAGE_ENV" >"$RECORD"
}

case "${1:-build}" in
    build) quiet_apt; verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    kernel-cc) kernel_cc <"$KERNEL_BANNER" ;;
    *) echo "usage: $0 [build|validate|kernel-cc]" >&2; exit 2 ;;
esac
