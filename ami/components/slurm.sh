#!/usr/bin/env bash
# Slurm and munge: the head node runs slurmctld, every worker and reducer node slurmd as a dynamic node (slurmd -Z,
# Slurm 22.05 and later: https://slurm.schedmd.com/dynamic_nodes.html), so that the cluster, not the launcher, owns
# its jobs (launcher/plans/slurm.py renders the configuration; the node's boot starts the daemons). Nothing starts
# here: the image carries no munge key and no slurm.conf. The key comes from the cluster at boot (the stack's
# secret), the configuration from the controller (configless: https://slurm.schedmd.com/configless_slurm.html).
# Ubuntu 22.04's slurm-wlm is 21.08, which has no dynamic normal nodes, so the image builds the pinned release from
# SchedMD's source as ParallelCluster's cookbook does (https://slurm.schedmd.com/quickstart_admin.html, "Building
# and Installing Slurm"); munge is Ubuntu's. Rehearsal nodes take Debian 12's packages (22.05.8).
# Reads: SLURM_VERSION.
set -euo pipefail
: "${SLURM_VERSION:?set by the Image Builder component from ami/versions.json}"
export DEBIAN_FRONTEND=noninteractive
WANT="$SLURM_VERSION"
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then WANT=22.05; fi
TAG="slurm-${SLURM_VERSION//./-}-1"
SOURCE="https://github.com/SchedMD/slurm/archive/refs/tags/${TAG}.tar.gz"

verify() {
    local d have
    for d in slurmctld slurmd; do
        have=$(/usr/sbin/$d -V 2>/dev/null) || { echo "error: /usr/sbin/$d does not run" >&2; return 1; }
        case "$have" in
            "slurm $WANT"*|"slurm-wlm $WANT"*) ;;   # SchedMD's build; Debian's package
            *) echo "error: /usr/sbin/$d is '$have', expected slurm $WANT" >&2; return 1 ;;
        esac
    done
    for d in sbatch squeue scontrol scancel srun; do
        command -v "$d" >/dev/null || { echo "error: no $d on PATH" >&2; return 1; }
    done
    test -x /usr/sbin/munged || { echo "error: no /usr/sbin/munged" >&2; return 1; }
    id slurm >/dev/null 2>&1 || { echo "error: no user slurm (SlurmUser)" >&2; return 1; }
}

# Debian's and Ubuntu's munge make a key when installed: an image must not carry one (every cluster made from it
# would trust every other), as cloud-init deletes an image's SSH host keys.
no_image_secrets() {
    rm -f /etc/munge/munge.key /etc/slurm/slurm.conf
}

install_rehearsal() {
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends munge slurmctld slurmd slurm-client >/dev/null
}

install_source() {
    local work
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends munge libmunge-dev build-essential python3 libjson-c-dev \
        libhttp-parser-dev libyaml-dev >/dev/null
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
        no_image_secrets
        verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
