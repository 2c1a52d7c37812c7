#!/usr/bin/env bash
# The Lustre client for FSx for Lustre, from AWS's repository, with the modules for the held kernel.
# Reads: LUSTRE_CLIENT_VERSION (major.minor the modules must report).
# Nothing is compiled here: FSx publishes the client modules built for each Ubuntu AWS kernel, as the package
# lustre-client-modules-$(uname -r) (Amazon FSx for Lustre User Guide, "Installing the Lustre client", Ubuntu:
# https://docs.aws.amazon.com/fsx/latest/LustreGuide/install-lustre-client.html), so the kernel's compiler (base.sh)
# does not come into it.
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs AWS's Lustre repository and a kernel module for the host's kernel.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "lustre.sh: skipped on a rehearsal node"; exit 0; fi
: "${LUSTRE_CLIENT_VERSION:?set by the Image Builder component from ami/versions.json}"
export DEBIAN_FRONTEND=noninteractive
REPO=https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu

verify() {
    local have
    have=$(modinfo -F version lustre 2>/dev/null) \
        || { echo "error: no lustre module for kernel $(uname -r); FSx publishes modules per AWS kernel" >&2
             return 1; }
    case "$have" in
        "$LUSTRE_CLIENT_VERSION".*) ;;
        *) echo "error: lustre module $have, expected $LUSTRE_CLIENT_VERSION.x" >&2; return 1 ;;
    esac
}

install_() {
    curl -fsSL https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc \
        | gpg --dearmor --yes -o /usr/share/keyrings/fsx-ubuntu-public-key.gpg
    echo "deb [signed-by=/usr/share/keyrings/fsx-ubuntu-public-key.gpg] $REPO jammy main" \
        >/etc/apt/sources.list.d/fsxlustreclientrepo.list
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq "lustre-client-modules-$(uname -r)" lustre-client-utils >/dev/null
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
