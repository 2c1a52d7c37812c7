#!/usr/bin/env bash
# NVIDIA driver (DKMS, so it is rebuilt for a new kernel) and the CUDA toolkit. Not part of the recipe on a
# base that ships a driver (the Deep Learning Base AMI); see ami/render.py.
# Fabric Manager, which NVSwitch hosts need at exactly this driver's version, is the next component
# (fabricmanager.sh), which also runs on a base that brought its own driver.
# Reads: NVIDIA_DRIVER_VERSION, NVIDIA_KERNEL_MODULE_TYPE (open|proprietary), CUDA_VERSION, CUDA_APT_PACKAGE;
# SCALETRAIN_CUDA_HOME and SCALETRAIN_KERNEL_CC_FILE (ami/paths.py: the compiler the kernel was built with, which
# base.sh read from the kernel and installed).
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs a GPU and NVIDIA's driver repository.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "nvidia.sh: skipped on a rehearsal node"; exit 0; fi
: "${NVIDIA_DRIVER_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${NVIDIA_KERNEL_MODULE_TYPE:?set by the Image Builder component (open or proprietary)}"
: "${CUDA_VERSION:?set by the Image Builder component from ami/versions.json}"
: "${CUDA_APT_PACKAGE:?set by the Image Builder component from ami/versions.json}"
: "${SCALETRAIN_CUDA_HOME:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_KERNEL_CC_FILE:?set by the Image Builder component from ami/paths.py}"
export DEBIAN_FRONTEND=noninteractive
CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64
PERSISTENCED=nvidia-persistenced.service
# Where the runfile puts its documentation; its samples are in sample/ or samples/ below, by driver version.
NVIDIA_DOCS=/usr/share/doc/NVIDIA_GLX-1.0

verify_driver() {
    local built
    built=$(modinfo -F version nvidia 2>/dev/null) \
        || { echo "error: no nvidia kernel module for kernel $(uname -r)" >&2; return 1; }
    [ "$built" = "$NVIDIA_DRIVER_VERSION" ] \
        || { echo "error: nvidia module $built, expected $NVIDIA_DRIVER_VERSION" >&2; return 1; }
    "$SCALETRAIN_CUDA_HOME/bin/nvcc" --version | grep "release ${CUDA_VERSION%.*}," >/dev/null \
        || { echo "error: nvcc is not CUDA ${CUDA_VERSION%.*}" >&2; return 1; }
}

persistence_enabled() {
    command -v systemctl >/dev/null || return 0
    systemctl is-enabled --quiet "$PERSISTENCED" \
        || { echo "error: $PERSISTENCED is not enabled at boot: every CUDA process and nvidia-smi would" \
                  "initialise the GPUs again" >&2; return 1; }
}

verify() {
    verify_driver && persistence_enabled
}

install_() {
    local work kernel_cc
    work=$(mktemp -d)
    curl -fsSL -o "$work/driver.run" \
        "https://us.download.nvidia.com/tesla/${NVIDIA_DRIVER_VERSION}/NVIDIA-Linux-x86_64-${NVIDIA_DRIVER_VERSION}.run"
    # The installer builds the module with $CC and refuses one whose version is not the kernel's ("Compiler version
    # check failed ... It is recommended to set the CC environment variable to the compiler that was used to compile
    # the kernel"): base.sh recorded which (gcc-12 on Ubuntu 22.04's 6.8 kernels; build-essential's gcc is 11).
    # AWS ParallelCluster builds the driver with CC set the same way
    # (https://github.com/aws/aws-parallelcluster-cookbook/pull/2852).
    kernel_cc=$(cat "$SCALETRAIN_KERNEL_CC_FILE") \
        || { echo "error: $SCALETRAIN_KERNEL_CC_FILE is missing; the base component records the kernel's compiler" >&2
             return 1; }
    CC="$kernel_cc" sh "$work/driver.run" --silent --dkms --no-questions \
        --kernel-module-type="$NVIDIA_KERNEL_MODULE_TYPE"
    curl -fsSL -o "$work/cuda-keyring.deb" "$CUDA_REPO/cuda-keyring_1.1-1_all.deb"
    dpkg -i "$work/cuda-keyring.deb" >/dev/null
    apt-get update -o DPkg::Lock::Timeout=600 -qq
    # The toolkit only: the driver above is the runfile's, so the repo's driver packages stay out.
    apt-get install -o DPkg::Lock::Timeout=600 -y -qq --no-install-recommends \
        "${CUDA_APT_PACKAGE}=${CUDA_VERSION}-1" >/dev/null
    apt-mark hold "$CUDA_APT_PACKAGE" >/dev/null
    ln -sfn "/usr/local/cuda-${CUDA_VERSION%.*}" "$SCALETRAIN_CUDA_HOME"
    echo "$SCALETRAIN_CUDA_HOME/lib64" >/etc/ld.so.conf.d/000-cuda.conf
    ldconfig
    rm -rf "$work"
}

# The NVIDIA persistence daemon, enabled at boot. Without it the driver tears a GPU's state down when its last client
# exits, and every CUDA process and every nvidia-smi (launch doctor's, the health checks') initialises all the GPUs
# again, seconds each on an 8-GPU host. NVIDIA: the daemon is the way to keep them initialised, persistence mode set
# through nvidia-smi being the legacy one (Driver Persistence, https://docs.nvidia.com/deploy/driver-persistence/);
# AWS too (Amazon EC2 User Guide, "Optimize GPU settings on Amazon EC2 instances"), and its ECS GPU AMI enables it
# (https://github.com/aws/amazon-ecs-ami/pull/147). A runfile driver brings the
# daemon but its unit only as a sample, "the compressed tarball .../nvidia-persistenced-init.tar.bz2" (nvidia-
# persistenced(1), INSTALLATION), whose install.sh creates the daemon's user, installs the systemd unit, enables and
# starts it, and fails if it does not start (NVIDIA/nvidia-persistenced, init/). The daemon starts with persistence
# mode on for every GPU (nvidia-persistenced(1), --persistence-mode). Where there is no systemctl there is no unit to
# enable (install.sh looks for it the same way); image-test.sh checks the mode on every GPU of a booted instance.
persistence_daemon() {
    local tarball work
    command -v systemctl >/dev/null || { echo "nvidia.sh: no systemctl: no persistence daemon unit"; return 0; }
    if ! systemctl cat "$PERSISTENCED" >/dev/null 2>&1; then
        tarball=$(compgen -G "$NVIDIA_DOCS/sample*/nvidia-persistenced-init.tar.bz2" | head -n 1) \
            || { echo "error: no $NVIDIA_DOCS/samples/nvidia-persistenced-init.tar.bz2 from the driver" >&2; return 1; }
        work=$(mktemp -d)
        tar -xjf "$tarball" -C "$work" || return 1
        bash "$work/nvidia-persistenced-init/install.sh" systemd || return 1
        rm -rf "$work"
    fi
    systemctl enable "$PERSISTENCED"
}

case "${1:-build}" in
    build) verify_driver 2>/dev/null || install_; persistence_enabled 2>/dev/null || persistence_daemon; verify ;;
    validate) verify ;;
    *) echo "usage: $0 [build|validate]" >&2; exit 2 ;;
esac
