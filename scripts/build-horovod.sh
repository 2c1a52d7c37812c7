#!/usr/bin/env bash
# Build Horovod 0.28.1 from its PyPI sdist against the torch already in the venv, and install it.
#
# Horovod's last release sets C++14; PyTorch >= 2.1 needs C++17 (fixed upstream, unreleased). We raise the
# standard in the two CMakeLists.txt that set it, build with PyTorch + MPI + Gloo, and cache the wheel under
# the user's cache directory, keyed by the Horovod, torch and Python versions, so a second set-up installs
# in seconds.
set -euo pipefail

PY=${1:?usage: build-horovod.sh PYTHON}
HVD_VERSION=0.28.1
torch_version=$("$PY" -c 'import torch; print(torch.__version__.replace("+", "_"))')
py_tag=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
cache="${XDG_CACHE_HOME:-$HOME/.cache}/scaletrain/wheels/horovod-${HVD_VERSION}-torch${torch_version}-${py_tag}"

if ! ls "$cache"/horovod-*.whl >/dev/null 2>&1; then
    echo "building Horovod ${HVD_VERSION} against torch ${torch_version} (about 4 minutes on 2 cores)"
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==${HVD_VERSION}" -d "$work"
    tar -xzf "$work/horovod-${HVD_VERSION}.tar.gz" -C "$work"
    src="$work/horovod-${HVD_VERSION}"
    sed -i 's/set(CMAKE_CXX_STANDARD 14)/set(CMAKE_CXX_STANDARD 17)/' \
        "$src/CMakeLists.txt" "$src/horovod/torch/CMakeLists.txt"
    grep -q 'set(CMAKE_CXX_STANDARD 17)' "$src/horovod/torch/CMakeLists.txt" \
        || { echo "error: the C++17 patch did not apply to horovod/torch/CMakeLists.txt" >&2; exit 1; }
    HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
    HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=MPI \
    MAKEFLAGS="-j$(nproc)" \
        "$PY" -m pip wheel --no-build-isolation --no-deps "$src" -w "$work/dist"
    mkdir -p "$cache"
    cp "$work"/dist/horovod-*.whl "$cache/.tmp.whl"
    mv "$cache/.tmp.whl" "$cache/$(basename "$work"/dist/horovod-*.whl)"
fi
"$PY" -m pip install --quiet --no-deps "$cache"/horovod-*.whl
"$PY" -m pip install --quiet "cloudpickle" "psutil" "pyyaml" "packaging"
"$PY" -c 'import horovod.torch as hvd; assert hvd.mpi_built() and hvd.gloo_built(), "Horovod lacks MPI or Gloo"'
echo "Horovod ${HVD_VERSION} installed from $cache"
