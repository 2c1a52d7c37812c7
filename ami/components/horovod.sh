#!/usr/bin/env bash
# Horovod from its PyPI sdist with NCCL (GPU operations) and MPI (the EFA installer's Open MPI), with the
# C++17 fix of scripts/build-horovod.sh: 0.28.1 sets C++14, PyTorch >= 2.1 needs C++17.
# Reads: SCALETRAIN_VENV, HOROVOD_VERSION; SCALETRAIN_MPI_PREFIX and SCALETRAIN_CUDA_HOME (ami/paths.py).
set -euo pipefail
: "${SCALETRAIN_VENV:?set by the Image Builder component from ami/paths.py}"
: "${HOROVOD_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_MPI_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_CUDA_HOME:?set by the Image Builder component from ami/paths.py}"
PY="$SCALETRAIN_VENV/bin/python"
export PATH="$SCALETRAIN_MPI_PREFIX/bin:$SCALETRAIN_CUDA_HOME/bin:$PATH"
# Rehearsal nodes (launcher/plans/rehearsal.py) have no CUDA or NCCL: Horovod with MPI and Gloo for the CPU, from
# the same sdist and patch; SCALETRAIN_HOROVOD_WHEEL, when set there, is that build already made
# (scripts/build-horovod.sh), so that a rehearsal does not compile it again.
REHEARSAL=${SCALETRAIN_REHEARSAL:-0}
NEEDED=('\[X\] PyTorch' '\[X\] MPI' '\[X\] NCCL')
GPU_OPS=(HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_INCLUDE=/usr/include HOROVOD_NCCL_LIB=/usr/lib/x86_64-linux-gnu)
if [ "$REHEARSAL" = 1 ]; then NEEDED=('\[X\] PyTorch' '\[X\] MPI'); GPU_OPS=(); fi

verify() {
    local build
    "$PY" -c "import horovod; assert horovod.__version__ == '$HOROVOD_VERSION', horovod.__version__" \
        || { echo "error: Horovod $HOROVOD_VERSION is not installed in $SCALETRAIN_VENV" >&2; return 1; }
    build=$("$SCALETRAIN_VENV/bin/horovodrun" --check-build)
    for item in "${NEEDED[@]}"; do
        grep -q "$item" <<<"$build" \
            || { echo "error: horovodrun --check-build lacks ${item#*] }:" >&2; echo "$build" >&2; return 1; }
    done
}

install_() {
    local work src
    if [ "$REHEARSAL" = 1 ] && [ -n "${SCALETRAIN_HOROVOD_WHEEL:-}" ]; then
        "$PY" -m pip install --quiet cloudpickle psutil pyyaml packaging
        "$PY" -m pip install --quiet --no-deps "$SCALETRAIN_HOROVOD_WHEEL"
        return 0
    fi
    work=$(mktemp -d)
    "$PY" -m pip install --quiet cmake cloudpickle psutil pyyaml packaging
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==${HOROVOD_VERSION}" -d "$work"
    tar -xzf "$work/horovod-${HOROVOD_VERSION}.tar.gz" -C "$work"
    src="$work/horovod-${HOROVOD_VERSION}"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/horovod/torch/CMakeLists.txt" \
        || { echo "error: the C++17 patch did not apply to horovod/torch/CMakeLists.txt" >&2; return 1; }
    env "${GPU_OPS[@]}" \
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip install --quiet --no-build-isolation --no-deps --no-cache-dir "$src"
    rm -rf "$work"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
