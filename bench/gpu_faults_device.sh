#!/usr/bin/env bash
# One device-machine call for what issue 34 built, on a real GPU: the progress recorder's CUDA-event phases and its
# overhead (bench/progress.py --device cuda), the checkpoint stall with the state on the GPU (pinned asynchronous
# copies against pageable ones: bench/checkpoint_stall.py --device cuda), and the CUDA tests (tests/test_gpu.py: the
# recorder's and the checkpoint copy's own first, then the trainer's), everything logged under $OUT.
#
# Carry [".whl"] (the wheels bench/gpu.py's docstring names), then:
#     bash bench/gpu_faults_device.sh [TEST_TIMEOUT_S]
set -u
out=${OUT:-/tmp/scaletrain-gpu-device}
mkdir -p "$out"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max,pcie.link.width.max --format=csv \
    | tee "$out/gpu.csv"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_arch_list())' \
    | tee -a "$out/gpu.csv"
set -o pipefail
python3 bench/progress.py --device cuda --steps 30 --rounds 3 2>&1 | tee "$out/progress.log"
echo "bench/progress.py: exit $?"
python3 bench/checkpoint_stall.py --device cuda --rounds 2 --saves 3 2>&1 | tee "$out/checkpoint.log"
echo "bench/checkpoint_stall.py: exit $?"
timeout "${1:-240}" python3 -m pytest -q -p no:cacheprovider --noconftest -rs -x \
    tests/test_gpu.py -k "phase_on_the_gpu or checkpoint_copy_is_pinned or doctors_torch_probe or flight_recorder" 2>&1 \
    | tee "$out/tests_new.log" | tail -15
echo "new tests: exit $?"
timeout "${1:-240}" python3 -m pytest -q -p no:cacheprovider --noconftest -rs tests/test_gpu.py \
    -k "not phase_on_the_gpu and not checkpoint_copy_is_pinned and not doctors_torch_probe and not flight_recorder" 2>&1 \
    | tee "$out/tests.log" | tail -15
echo "tests: exit $?"
