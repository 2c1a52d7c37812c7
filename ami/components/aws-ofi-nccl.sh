#!/usr/bin/env bash
# aws-ofi-nccl, the NCCL net plugin that carries NCCL over libfabric's EFA provider, built from its release
# tarball into /opt/amazon/ofi-nccl against the EFA installer's libfabric and Open MPI.
# Reads: AWS_OFI_NCCL_VERSION.
set -euo pipefail
: "${AWS_OFI_NCCL_VERSION:?set by the Image Builder component from ami/versions.json}"
PREFIX=/opt/amazon/ofi-nccl

verify() {
    grep -qx "$AWS_OFI_NCCL_VERSION" "$PREFIX/VERSION" 2>/dev/null \
        || { echo "error: aws-ofi-nccl $AWS_OFI_NCCL_VERSION is not installed in $PREFIX" >&2; return 1; }
    ls "$PREFIX"/lib/libnccl-net*.so >/dev/null \
        || { echo "error: no libnccl-net plugin in $PREFIX/lib" >&2; return 1; }
}

install_() {
    local work v=$AWS_OFI_NCCL_VERSION
    work=$(mktemp -d)
    curl -fsSL "https://github.com/aws/aws-ofi-nccl/releases/download/v${v}/aws-ofi-nccl-${v}.tar.gz" \
        | tar -xz -C "$work"
    (cd "$work/aws-ofi-nccl-${v}" \
        && ./configure --quiet --prefix="$PREFIX" --with-libfabric=/opt/amazon/efa --with-cuda=/usr/local/cuda \
            --with-mpi=/opt/amazon/openmpi --enable-platform-aws --disable-tests \
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
