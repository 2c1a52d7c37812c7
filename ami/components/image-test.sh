#!/usr/bin/env bash
# The image's test phase, on an instance started from the new image: GPUs visible, Fabric Manager running at the
# driver's version where the host has NVSwitches, the EFA provider where the instance has EFA devices, Horovod
# built with NCCL, PyTorch with kernels for every GPU this build is published for and a kernel run on this one, and
# a one-node NCCL allreduce with correct results.
# Reads: SCALETRAIN_BIN_PATH, SCALETRAIN_LIB_PATH, SCALETRAIN_NCCL_TESTS_ROOT, SCALETRAIN_VENV (ami/paths.py) and
# SCALETRAIN_GPU_CAPABILITIES (the catalog's compute capabilities for this build's kernel modules, ami/render.py).
set -euo pipefail
# Rehearsal nodes (`launch local up`, launcher/plans/rehearsal.py) skip this layer: it needs GPUs and EFA devices.
if [ "${SCALETRAIN_REHEARSAL:-0}" = 1 ]; then echo "image-test.sh: skipped on a rehearsal node"; exit 0; fi
: "${SCALETRAIN_BIN_PATH:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_LIB_PATH:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_NCCL_TESTS_ROOT:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_VENV:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_GPU_CAPABILITIES:?set by the Image Builder component from infra/catalog.py}"
export PATH="$SCALETRAIN_BIN_PATH:$PATH"
export LD_LIBRARY_PATH="$SCALETRAIN_LIB_PATH"

gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
[ "$gpus" -ge 1 ] || { echo "error: nvidia-smi lists no GPU" >&2; exit 1; }
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader | awk 'NR == 1')
# Persistence mode on every GPU: nvidia.sh enables the persistence daemon, which keeps the GPUs initialised between
# processes (NVIDIA, "Driver Persistence"); without it every CUDA process and every nvidia-smi of the health checks
# initialises all of them again. `nvidia-smi -q` reports it for each GPU ("Persistence Mode : Enabled").
persistence=$(nvidia-smi -q | awk -F: '/^[[:space:]]*Persistence Mode[[:space:]]*:/ {
                                           gsub(/^[[:space:]]+|[[:space:]]+$/, "", $2); print $2}')
persistent=$(grep -cx Enabled <<<"$persistence" || true)
[ "$persistent" -eq "$gpus" ] \
    || { echo "error: persistence mode is on for $persistent of $gpus GPUs (nvidia-smi -q): nvidia-persistenced is" \
              "not running (systemctl status nvidia-persistenced)" >&2; exit 1; }
echo "GPUs: $gpus, driver $driver, persistence mode on"

# NVSwitches: the PCI ids AWS ParallelCluster counts to decide a host needs Fabric Manager, 10de:1af1 on P4d/P4de
# (A100) and 10de:22a3 on P5/P5e/P5en (H100/H200) (aws/aws-parallelcluster-cookbook,
# resources/fabric_manager/partial/_fabric_manager_common.rb, get_nvswitches). There CUDA does not initialise until
# Fabric Manager, at exactly the driver's version, has set up the fabric (NVIDIA Fabric Manager User Guide,
# https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html).
nvswitches=$(( $(lspci -d 10de:1af1 | wc -l) + $(lspci -d 10de:22a3 | wc -l) ))
if [ "$nvswitches" -gt 0 ]; then
    systemctl is-active --quiet nvidia-fabricmanager \
        || { echo "error: $nvswitches NVSwitch(es) but nvidia-fabricmanager is not running: CUDA cannot" \
                  "initialise on this host (systemctl status nvidia-fabricmanager)" >&2; exit 1; }
    fm=$(nv-fabricmanager -v | awk '/[Vv]ersion/ {v = $NF} END {print v}')
    [ "$fm" = "$driver" ] \
        || { echo "error: Fabric Manager $fm with driver $driver: they must be the same version" >&2; exit 1; }
    # Hopper and later report the GPU's fabric registration in `nvidia-smi -q` (Fabric: State Completed, Status
    # Success); it is In Progress for a moment after Fabric Manager starts.
    fabric_states() {
        nvidia-smi -q | awk '/^[[:space:]]*Fabric[[:space:]]*$/ {f = 1; next}
                             f && /^[[:space:]]*State[[:space:]]*:/ {sub(/^[^:]*:[[:space:]]*/, ""); print; f = 0}'
    }
    for _ in $(seq 1 60); do
        states=$(fabric_states)
        grep -qE '^(In Progress|Not Started)' <<<"$states" || break
        sleep 2
    done
    if grep -qE '^(In Progress|Not Started)' <<<"$states"; then
        echo "error: GPUs have not joined the NVSwitch fabric (nvidia-smi -q, Fabric State):" >&2
        sort <<<"$states" | uniq -c >&2
        exit 1
    fi
    echo "NVSwitches: $nvswitches, Fabric Manager $fm running"
else
    echo "NVSwitches: none on this instance type, Fabric Manager check skipped"
fi

if compgen -G '/sys/class/infiniband/*' >/dev/null; then
    # grep without -q reads all of fi_info's output: under pipefail an early exit could fail it with SIGPIPE.
    fi_info -p efa -t FI_EP_RDM | grep 'provider: efa' >/dev/null \
        || { echo "error: EFA devices present but fi_info -p efa finds no provider" >&2; exit 1; }
    echo "EFA: $(find /sys/class/infiniband -mindepth 1 -maxdepth 1 | wc -l) device(s)"
else
    echo "EFA: no devices on this instance type, fi_info check skipped"
fi

# The build instance is a G type (ami/stack.py), not the P type a cluster boots this image on: its own GPU runs a
# kernel, and torch's arch list must serve every compute capability of the catalog's types that resolve this build
# (V100's 7.0 for the proprietary one), or those nodes fail with "no kernel image is available" after the test passed.
needs=()
for cc in $SCALETRAIN_GPU_CAPABILITIES; do needs+=(--need "$cc"); done
"$SCALETRAIN_VENV/bin/python" -I -m launcher.doctor.torchprobe "${needs[@]}" --what "the GPUs this image is for" \
    || { echo "error: the image's PyTorch cannot run on the GPUs it is built for (above)" >&2; exit 1; }

build=$(horovodrun --check-build)
grep -q '\[X\] NCCL' <<<"$build" || { echo "error: Horovod was built without NCCL:" >&2; echo "$build" >&2; exit 1; }

out=$("$SCALETRAIN_NCCL_TESTS_ROOT/build/all_reduce_perf" -b 8 -e 64M -f 2 -g "$gpus")
echo "$out" | tail -n 4
grep -q 'Out of bounds values : 0 OK' <<<"$out" || { echo "error: the NCCL allreduce returned wrong values" >&2; exit 1; }
