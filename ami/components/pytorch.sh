#!/usr/bin/env bash
# The training Python: a venv at SCALETRAIN_VENV with the pinned PyTorch CUDA build.
# Reads: SCALETRAIN_VENV, TORCH_VERSION, TORCH_INDEX (the PyTorch wheel index for the image's CUDA).
set -euo pipefail
: "${SCALETRAIN_VENV:?set by the Image Builder component from ami/paths.py}"
: "${TORCH_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${TORCH_INDEX:?set by the Image Builder component from ami/versions.json}"
PY="$SCALETRAIN_VENV/bin/python"
# The image takes the CUDA build from PyTorch's index. Rehearsal nodes (launcher/plans/rehearsal.py) have no GPU and
# build from package registries only: the CPU build of the same release from the default index.
CUDA_BUILD=True
INDEX=(--index-url "$TORCH_INDEX")
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then CUDA_BUILD=False; INDEX=(); fi

# The CUDA build is the index's own: PyTorch's wheels carry the index's tag as their local version (2.7.1+cu126), and
# which CUDA build it is decides the GPUs it has kernels for (versions.json's torch_arch_list; a 2.7 cu128 wheel has
# no sm_70, so no V100 runs it).
WANT="$TORCH_VERSION+${TORCH_INDEX##*/}"
if [ "$CUDA_BUILD" = False ]; then WANT="$TORCH_VERSION"; fi

verify() {
    local have
    have=$("$PY" -c 'import torch; print(torch.__version__, torch.version.cuda is not None)' 2>/dev/null) \
        || { echo "error: torch does not import in $SCALETRAIN_VENV" >&2; return 1; }
    # A rehearsal's CPU build may carry a +cpu label or none.
    [ "$have" = "$WANT $CUDA_BUILD" ] || { [ "$CUDA_BUILD" = False ] && [ "${have%+cpu False}" = "$WANT" ]; } \
        || { echo "error: torch in $SCALETRAIN_VENV is '$have', expected '$WANT $CUDA_BUILD' (True: a CUDA build)" >&2
             return 1; }
}

install_() {
    test -x "$PY" || python3 -m venv "$SCALETRAIN_VENV"
    "$PY" -m pip install --quiet --upgrade pip setuptools wheel
    "$PY" -m pip install --quiet "torch==${TORCH_VERSION}" "${INDEX[@]}"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
