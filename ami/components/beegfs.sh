#!/usr/bin/env bash
# BeeGFS management, metadata, storage and client from ThinkParQ's repository, the client module built for the
# held kernel. The services stay disabled: the launcher configures the roles (infra/layout.py) and starts them.
# Reads: BEEGFS_VERSION; SCALETRAIN_KERNEL_CC_FILE (ami/paths.py: the compiler the kernel was built with).
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs ThinkParQ's repository and a kernel module for the host's kernel.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "beegfs.sh: skipped on a rehearsal node"; exit 0; fi
: "${BEEGFS_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_KERNEL_CC_FILE:?set by the Image Builder component from ami/paths.py}"
export DEBIAN_FRONTEND=noninteractive
REPO="https://www.beegfs.io/release/beegfs_${BEEGFS_VERSION}"
SERVICES=(beegfs-mgmtd beegfs-meta beegfs-storage beegfs-helperd beegfs-client)

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
    local pkg
    for pkg in "${SERVICES[@]}" beegfs-utils; do
        [ "$(dpkg-query -W -f '${Version}' "$pkg" 2>/dev/null | cut -d- -f1)" = "$BEEGFS_VERSION" ] \
            || { echo "error: $pkg $BEEGFS_VERSION is not installed" >&2; return 1; }
    done
    find "/lib/modules/$(uname -r)" -name 'beegfs.ko*' | grep . >/dev/null \
        || { echo "error: no beegfs client module for kernel $(uname -r)" >&2; return 1; }
}

install_() {
    require_kernel_cc  # before the repository and packages go in: a build that cannot finish changes nothing
    curl -fsSL "$REPO/gpg/GPG-KEY-beegfs" | gpg --dearmor --yes -o /usr/share/keyrings/beegfs.gpg
    echo "deb [signed-by=/usr/share/keyrings/beegfs.gpg] $REPO jammy non-free" >/etc/apt/sources.list.d/beegfs.list
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq "${SERVICES[@]}" beegfs-utils >/dev/null
    systemctl disable --now "${SERVICES[@]}" >/dev/null 2>&1 || true
    /etc/init.d/beegfs-client rebuild
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
