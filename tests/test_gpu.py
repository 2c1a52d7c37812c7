"""The trainer's CUDA path on one GPU: runs only where torch.cuda.is_available() (a device machine); skipped here.

Each run is `python -m training.train --engine ddp` with a world of one: DDP over NCCL through env:// on
127.0.0.1, as bench/gpu.py runs it (no Horovod or mpirun on the device machine). Covered: loss falls on real
shards read through the loader with pinned, non-blocking copies (fp16 + channels_last, bf16 + contiguous),
fp16 steps with an inf/nan gradient are skipped (static and dynamic loss scale), a checkpoint written on the GPU
resumes to the same parameters, --compile trains as eager does, the NCCL process group itself, and --decode gpu:
nvJPEG's batches against the CPU loader's (same samples, crops and flips) and a run that learns with it.

On the device machine, with the wheels bench/gpu.py's docstring names carried in .whl (bench/gpu_device.sh does
this and bench/gpu.py in one call):
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \\
        PYTHONPATH=/tmp/site python3 -m pytest -q -p no:cacheprovider --noconftest tests/test_gpu.py
(--noconftest: tests/conftest.py records AWS calls through botocore, which the device image lacks.)
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="needs an NVIDIA GPU (torch.cuda.is_available() is False): run on a device machine, see the docstring")

# Small and quick on one GPU; 4 classes of the sample data set at 64 px.
TINY = ["--model", "resnet18", "--image-size", "64", "--batch-per-gpu", "32", "--workers", "2",
        "--warmup-epochs", "0.5", "--lr-per-256", "0.8", "--log-every", "1", "--no-tensorboard"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def single_rank_env() -> dict[str, str]:
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": pythonpath, "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


def train(run: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "training.train", "--engine", "ddp", "--output", str(run), *args],
                          capture_output=True, text=True, env=single_rank_env(), cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def summary(run: Path) -> dict:
    return json.loads((run / "summary.json").read_text())


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def params(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "params-rank0.pt")


def epoch_losses(run: Path) -> list[float]:
    return [r["loss"] for r in metrics(run) if "epoch_time_s" in r]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from training.convert import convert
    from training.sample import make_sample

    root = tmp_path_factory.mktemp("gpu-data")
    make_sample(root / "raw", classes=4, per_class=64, val_per_class=16)
    convert(root / "raw", root / "shards", shard_size=32, workers=2)
    return root / "shards"


def test_ddp_process_group_is_nccl_with_one_rank(monkeypatch):
    from training.engine import DDPEngine

    for key, value in single_rank_env().items():
        monkeypatch.setenv(key, value)
    engine = DDPEngine(timeout_s=60)
    try:
        assert engine.backend == "nccl" and engine.dist.get_backend() == "nccl"
        assert (engine.rank, engine.size, engine.local_rank) == (0, 1, 0)
        total = engine.allreduce(torch.full((4,), 3.0, device="cuda"), "sum", name="t")
        assert total.is_cuda and total.tolist() == [3.0] * 4
        model, _ = engine.prepare(torch.nn.Linear(4, 2).cuda(), torch.optim.SGD([torch.zeros(1)], lr=0.1),
                                  fp16_allreduce=False, backward_passes_per_step=1)
        assert model.device_ids == [0]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("precision,memory_format", [("fp16", "auto"), ("bf16", "contiguous")])
def test_loss_falls_on_real_shards_read_with_pinned_copies(shards, tmp_path, precision, memory_format):
    run = tmp_path / "run"
    proc = train(run, "--data", str(shards), "--epochs", "4", *TINY, "--precision", precision,
                 "--memory-format", memory_format)
    s = summary(run)
    assert s["engine"] == "ddp" and s["device"] == torch.cuda.get_device_name(0) and s["precision"] == precision
    assert f"{precision}, cuda" in proc.stdout
    losses = epoch_losses(run)
    assert len(losses) == 4 and losses[-1] < losses[0] * 0.8, losses
    assert s["val_samples"] == 64 and s["top1"] > 0.25  # 4 classes: better than chance


def test_fp16_steps_with_inf_gradients_are_skipped(tmp_path):
    # A static scale so large that every fp16 gradient overflows: every step skipped, weights never move.
    run = tmp_path / "inf"
    train(run, "--synthetic", "--num-classes", "10", "--epochs", "1", "--steps-per-epoch", "6", *TINY,
          "--precision", "fp16", "--loss-scale", "1e30", "--dump-rank-params")
    assert summary(run)["skipped_steps"] == 6
    torch.manual_seed(0)
    from training.model import build_model

    initial = dict(build_model("resnet18", 10).named_parameters())
    final = params(run)
    assert all(torch.equal(final[k], initial[k].detach()) for k in final)

    # Dynamic scaling from 2**24: halved on each overflow, some steps skipped, the rest applied.
    run = tmp_path / "dynamic"
    train(run, "--synthetic", "--num-classes", "10", "--epochs", "1", "--steps-per-epoch", "20", *TINY,
          "--precision", "fp16", "--initial-loss-scale", str(2.0**24))
    scales = [r["loss_scale"] for r in metrics(run) if "loss_scale" in r]
    assert scales[0] < 2.0**24 and scales == sorted(scales, reverse=True)
    assert 0 < summary(run)["skipped_steps"] < 20


def test_a_gpu_checkpoint_resumes_to_the_same_parameters(tmp_path):
    args = ["--synthetic", "--num-classes", "10", "--epochs", "2", "--steps-per-epoch", "5", *TINY,
            "--precision", "fp16", "--dump-rank-params"]
    straight = tmp_path / "straight"
    train(straight, *args)
    # The interrupted run: only epoch 0's checkpoint survived; --resume continues with epoch 1.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(straight / "checkpoint-epoch000.pt", resumed)
    proc = train(resumed, *args, "--resume")
    assert "resuming from checkpoint-epoch000.pt: epoch 1, step 5" in proc.stdout

    def epoch1(run):
        return [(r["step"], r["lr"], r.get("loss_scale")) for r in metrics(run) if r["epoch"] == 1]
    assert epoch1(resumed) == epoch1(straight)  # same steps, learning rates and loss scale, exactly
    a, b = params(resumed), params(straight)
    start = torch.load(straight / "checkpoint-epoch000.pt", map_location="cpu", weights_only=False)["model"]

    def norm(tensors) -> float:
        return sum(float(t.double().norm()) ** 2 for t in tensors) ** 0.5

    # cuDNN's autotuned kernels (cudnn.benchmark picks per process) and atomics reorder float sums between two
    # processes, and 5 fp16 steps amplify that past elementwise tolerances (seen on an H200); but the two runs stay
    # far closer to each other than epoch 1 moved either, which a resume from the wrong state would not.
    apart, moved = norm(a[k] - b[k] for k in b), norm(b[k] - start[k] for k in b)
    worst = max(float((a[k] - b[k]).abs().max()) for k in b)
    print(f"resume on GPU: parameters {apart:.3g} apart (largest element {worst:.3g}), moved {moved:.3g} in epoch 1")
    assert moved > 1e-2 and apart < 0.05 * moved, (apart, worst, moved)


def test_compile_trains_as_eager_does_on_gpu(tmp_path):
    args = ["--synthetic", "--num-classes", "10", "--epochs", "1", "--steps-per-epoch", "8", *TINY,
            "--precision", "fp16"]
    train(tmp_path / "eager", *args)
    train(tmp_path / "compiled", *args, "--compile")
    eager = [r["loss"] for r in metrics(tmp_path / "eager") if "epoch_time_s" not in r]
    compiled = [r["loss"] for r in metrics(tmp_path / "compiled") if "epoch_time_s" not in r]
    assert compiled[0] == pytest.approx(eager[0], rel=1e-2)  # same weights, same batch: the same loss
    assert compiled[-1] < compiled[0]


def test_nvjpeg_batches_are_the_cpu_loaders_samples_crops_and_flips(shards):
    from training import gpudecode
    from training.loader import load_manifest, make_loader, shards_of

    device = torch.device("cuda", 0)
    train_shards = shards_of(load_manifest(shards), "train")
    kwargs = dict(seed=1, epoch=0, rank=0, workers=2)
    cpu = list(make_loader(shards, train_shards, 48, 16, True, **kwargs))
    batches = gpudecode.GpuBatches(make_loader(shards, train_shards, 48, 16, True, decode="gpu", **kwargs), 48, device)
    gpu = list(batches)
    assert len(gpu) == len(cpu) == 256 // 16
    same, flipped = [], []
    for (a, la), (b, lb) in zip(cpu, gpu, strict=True):
        assert b.is_cuda and lb.is_cuda and b.dtype == torch.uint8 and b.shape == a.shape == (16, 3, 48, 48)
        assert torch.equal(la, lb.cpu())
        b = b.cpu().float()
        same.append(float((a.float() - b).abs().mean()))
        flipped.append(float((a.float() - b.flip(3)).abs().mean()))
    # nvJPEG's IDCT and the CPU path's reduced, fast one differ by a few levels; a wrong crop or flip by tens.
    assert max(same) < 12 and sum(same) * 2 < sum(flipped), (same, flipped)


def test_nvjpeg_falls_back_to_the_cpu_for_what_it_refuses(tmp_path):
    import io

    from PIL import Image

    from training import gpudecode
    from training.loader import encoded_batch

    device = torch.device("cuda", 0)
    files = []
    for mode, fmt in (("RGB", "JPEG"), ("CMYK", "JPEG"), ("L", "JPEG"), ("RGB", "PNG")):  # ImageNet holds all four
        buf = io.BytesIO()
        Image.new(mode, (80, 60), 128 if mode == "L" else (200, 30, 30, 0)[: len(mode)]).save(buf, format=fmt)
        files.append(buf.getvalue())
    batch = encoded_batch([f"s.tar:k{i}" for i in range(4)], files, [(0, 0, 80, 60, 0)] * 4)
    images = gpudecode.decode_batch(batch, gpudecode.nvjpeg(device), device)
    assert [tuple(i.shape) for i in images] == [(3, 60, 80)] * 4 and all(i.is_cuda for i in images)
    out = gpudecode.crop_resize_flip(images, batch.geometry, 32)
    assert out.shape == (4, 3, 32, 32) and out.is_cuda


def test_loss_falls_with_decode_gpu(shards, tmp_path):
    run = tmp_path / "run"
    proc = train(run, "--data", str(shards), "--epochs", "4", *TINY, "--precision", "fp16", "--decode", "gpu")
    s = summary(run)
    assert "fp16, cuda" in proc.stdout
    losses = epoch_losses(run)
    assert len(losses) == 4 and losses[-1] < losses[0] * 0.8, losses
    assert s["val_samples"] == 64 and s["top1"] > 0.25


def test_a_phase_on_the_gpu_is_timed_by_its_kernels_not_where_the_host_waits(tmp_path):
    """training/progress.py on a real GPU: forward queues a second of matrix products and returns at once; the
    optimizer's phase is where the host waits for them (as GradScaler's inf check does). Recorded by CUDA events
    the second is forward's; by the host's clock (the recorder before events) it would be the optimizer's, and a
    slow GPU would be named for the wrong phase, or not at all (launcher/plans/stragglers.py compares forward)."""
    from launcher.plans import stragglers as sg
    from training.progress import Progress

    a = torch.randn(4096, 4096, device="cuda")
    a @ a  # cuBLAS's start, outside the calibration
    torch.cuda.synchronize()
    t0 = torch.cuda.Event(enable_timing=True)
    t1 = torch.cuda.Event(enable_timing=True)
    t0.record()
    for _ in range(10):
        a @ a
    t1.record()
    t1.synchronize()
    per_s = t0.elapsed_time(t1) / 10 / 1000.0
    reps = max(10, int(0.3 / per_s))  # about 0.3 s of kernels
    recorded = {}
    for how, device in (("events", torch.device("cuda")), ("host", None)):
        p = Progress(tmp_path / f"rank-0@{how}.tsv", device=device)
        for step in range(3):
            with p.phase("forward"):
                for _ in range(reps):
                    a @ a
            with p.phase("optimizer"):
                torch.cuda.synchronize()
            p.step_done(step)
        p.close()
        recorded[how] = [sg.parse(ln) for ln in (tmp_path / f"rank-0@{how}.tsv").read_text().splitlines()]
    assert [t.step for t in recorded["events"]] == [0, 1, 2]
    assert all(t.forward > 0.5 * reps * per_s and t.optimizer < 0.05 * t.forward for t in recorded["events"]), (
        reps * per_s, recorded["events"])
    # The contrast, so that this test shows what it guards: the host's clock puts the GPU's time in the optimizer.
    assert all(t.optimizer > 10 * t.forward for t in recorded["host"]), recorded["host"]


def test_a_gpu_checkpoint_copy_is_pinned_and_whole_when_the_writer_reads_it(tmp_path):
    """training/ckptwriter.py: GPU tensors are copied into pinned host memory asynchronously; the writer's thread
    waits for the copies before writing, and the training loop may change the GPU tensors at once."""
    from training.ckptwriter import CheckpointWriter, to_host

    state = {"model": {"w": torch.randn(4096, 4096, device="cuda")}, "step": 7}
    expected = state["model"]["w"].cpu()
    writer = CheckpointWriter(tmp_path)
    writer.save(state, tmp_path / "checkpoint-epoch000.pt")
    state["model"]["w"].mul_(0)  # the next optimizer step, queued after the copy
    writer.wait()
    saved = torch.load(tmp_path / "checkpoint-epoch000.pt", weights_only=True)
    assert torch.equal(saved["model"]["w"], expected) and saved["step"] == 7
    assert writer._spare["model"]["w"].is_pinned()
    devices: list = []
    again = to_host(state, writer._spare, devices)  # the pinned buffers are reused, not allocated again
    assert again["model"]["w"].data_ptr() == writer._spare["model"]["w"].data_ptr() and devices


def test_the_doctors_torch_probe_passes_on_this_gpu_and_names_a_capability_its_build_lacks():
    """launch doctor's torch-arch check (launcher/doctor/gpuarch.py) with its probe run by this machine's torch on a
    real GPU: the catalog's type with this GPU passes (arch list, capability, a kernel run); a capability the build
    has no kernels for (CUDA 13 builds dropped Volta's sm_70: a P3 node) fails naming it."""
    from infra import catalog
    from launcher.doctor.gpuarch import check_torch_arch, serving_entry
    from launcher.doctor.probes import TORCH_ARCH_PY, Probe

    proc = subprocess.run([sys.executable, "-c", TORCH_ARCH_PY], capture_output=True, text=True, timeout=300)
    probe = Probe(proc.stdout + proc.stderr, proc.returncode)
    mine = torch.cuda.get_device_capability(0)
    types = [t for t in catalog.gpu_types() if t.compute_capability == mine]
    assert types, f"no catalog type has compute capability {mine}"
    got = check_torch_arch(probe, [mine], what=types[0].name)
    assert got.status == "ok", got
    arch_list = torch.cuda.get_arch_list()
    lacking = [t for t in catalog.gpu_types() if serving_entry(arch_list, t.compute_capability) is None]
    for t in lacking[:1]:
        got = check_torch_arch(probe, [t.compute_capability], what=t.name)
        cc = f"{t.compute_capability[0]}.{t.compute_capability[1]}"
        assert got.status == "fail" and f"no kernels for compute capability {cc}" in got.detail, got


NCCL_RANK = r"""
import os, torch, torch.distributed as dist
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
x = torch.ones(1024, device="cuda")
for _ in range(3):
    dist.all_reduce(x)
torch.cuda.synchronize()
print("ready", flush=True)
import time
time.sleep(120)
"""


def test_a_gpu_ranks_flight_recorder_is_dumped_through_its_pipe_and_summarised(tmp_path):
    """launcher/plans/flightrec.py's settings on a real NCCL process group: the watchdog makes the pipe, a write to it
    (launcher/execute/stacks.poke_recorder, as the job's step does for a stalled run) dumps the recorder, and the
    summary names the newest collective."""
    from launcher.execute import stacks
    from launcher.plans import flightrec

    stem = str(tmp_path / "fr-rank")
    env = {**single_rank_env(), **flightrec.ENV, "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem,
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": stem}
    proc = subprocess.Popen([sys.executable, "-c", NCCL_RANK], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        said = []  # torch 2.13 warns that the image's TORCH_NCCL_* names are deprecated (2.7.1 knows only those)
        for line in proc.stdout:
            said.append(line.strip())
            if said[-1] == "ready":
                break
        assert said and said[-1] == "ready", said
        import time

        deadline = time.monotonic() + 30
        while not os.path.exists(flightrec.pipe_path(stem, 0)) and time.monotonic() < deadline:
            time.sleep(0.2)  # the watchdog's monitor thread makes the pipe
        poked = stacks.poke_recorder(proc.pid, 0)
        assert poked is not None, os.listdir(tmp_path)
        said = stacks.recorder_dump(poked, time.monotonic() + 30)
        assert said is not None and said.startswith("NCCL: nccl:all_reduce #") and said.endswith("completed"), said
    finally:
        proc.kill()
        proc.wait()
