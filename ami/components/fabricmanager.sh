#!/usr/bin/env bash
# NVIDIA Fabric Manager at exactly the installed driver's version, held there, enabled at boot.
#
# On NVSwitch hosts (p4d, p4de: A100; p5, p5e, p5en: H100/H200) the GPUs reach each other only once Fabric Manager
# has configured the NVSwitches, and until then CUDA does not initialise; Fabric Manager itself aborts at start when
# the loaded driver is not of its own version (NVIDIA Fabric Manager User Guide,
# https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html, "Fabric Manager Startup" and
# "Installing Fabric Manager"; Amazon EC2 User Guide, "Install NVIDIA drivers on Linux instances",
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/install-nvidia-driver.html: P4d, P4de and P5 instances need
# NVIDIA Fabric Manager). The package comes from NVIDIA's CUDA repository, installed beside a runfile driver as AWS
# ParallelCluster does it (aws/aws-parallelcluster-cookbook, resources/fabric_manager: `apt install
# nvidia-fabricmanager-<branch>=<driver version>`, `apt-mark hold`, `systemctl enable nvidia-fabricmanager`).
#
# Runs on every base. Where the recipe installed the driver (nvidia.sh) it is NVIDIA_DRIVER_VERSION and the package
# NVIDIA_FABRICMANAGER_VERSION (ami/versions.json pins both); on a base with its own driver (the Deep Learning Base
# AMI) the version is that driver's, read from its kernel module, with the same package revision. The service is
# enabled everywhere; image-test.sh checks that it runs at the driver's version where the host has NVSwitches.
# Reads: NVIDIA_DRIVER_VERSION, NVIDIA_FABRICMANAGER_VERSION, SCALETRAIN_BASE_HAS_DRIVER (true|false).
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs NVSwitch hardware and NVIDIA's repository.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "fabricmanager.sh: skipped on a rehearsal node"; exit 0; fi
: "${NVIDIA_DRIVER_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${NVIDIA_FABRICMANAGER_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_BASE_HAS_DRIVER:?set by the Image Builder component from ami/versions.json (true or false)}"
export DEBIAN_FRONTEND=noninteractive
CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64
SERVICE=nvidia-fabricmanager

# NVIDIA's CUDA repository names the package per driver branch up to R575 (nvidia-fabricmanager-570) and plainly
# nvidia-fabricmanager from R580, the branch then being part of its version only.
package_for() {
    local branch=${1%%.*}
    if [ "$branch" -ge 580 ]; then echo nvidia-fabricmanager; else echo "nvidia-fabricmanager-$branch"; fi
}

# "<driver version> <package> <package version>" for the driver this image has.
wanted() {
    local driver
    driver=$(modinfo -F version nvidia 2>/dev/null) \
        || { echo "error: no nvidia kernel module for kernel $(uname -r); Fabric Manager follows the driver" >&2
             return 1; }
    if [ "$SCALETRAIN_BASE_HAS_DRIVER" != true ] && [ "$driver" != "$NVIDIA_DRIVER_VERSION" ]; then
        echo "error: the nvidia module is $driver, the recipe installed $NVIDIA_DRIVER_VERSION" >&2
        return 1
    fi
    echo "$driver $(package_for "$driver") ${driver}-${NVIDIA_FABRICMANAGER_VERSION##*-}"
}

verify() {
    local spec driver pkg pkg_version have
    spec=$(wanted) || return 1
    read -r driver pkg pkg_version <<<"$spec"
    # `nv-fabricmanager -v` prints "Fabric Manager version is : <version>" (NVIDIA driver release notes: "Fabric
    # Manager: <driver version> (Use nv-fabricmanager -v)").
    have=$(nv-fabricmanager -v 2>/dev/null | awk '/[Vv]ersion/ {v = $NF} END {print v}') || true
    [ "$have" = "$driver" ] \
        || { echo "error: Fabric Manager is ${have:-not installed}, the driver is $driver: they must match" >&2
             return 1; }
    [ "$(dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null)" = "$pkg_version" ] \
        || { echo "error: $pkg $pkg_version is not installed" >&2; return 1; }
    apt-mark showhold | grep -x "$pkg" >/dev/null \
        || { echo "error: $pkg is not held; an upgrade would part it from the driver" >&2; return 1; }
    systemctl is-enabled --quiet "$SERVICE" \
        || { echo "error: $SERVICE is not enabled at boot" >&2; return 1; }
}

install_() {
    local spec driver pkg pkg_version work
    spec=$(wanted)
    read -r driver pkg pkg_version <<<"$spec"
    if ! dpkg -s cuda-keyring >/dev/null 2>&1; then
        work=$(mktemp -d)
        curl -fsSL -o "$work/cuda-keyring.deb" "$CUDA_REPO/cuda-keyring_1.1-1_all.deb"
        dpkg -i "$work/cuda-keyring.deb" >/dev/null
        rm -rf "$work"
    fi
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    echo "Fabric Manager $pkg=$pkg_version for driver $driver"
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends --allow-change-held-packages \
        --allow-downgrades "$pkg=$pkg_version" >/dev/null
    apt-mark hold "$pkg" >/dev/null
    systemctl enable "$SERVICE"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
