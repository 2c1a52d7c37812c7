#!/usr/bin/env bash
# Rehearsal nodes only (launcher/plans/rehearsal.py runs this where the recipe runs efa.sh, which skips itself
# there): Debian's Open MPI, put where the EFA installer puts its own, SCALETRAIN_MPI_PREFIX (/opt/amazon/openmpi),
# and taken off every other path. On the image, mpirun and orted are in /opt/amazon/openmpi/bin and nowhere on a
# non-login shell's PATH ("The EFA installer ... installs Open MPI to /opt/amazon/openmpi",
# https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start.html); so here, and a launcher that runs a bare
# `mpirun` or forgets `--prefix` fails on these nodes as it would on EC2.
# The libraries stay in Debian's directory (Horovod links libmpi.so.40 from there); $PREFIX/lib and $PREFIX/share
# lead to /usr's so that an orted started with OPAL_PREFIX=$PREFIX (mpirun --prefix) finds its components and help
# files under the prefix it was given.
set -euo pipefail
: "${SCALETRAIN_MPI_PREFIX:?set by launcher/plans/rehearsal.py from ami/paths.py}"
[ "${SCALETRAIN_REHEARSAL:-0}" = 1 ] || { echo "error: $0 builds rehearsal nodes only" >&2; exit 2; }
export DEBIAN_FRONTEND=noninteractive
PREFIX=$SCALETRAIN_MPI_PREFIX

verify() {
    "$PREFIX/bin/mpirun" --version | grep -q "Open MPI" \
        || { echo "error: no Open MPI at $PREFIX/bin/mpirun" >&2; return 1; }
    test -x "$PREFIX/bin/orted" || { echo "error: no orted at $PREFIX/bin" >&2; return 1; }
    if PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin command -v mpirun >/dev/null; then
        echo "error: mpirun is on the default PATH; on the image it is only in $PREFIX/bin" >&2; return 1
    fi
}

install_() {
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq openmpi-bin libopenmpi-dev >/dev/null
    install -d -m 0755 "$PREFIX/bin"
    # Every program of the package, as a file (Debian's mpirun is a chain of alternatives links to orterun).
    for f in $(dpkg -L openmpi-bin libopenmpi-dev | grep -E '^/usr/bin/[^/]+$'); do
        [ -e "$f" ] || continue
        cp -L "$f" "$PREFIX/bin/$(basename "$f")"
    done
    ln -sfn orterun "$PREFIX/bin/mpirun"
    ln -sfn orterun "$PREFIX/bin/mpiexec"
    for name in mpirun mpiexec mpicc mpicxx mpic++ mpif77 mpif90 mpifort; do
        update-alternatives --quiet --remove-all "$name" 2>/dev/null || true
    done
    update-alternatives --quiet --remove-all mpi 2>/dev/null || true
    for f in $(dpkg -L openmpi-bin libopenmpi-dev | grep -E '^/usr/bin/[^/]+$'); do rm -f "$f"; done
    rm -f /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/mpicc /usr/bin/mpicxx /usr/bin/mpic++
    ln -sfn /usr/lib "$PREFIX/lib"
    ln -sfn /usr/share "$PREFIX/share"
    ln -sfn /etc "$PREFIX/etc"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
