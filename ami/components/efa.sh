#!/usr/bin/env bash
# The EFA installer: the EFA kernel module, libfabric (/opt/amazon/efa) and Open MPI (/opt/amazon/openmpi).
# Reads: EFA_INSTALLER_VERSION, LIBFABRIC_VERSION and OPENMPI_VERSION (what that installer ships);
# SCALETRAIN_EFA_PREFIX and SCALETRAIN_MPI_PREFIX (ami/paths.py: where the installer puts them); SCALETRAIN_KERNEL_CC_FILE
# (ami/paths.py: the compiler the kernel was built with, which its EFA module needs).
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs EFA devices and AWS's EFA installer (the rehearsal puts Debian's Open MPI at the same prefix instead: ami/rehearsal/openmpi.sh).
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "efa.sh: skipped on a rehearsal node"; exit 0; fi
: "${EFA_INSTALLER_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${LIBFABRIC_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${OPENMPI_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_EFA_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_MPI_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_KERNEL_CC_FILE:?set by the Image Builder component from ami/paths.py}"

# The module is built through the kernel's own build files, which name the compiler the kernel was built with: Ubuntu's
# headers for its 6.8 (and 6.5) kernels run gcc-12, and a host with only build-essential's gcc-11 fails inside the
# build with "gcc-12: not found" (e.g. https://github.com/piraeusdatastore/piraeus-operator/issues/594,
# https://github.com/jlam55555/veikk-linux-driver/issues/76). base.sh read that compiler from the kernel and
# installed it; say so here, by name, rather than deep in a module build log.
require_kernel_cc() {
    local cc
    cc=$(cat "$SCALETRAIN_KERNEL_CC_FILE" 2>/dev/null) || cc=""
    if [ -z "$cc" ] || ! command -v "$cc" >/dev/null; then
        echo "error: the compiler kernel $(uname -r) was built with (${cc:-not recorded in $SCALETRAIN_KERNEL_CC_FILE})" \
             "is not installed; the base component installs it" >&2
        return 1
    fi
}

verify() {
    grep -q "EFA installer version: ${EFA_INSTALLER_VERSION}\$" /opt/amazon/efa_installed_packages 2>/dev/null \
        || { echo "error: EFA installer ${EFA_INSTALLER_VERSION} is not installed" >&2; return 1; }
    "$SCALETRAIN_EFA_PREFIX/bin/fi_info" --version | grep "libfabric: ${LIBFABRIC_VERSION}\$" >/dev/null \
        || { echo "error: libfabric is not ${LIBFABRIC_VERSION}; correct ami/versions.json" >&2; return 1; }
    "$SCALETRAIN_MPI_PREFIX/bin/mpirun" --version | grep "(Open MPI) ${OPENMPI_VERSION}\$" >/dev/null \
        || { echo "error: $SCALETRAIN_MPI_PREFIX is not Open MPI ${OPENMPI_VERSION}" >&2; return 1; }
}

install_() {
    local work
    require_kernel_cc  # before the download: a build that cannot finish leaves nothing behind
    work=$(mktemp -d)
    curl -fsSL "https://efa-installer.amazonaws.com/aws-efa-installer-${EFA_INSTALLER_VERSION}.tar.gz" \
        | tar -xz -C "$work"
    # The installer runs apt-get itself: it waits for the dpkg locks as every apt-get of the recipe does (base.sh,
    # quiet_apt), told so in a file apt reads before its own configuration (apt.conf(5), APT_CONFIG).
    echo 'DPkg::Lock::Timeout "600";' >"$work/apt-wait.conf"
    (cd "$work/aws-efa-installer" && APT_CONFIG="$work/apt-wait.conf" ./efa_installer.sh -y)
    printf '%s\n' "$SCALETRAIN_EFA_PREFIX/lib" "$SCALETRAIN_MPI_PREFIX/lib" >/etc/ld.so.conf.d/100-efa.conf
    ldconfig
    rm -rf "$work"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
