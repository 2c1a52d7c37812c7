#!/usr/bin/env bash
# BeeGFS management, metadata, storage and client from ThinkParQ's repository, the client module built for the
# held kernel. The services stay disabled: the launcher configures the roles (infra/layout.py) and starts them.
# Reads: BEEGFS_VERSION.
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs ThinkParQ's repository and a kernel module for the host's kernel.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "beegfs.sh: skipped on a rehearsal node"; exit 0; fi
: "${BEEGFS_VERSION:?set by the Image Builder component from ami/versions.json}"
export DEBIAN_FRONTEND=noninteractive
REPO="https://www.beegfs.io/release/beegfs_${BEEGFS_VERSION}"
SERVICES=(beegfs-mgmtd beegfs-meta beegfs-storage beegfs-helperd beegfs-client)

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
    curl -fsSL "$REPO/gpg/GPG-KEY-beegfs" | gpg --dearmor --yes -o /usr/share/keyrings/beegfs.gpg
    echo "deb [signed-by=/usr/share/keyrings/beegfs.gpg] $REPO jammy non-free" >/etc/apt/sources.list.d/beegfs.list
    apt-get update -qq
    apt-get install -y -qq "${SERVICES[@]}" beegfs-utils >/dev/null
    systemctl disable --now "${SERVICES[@]}" >/dev/null 2>&1 || true
    /etc/init.d/beegfs-client rebuild
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
