#!/usr/bin/env bash
# Base packages, the kernel held (the NVIDIA, Lustre and BeeGFS modules are built for it), the compiler that kernel
# was built with, and the image's record of its versions in SCALETRAIN_IMAGE_ENV_FILE (/etc/scaletrain/image.env;
# launch doctor reads it).
# Reads: SCALETRAIN_IMAGE_ENV (every pinned version and path, KEY=VALUE lines, from ami/versions.json and
# ami/paths.py), SCALETRAIN_IMAGE_ENV_FILE (where it goes) and SCALETRAIN_KERNEL_CC_FILE (where the kernel's compiler,
# e.g. gcc-12, is recorded for the components that build kernel modules).
set -euo pipefail
: "${SCALETRAIN_IMAGE_ENV:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_IMAGE_ENV_FILE:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_KERNEL_CC_FILE:?set by the Image Builder component from ami/paths.py}"
export DEBIAN_FRONTEND=noninteractive
RECORD=$SCALETRAIN_IMAGE_ENV_FILE
# The running kernel's version banner names the compiler that built it (proc(5), /proc/version). The tests point this
# at recorded banners.
KERNEL_BANNER=${SCALETRAIN_KERNEL_VERSION_FILE:-/proc/version}

# kernel_cc: the gcc package that built a kernel, from its version banner on stdin. Out-of-tree modules (the NVIDIA
# driver, EFA, BeeGFS) must be built with it: Ubuntu 22.04's 6.8 AWS kernels are built with gcc-12, e.g.
#   Linux version 6.8.0-1063-aws (buildd@lcy02-amd64-060) (x86_64-linux-gnu-gcc-12 (Ubuntu 12.3.0-1ubuntu1~22.04.3)
#   12.3.0, GNU ld (GNU Binutils for Ubuntu) 2.38) #66~22.04.1-Ubuntu SMP ...
# while build-essential installs gcc-11 (5.15's compiler), and NVIDIA's installer refuses a compiler whose major and
# minor differ from the kernel's ("It is recommended to set the CC environment variable to the compiler that was used
# to compile the kernel"). AWS ParallelCluster builds the driver the same way: "On Ubuntu22, install the NVIDIA driver
# using the gcc version used to compile the kernel" (https://github.com/aws/aws-parallelcluster-cookbook/pull/2852).
# The version is the first X.Y.Z after "gcc" (older banners say "gcc version 7.5.0 (Ubuntu ...)").
kernel_cc() {
    local banner rest
    banner=$(cat)
    case "$banner" in
        *gcc*) rest=${banner#*gcc} ;;
        *) echo "error: the kernel was not built with gcc: ${banner:0:160}" >&2; return 1 ;;
    esac
    if [[ $rest =~ ([0-9]+)\.[0-9]+\.[0-9]+ ]]; then
        echo "gcc-${BASH_REMATCH[1]}"
    else
        echo "error: no gcc version in the kernel's banner: ${banner:0:160}" >&2
        return 1
    fi
}

# The kernel's headers, DKMS and the kernel's compiler, for the modules built below. Rehearsal nodes
# (launcher/plans/rehearsal.py) run on the launcher's kernel and build no modules: they skip these, and only these.
KERNEL_CC=""
KERNEL_PACKAGES=()
if [ "${SCALETRAIN_REHEARSAL:-0}" != 1 ] && [ "${1:-build}" != kernel-cc ]; then
    KERNEL_CC=$(kernel_cc <"$KERNEL_BANNER")
    KERNEL_PACKAGES=(dkms "linux-headers-$(uname -r)" "$KERNEL_CC")
fi

verify() {
    test -s "$RECORD" || { echo "error: $RECORD is missing" >&2; return 1; }
    diff <(printf '%s\n' "$SCALETRAIN_IMAGE_ENV") "$RECORD" >/dev/null \
        || { echo "error: $RECORD differs from the versions this component pins" >&2; return 1; }
    dpkg -s build-essential "${KERNEL_PACKAGES[@]}" >/dev/null
    if [ -n "$KERNEL_CC" ]; then
        [ "$(cat "$SCALETRAIN_KERNEL_CC_FILE" 2>/dev/null)" = "$KERNEL_CC" ] \
            || { echo "error: $SCALETRAIN_KERNEL_CC_FILE does not name $KERNEL_CC, the compiler kernel $(uname -r)" \
                      "was built with" >&2; return 1; }
    fi
}

install_() {
    apt-get update -qq
    apt-get install -y -qq build-essential "${KERNEL_PACKAGES[@]}" curl ca-certificates gnupg unzip \
        python3-venv python3-dev git chrony jq pciutils >/dev/null
    # The kernel modules built below match this kernel only: hold it so an upgrade cannot strand them.
    if [ "${#KERNEL_PACKAGES[@]}" -gt 0 ]; then
        apt-mark hold "linux-image-$(uname -r)" "linux-headers-$(uname -r)" >/dev/null
        for meta in linux-aws linux-image-aws linux-headers-aws; do
            if dpkg -s "$meta" >/dev/null 2>&1; then apt-mark hold "$meta" >/dev/null; fi
        done
        install -d -m 0755 "$(dirname "$SCALETRAIN_KERNEL_CC_FILE")"
        echo "$KERNEL_CC" >"$SCALETRAIN_KERNEL_CC_FILE"
    fi
    install -d -m 0755 "$(dirname "$RECORD")"
    printf '%s\n' "$SCALETRAIN_IMAGE_ENV" >"$RECORD"
}

case "${1:-build}" in
    build) verify 2>/dev/null || install_; verify ;;
    validate) verify ;;
    kernel-cc) kernel_cc <"$KERNEL_BANNER" ;;
    *) echo "usage: $0 [build|validate|kernel-cc]" >&2; exit 2 ;;
esac
