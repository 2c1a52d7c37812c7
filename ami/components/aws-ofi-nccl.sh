#!/usr/bin/env bash
# aws-ofi-nccl, the NCCL net plugin that carries NCCL over libfabric's EFA provider, built from its release
# tarball into SCALETRAIN_OFI_NCCL_PREFIX against the EFA installer's libfabric and Open MPI: the one plugin on the
# image, at the version ami/versions.json pins.
#
# The EFA installer ships a plugin of its own (its libnccl-ofi package; a DLAMI base may carry another), and NCCL
# loads whichever libnccl-net*.so the library search path finds first (it dlopens the plugin by name: NCCL User
# Guide, "Environment Variables", NCCL_NET_PLUGIN, https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html).
# So every other copy NCCL could find (the loader's cache, the image's LD_LIBRARY_PATH, under the prefix) goes before
# this one is built: a packaged one with its package (dpkg --purge, which refuses if anything depends on it), a loose
# one as a file; validate fails if any other remains. launch doctor then reads which one NCCL loaded
# (launcher/doctor/ncclnet.py).
# Reads: AWS_OFI_NCCL_VERSION; SCALETRAIN_OFI_NCCL_PREFIX, SCALETRAIN_EFA_PREFIX, SCALETRAIN_MPI_PREFIX,
# SCALETRAIN_CUDA_HOME and SCALETRAIN_LIB_PATH (the image's library path; ami/paths.py).
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs the EFA installer's libfabric and CUDA.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "aws-ofi-nccl.sh: skipped on a rehearsal node"; exit 0; fi
: "${AWS_OFI_NCCL_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_OFI_NCCL_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_EFA_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_MPI_PREFIX:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_CUDA_HOME:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_LIB_PATH:?set by the Image Builder component from ami/paths.py}"
export DEBIAN_FRONTEND=noninteractive
PREFIX=$SCALETRAIN_OFI_NCCL_PREFIX

# Every NCCL net plugin library NCCL could load, one path a line: what the loader's cache knows (ldconfig -p), what
# the image's library path holds, and anything under the prefix (the EFA installer's package puts its copy below it).
plugins() {
    {
        ldconfig -p 2>/dev/null | awk '$1 ~ /^libnccl-net/ {print $NF}'
        local dir
        local -a dirs
        IFS=: read -r -a dirs <<<"$SCALETRAIN_LIB_PATH"
        for dir in "${dirs[@]}"; do
            find "$dir" -maxdepth 1 -name 'libnccl-net*.so*' 2>/dev/null
        done
        find "$PREFIX" -name 'libnccl-net*.so*' 2>/dev/null
    } | sort -u || true
}

# The package that installed a file, or nothing (dpkg -S: "package: /path").
owner() {
    { dpkg -S "$1" 2>/dev/null || true; } | awk -F': ' 'NR == 1 {print $1}'
}

# The plugins that are not this build's: packaged ones anywhere, loose ones outside $PREFIX/lib.
others() {
    local path
    while read -r path; do
        [ -n "$path" ] || continue
        if [ -n "$(owner "$path")" ] || [ "$(dirname "$path")" != "$PREFIX/lib" ]; then echo "$path"; fi
    done < <(plugins)
}

remove_others() {
    local path package
    local -a packages=()
    while read -r path; do
        package=$(owner "$path")
        if [ -n "$package" ]; then
            case " ${packages[*]} " in *" $package "*) ;; *) packages+=("$package") ;; esac
        else
            echo "aws-ofi-nccl.sh: removing $path, a plugin NCCL could load instead of $AWS_OFI_NCCL_VERSION"
            rm -f "$path"
        fi
    done < <(others)
    if [ "${#packages[@]}" -gt 0 ]; then
        echo "aws-ofi-nccl.sh: purging ${packages[*]}, a plugin NCCL could load instead of $AWS_OFI_NCCL_VERSION"
        dpkg --purge "${packages[@]}" >/dev/null
    fi
}

verify() {
    local path extra
    grep -qx "$AWS_OFI_NCCL_VERSION" "$PREFIX/VERSION" 2>/dev/null \
        || { echo "error: aws-ofi-nccl $AWS_OFI_NCCL_VERSION is not installed in $PREFIX" >&2; return 1; }
    ls "$PREFIX"/lib/libnccl-net*.so >/dev/null \
        || { echo "error: no libnccl-net plugin in $PREFIX/lib" >&2; return 1; }
    # The plugin logs "Initializing " PACKAGE_STRING when NCCL loads it, so its library carries that text.
    for path in "$PREFIX"/lib/libnccl-net*.so; do
        grep -aq "Initializing aws-ofi-nccl $AWS_OFI_NCCL_VERSION" "$path" \
            || { echo "error: $path is not aws-ofi-nccl $AWS_OFI_NCCL_VERSION" >&2; return 1; }
    done
    extra=$(others)
    if [ -n "$extra" ]; then
        echo "error: other aws-ofi-nccl plugins NCCL could load instead of $PREFIX/lib's: ${extra//$'\n'/ }" >&2
        return 1
    fi
}

install_() {
    local work v=$AWS_OFI_NCCL_VERSION
    remove_others
    # The plugin's build requirements are libfabric (the EFA installer's) and hwloc: "To build the plugin, you
    # need to have Libfabric and HWLOC installed prior to build" (aws-ofi-nccl README.md, "Basic Requirements",
    # https://github.com/aws/aws-ofi-nccl#basic-requirements); configure stops without hwloc.h and libhwloc
    # (m4/check_pkg_hwloc.m4). Ubuntu ships both in libhwloc-dev.
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq libhwloc-dev >/dev/null
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
