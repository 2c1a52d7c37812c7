#!/usr/bin/env bash
# aws-ofi-nccl, the NCCL net plugin that carries NCCL over libfabric's EFA provider, built from its release
# tarball into SCALETRAIN_OFI_NCCL_PREFIX against the EFA installer's libfabric and Open MPI.
# Reads: AWS_OFI_NCCL_VERSION; SCALETRAIN_OFI_NCCL_PREFIX, SCALETRAIN_EFA_PREFIX, SCALETRAIN_MPI_PREFIX and
# SCALETRAIN_CUDA_HOME (ami/paths.py).
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs the EFA installer's libfabric and CUDA.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "aws-ofi-nccl.sh: skipped on a rehearsal node"; exit 0; fi
: "${AWS_OFI_NCCL_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_OFI_NCCL_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_EFA_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_MPI_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_CUDA_HOME:?set by the Image Builder component from ami/paths.py}"
export DEBIAN_FRONTEND=noninteractive
PREFIX=$SCALETRAIN_OFI_NCCL_PREFIX

verify() {
    grep -qx "$AWS_OFI_NCCL_VERSION" "$PREFIX/VERSION" 2>/dev/null \
        || { echo "error: aws-ofi-nccl $AWS_OFI_NCCL_VERSION is not installed in $PREFIX" >&2; return 1; }
    ls "$PREFIX"/lib/libnccl-net*.so >/dev/null \
        || { echo "error: no libnccl-net plugin in $PREFIX/lib" >&2; return 1; }
}

install_() {
    local work v=$AWS_OFI_NCCL_VERSION
    # The plugin's build requirements are libfabric (the EFA installer's) and hwloc: "To build the plugin, you
    # need to have Libfabric and HWLOC installed prior to build" (aws-ofi-nccl README.md, "Basic Requirements",
    # https://github.com/aws/aws-ofi-nccl#basic-requirements); configure stops without hwloc.h and libhwloc
    # (m4/check_pkg_hwloc.m4). Ubuntu ships both in libhwloc-dev.
    apt-get update -qq
    apt-get install -y -qq libhwloc-dev >/dev/null
    work=$(mktemp -d)
    curl -fsSL "https://github.com/aws/aws-ofi-nccl/releases/download/v${v}/aws-ofi-nccl-${v}.tar.gz" \
        | tar -xz -C "$work"
    (cd "$work/aws-ofi-nccl-${v}" \
        && ./configure --quiet --prefix="$PREFIX" --with-libfabric="$SCALETRAIN_EFA_PREFIX" \
            --with-cuda="$SCALETRAIN_CUDA_HOME" --with-mpi="$SCALETRAIN_MPI_PREFIX" \
            --enable-platform-aws --disable-tests \
        && make -j "$(nproc)" >/dev/null && make install >/dev/null)
    echo "$v" >"$PREFIX/VERSION"
    echo "$PREFIX/lib" >/etc/ld.so.conf.d/100-aws-ofi-nccl.conf
    ldconfig
    rm -rf "$work"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
