#!/usr/bin/env bash
# NCCL from NVIDIA's CUDA repository, and nccl-tests (all_reduce_perf, built with MPI) in SCALETRAIN_NCCL_TESTS_ROOT.
# Reads: NCCL_VERSION, NCCL_CUDA_TAG (the package's +cudaX.Y suffix), NCCL_TESTS_VERSION; SCALETRAIN_NCCL_TESTS_ROOT,
# SCALETRAIN_MPI_PREFIX and SCALETRAIN_CUDA_HOME (ami/paths.py).
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs CUDA and NVIDIA's repository.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "nccl.sh: skipped on a rehearsal node"; exit 0; fi
: "${NCCL_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${NCCL_CUDA_TAG:?set by the Image Builder component from ami/versions.json}"
: "${NCCL_TESTS_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_NCCL_TESTS_ROOT:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_MPI_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_CUDA_HOME:?set by the Image Builder component from ami/paths.py}"
export DEBIAN_FRONTEND=noninteractive
PKG_VERSION="${NCCL_VERSION}-1+${NCCL_CUDA_TAG}"
TESTS=$SCALETRAIN_NCCL_TESTS_ROOT

verify() {
    [ "$(dpkg-query -W -f '${Version}' libnccl2 2>/dev/null)" = "$PKG_VERSION" ] \
        || { echo "error: libnccl2 $PKG_VERSION is not installed" >&2; return 1; }
    if ! grep -qx "$NCCL_TESTS_VERSION" "$TESTS/VERSION" 2>/dev/null || ! test -x "$TESTS/build/all_reduce_perf"; then
        echo "error: nccl-tests $NCCL_TESTS_VERSION is not built in $TESTS" >&2
        return 1
    fi
}

install_() {
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq --allow-change-held-packages "libnccl2=$PKG_VERSION" \
        "libnccl-dev=$PKG_VERSION" >/dev/null
    apt-mark hold libnccl2 libnccl-dev >/dev/null
    rm -rf "$TESTS"
    git clone --quiet --depth 1 --branch "v${NCCL_TESTS_VERSION}" https://github.com/NVIDIA/nccl-tests.git "$TESTS"
    make -C "$TESTS" -j "$(nproc)" MPI=1 MPI_HOME="$SCALETRAIN_MPI_PREFIX" CUDA_HOME="$SCALETRAIN_CUDA_HOME" NCCL_HOME=/usr \
        >/dev/null
    echo "$NCCL_TESTS_VERSION" >"$TESTS/VERSION"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
