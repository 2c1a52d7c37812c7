#!/usr/bin/env bash
# This project with its `train` extra, installed into the training venv from the source archive the component
# downloaded (the CDK asset of the repository), and the environment every login gets.
# Reads: SCALETRAIN_VENV, SCALETRAIN_SRC, SCALETRAIN_SOURCE_ZIP, SCALETRAIN_PROFILE, SCALETRAIN_BIN_PATH and
# SCALETRAIN_LIB_PATH (PATH and LD_LIBRARY_PATH for login shells, from ami/paths.py).
set -euo pipefail
: "${SCALETRAIN_VENV:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_SRC:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_SOURCE_ZIP:?set by the Image Builder component}"
: "${SCALETRAIN_PROFILE:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_BIN_PATH:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_LIB_PATH:?set by the Image Builder component from ami/paths.py}"
PY="$SCALETRAIN_VENV/bin/python"

profile() {
    cat <<PROFILE
export PATH="$SCALETRAIN_BIN_PATH:\$PATH"
export LD_LIBRARY_PATH="$SCALETRAIN_LIB_PATH\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
PROFILE
}

# torch and horovod exactly as pytorch.sh and horovod.sh installed them (`name==version`, local label included).
installed_pins() {
    "$PY" -I - <<'PYTHON'
import sys
from importlib.metadata import PackageNotFoundError, version

for name in ("torch", "horovod"):
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        sys.exit(f"error: {name} is not installed in {sys.prefix}; the pytorch and horovod components run first")
PYTHON
}

verify() {
    # training.train is what mpirun starts on every rank: torch, simplejpeg (the `train` extra) and the engines.
    # -I: the venv's own packages, never a checkout that happens to be the working directory.
    "$PY" -I -c 'import launcher.doctor.checks, training.train, horovod.torch' \
        || { echo "error: scaletrain's trainer does not import in $SCALETRAIN_VENV" >&2; return 1; }
    diff <(profile) "$SCALETRAIN_PROFILE" >/dev/null 2>&1 \
        || { echo "error: $SCALETRAIN_PROFILE does not set the image's PATH and LD_LIBRARY_PATH" >&2; return 1; }
}

install_() {
    local pins
    rm -rf "$SCALETRAIN_SRC"
    install -d -m 0755 "$SCALETRAIN_SRC"
    unzip -q -o "$SCALETRAIN_SOURCE_ZIP" -d "$SCALETRAIN_SRC"
    # The `train` extra (pyproject.toml) names torch and horovod too, but they are already here as no index
    # could give them again: torch from the CUDA wheel index (pytorch.sh), horovod built from its sdist with NCCL
    # and the C++17 fix (horovod.sh). A constraints file pinning both at exactly what is installed lets pip
    # install the rest of the extra from PyPI and keep those two, or fail; it can never swap in PyPI's torch or
    # rebuild horovod without NCCL (pip "Constraints Files":
    # https://pip.pypa.io/en/stable/user_guide/#constraints-files).
    pins=$(mktemp)
    installed_pins >"$pins"
    "$PY" -m pip install --quiet --constraint "$pins" "${SCALETRAIN_SRC}[train]"
    diff "$pins" <(installed_pins) >&2 \
        || { echo "error: installing scaletrain[train] changed torch or horovod" >&2; rm -f "$pins"; return 1; }
    rm -f "$pins"
    install -d -m 0755 "$(dirname "$SCALETRAIN_PROFILE")"
    profile >"$SCALETRAIN_PROFILE"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
