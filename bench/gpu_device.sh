#!/usr/bin/env bash
# One device-machine call: the trainer measured (bench/gpu.py, with the input pipeline table of bench/gpudecode.py)
# and the CUDA tests (tests/test_gpu.py, tests/test_gpudecode.py), everything logged under $OUT.
#
# Here, once (the wheels the trainer needs beyond the device image's torch, torchvision, numpy and pillow; /.whl/ is
# git-ignored): the `pip download` line in bench/gpu.py's docstring. Then, through the device tool, carry [".whl"]:
#
#     bash bench/gpu_device.sh [BENCH_BUDGET_S] [TEST_TIMEOUT_S] [PYTEST_K]
#
# BENCH_BUDGET_S (default 240): bench rows that would start later are skipped (the --compile row is last);
# TEST_TIMEOUT_S (default 170): the tests' wall-clock limit. Both keep the call inside the device's time.
# PYTEST_K: only the tests pytest's -k selects, their output shown (-s).
set -u
out=${OUT:-/tmp/scaletrain-gpu-device}
mkdir -p "$out"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,power.limit --format=csv | tee "$out/gpu.csv"
python3 -c 'import torch, torchvision; print("torch", torch.__version__, "torchvision", torchvision.__version__,
            "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version())' | tee -a "$out/gpu.csv"
set -o pipefail
python3 bench/gpu.py --budget "${1:-240}" 2>&1 | tee "$out/bench.log"
echo "bench/gpu.py: exit $?"
timeout "${2:-170}" python3 -m pytest -q -p no:cacheprovider --noconftest -rs ${3:+-s -k "$3"} tests/test_gpu.py \
    tests/test_gpudecode.py 2>&1 \
    | tee "$out/tests.log" | tail -25
echo "tests: exit $?"
tail -8 "$out/bench.log"
