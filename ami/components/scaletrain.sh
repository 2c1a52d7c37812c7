#!/usr/bin/env bash
# This project, installed into the training venv from the source archive the component downloaded (the CDK
# asset of the repository), and the environment every login gets.
# Reads: SCALETRAIN_VENV, SCALETRAIN_SOURCE_ZIP.
set -euo pipefail
: "${SCALETRAIN_VENV:?set by the Image Builder component}"
: "${SCALETRAIN_SOURCE_ZIP:?set by the Image Builder component}"
PY="$SCALETRAIN_VENV/bin/python"
SRC=/opt/scaletrain/src

verify() {
    "$PY" -c 'import launcher.doctor, training.train' \
        || { echo "error: scaletrain does not import in $SCALETRAIN_VENV" >&2; return 1; }
    grep -q "$SCALETRAIN_VENV/bin" /etc/profile.d/scaletrain.sh \
        || { echo "error: /etc/profile.d/scaletrain.sh does not put the venv on PATH" >&2; return 1; }
}

install_() {
    rm -rf "$SRC"
    install -d -m 0755 "$SRC"
    unzip -q -o "$SCALETRAIN_SOURCE_ZIP" -d "$SRC"
    "$PY" -m pip install --quiet "$SRC"
    cat >/etc/profile.d/scaletrain.sh <<PROFILE
export PATH="$SCALETRAIN_VENV/bin:/opt/amazon/openmpi/bin:/opt/amazon/efa/bin:/usr/local/cuda/bin:\$PATH"
export LD_LIBRARY_PATH="/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib:/opt/amazon/openmpi/lib:/usr/local/cuda/lib64\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
PROFILE
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
