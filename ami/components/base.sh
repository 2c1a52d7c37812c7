#!/usr/bin/env bash
# Base packages, the kernel held (the NVIDIA, Lustre and BeeGFS modules are built for it), and the image's
# record of its versions in SCALETRAIN_IMAGE_ENV_FILE (/etc/scaletrain/image.env; launch doctor reads it).
# Reads: SCALETRAIN_IMAGE_ENV (every pinned version and path, KEY=VALUE lines, from ami/versions.json and
# ami/paths.py) and SCALETRAIN_IMAGE_ENV_FILE (where it goes).
set -euo pipefail
: "${SCALETRAIN_IMAGE_ENV:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_IMAGE_ENV_FILE:?set by the Image Builder component from ami/paths.py}"
export DEBIAN_FRONTEND=noninteractive
RECORD=$SCALETRAIN_IMAGE_ENV_FILE
# The kernel's headers and DKMS, for the modules built below. Rehearsal nodes (launcher/plans/rehearsal.py) run on
# the launcher's kernel and build no modules: they skip these, and only these.
KERNEL_PACKAGES=(dkms "linux-headers-$(uname -r)")
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then KERNEL_PACKAGES=(); fi

verify() {
    test -s "$RECORD" || { echo "error: $RECORD is missing" >&2; return 1; }
    diff <(printf '%s\n' "$SCALETRAIN_IMAGE_ENV") "$RECORD" >/dev/null \
        || { echo "error: $RECORD differs from the versions this component pins" >&2; return 1; }
    dpkg -s build-essential "${KERNEL_PACKAGES[@]:1}" >/dev/null
}

install_() {
    apt-get update -qq
    apt-get install -y -qq build-essential "${KERNEL_PACKAGES[@]}" curl ca-certificates gnupg unzip \
        python3-venv python3-dev git chrony jq pciutils >/dev/null
    # The kernel modules built below match this kernel only: hold it so an upgrade cannot strand them.
    if [ "${#KERNEL_PACKAGES[@]}" -gt 0 ]; then
        apt-mark hold "linux-image-$(uname -r)" "linux-headers-$(uname -r)" >/dev/null
        for meta in linux-aws linux-image-aws linux-headers-aws; do
            if dpkg -s "$meta" >/dev/null 2>&1; then apt-mark hold "$meta" >/dev/null; fi
        done
    fi
    install -d -m 0755 "$(dirname "$RECORD")"
    printf '%s\n' "$SCALETRAIN_IMAGE_ENV" >"$RECORD"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
