#!/usr/bin/env bash
# The image's test phase, on an instance started from the new image: GPUs visible, the EFA provider where the
# instance has EFA devices, Horovod built with NCCL, and a one-node NCCL allreduce with correct results.
# Reads: SCALETRAIN_BIN_PATH, SCALETRAIN_LIB_PATH, SCALETRAIN_NCCL_TESTS_ROOT (ami/paths.py).
set -euo pipefail
: "${SCALETRAIN_BIN_PATH:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_LIB_PATH:?set by the Image Builder component from ami/paths.py}"
: "${SCALETRAIN_NCCL_TESTS_ROOT:?set by the Image Builder component from ami/paths.py}"
export PATH="$SCALETRAIN_BIN_PATH:$PATH"
export LD_LIBRARY_PATH="$SCALETRAIN_LIB_PATH"

gpus=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
[ "$gpus" -ge 1 ] || { echo "error: nvidia-smi lists no GPU" >&2; exit 1; }
echo "GPUs: $gpus"

if compgen -G '/sys/class/infiniband/*' >/dev/null; then
    # grep without -q reads all of fi_info's output: under pipefail an early exit could fail it with SIGPIPE.
    fi_info -p efa -t FI_EP_RDM | grep 'provider: efa' >/dev/null \
        || { echo "error: EFA devices present but fi_info -p efa finds no provider" >&2; exit 1; }
    echo "EFA: $(find /sys/class/infiniband -mindepth 1 -maxdepth 1 | wc -l) device(s)"
else
    echo "EFA: no devices on this instance type, fi_info check skipped"
fi

build=$(horovodrun --check-build)
grep -q '\[X\] NCCL' <<<"$build" || { echo "error: Horovod was built without NCCL:" >&2; echo "$build" >&2; exit 1; }

out=$("$SCALETRAIN_NCCL_TESTS_ROOT/build/all_reduce_perf" -b 8 -e 64M -f 2 -g "$gpus")
echo "$out" | tail -n 4
grep -q 'Out of bounds values : 0 OK' <<<"$out" || { echo "error: the NCCL allreduce returned wrong values" >&2; exit 1; }
