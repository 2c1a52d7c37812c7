"""bench/gpu.py and the trainer's --compile, kept working on the CPU (no GPU here; tests/test_gpu.py has the
CUDA path and is skipped without one, which the last test checks it says)."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
# The tiny configuration's rows: fp32 where a GPU runs fp16; the GPU-decode rows are skipped without CUDA.
RUN_NAMES = ["fp32", "bf16", "real, --resize 256", "real, full-size", "real, --resize 256, GPU decode",
             "real, full-size, GPU decode", "fp32, contiguous", "fp32, --compile"]
SKIPPED = {"real, --resize 256, GPU decode", "real, full-size, GPU decode"}
# bench/gpu.py's tiny configuration, so the compiled graph is the one its --compile row made (inductor's cache).
TINY = ["--model", "resnet18", "--image-size", "16", "--batch-per-gpu", "4", "--log-every", "2", "--threads", "1",
        "--no-tensorboard", "--synthetic", "--num-classes", "1000", "--precision", "fp32",
        "--memory-format", "channels_last"]


def cpu_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "", **extra}
    for key in [k for k in env if k.startswith("OMPI_COMM_WORLD")]:
        del env[key]
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train(run: Path, *args: str) -> subprocess.CompletedProcess:
    """The trainer as bench/gpu.py runs it: one rank of DDP (gloo on the CPU), no mpirun."""
    env = cpu_env(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                  MASTER_PORT=str(free_port()))
    proc = subprocess.run([sys.executable, "-m", "training.train", "--engine", "ddp", "--output", str(run), *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def step_losses(run: Path) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "epoch_time_s" not in r]


def test_bench_gpu_tiny_configuration_end_to_end(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "bench/gpu.py", "--tiny"], capture_output=True, text=True, cwd=ROOT,
                          env=cpu_env(OUT=str(out)), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    last = re.fullmatch(r"ratio=(\d+\.\d\d)", lines[-1])
    assert last, lines[-1]

    # The table: one row per run, each with its figure, and the figure the ratio is made of.
    header = next(i for i, ln in enumerate(lines) if ln.startswith("run ") and "img/s" in ln)
    table = {ln[:32].strip(): ln for ln in lines[header + 1: header + 1 + len(RUN_NAMES)]}
    assert list(table) == RUN_NAMES
    assert "yes" in table["fp32, --compile"] and "contiguous" in table["fp32, contiguous"]
    assert all(table[name].endswith("skipped: no CUDA") for name in SKIPPED)
    # The input pipeline alone, before the trainer's table: the CPU loader measured, the GPU's skipped.
    pipeline = lines[lines.index(next(ln for ln in lines if ln.startswith("input pipeline alone"))) + 1:header]
    assert [ln.split()[:2] for ln in pipeline] == [["cpu", "decode"]] * 2 + [["gpu", "decode"]] * 2
    assert all("no CUDA" in ln for ln in pipeline[2:]) and all(float(ln.split()[4].replace(",", "")) > 0
                                                              for ln in pipeline[:2])

    record = json.loads((out / "gpu.json").read_text())
    assert record["configuration"] == "tiny" and record["device"] == "cpu"
    assert record["command"] == "python3 bench/gpu.py --tiny" and re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"])
    rows = {r["name"]: r for r in record["rows"]}
    assert list(rows) == RUN_NAMES and all(r["images_per_sec"] > 0 for n, r in rows.items() if n not in SKIPPED)
    assert all(rows[n]["images_per_sec"] is None and rows[n]["skipped"] == "no CUDA" for n in SKIPPED)
    assert rows["real, --resize 256, GPU decode"]["decode"] == "gpu" and rows["real, --resize 256"]["decode"] == "cpu"
    assert record["ratio_gpu_decode"] is None and [p["decode"] for p in record["pipeline"]] == ["cpu"] * 2 + ["gpu"] * 2
    assert rows["fp32, --compile"]["compile"] and rows["bf16"]["precision"] == "bf16"
    assert rows["real, --resize 256"]["data"] == "resized"
    resized, synthetic = rows["real, --resize 256"]["images_per_sec"], rows["fp32"]["images_per_sec"]
    assert record["ratio"] == pytest.approx(resized / synthetic)
    assert f"{record['ratio']:.2f}" == last.group(1)
    # Real ImageNet-sized JPEGs, and the --resize 256 shards are smaller.
    assert record["bytes_per_sample"]["full-size"] > 60_000 > record["bytes_per_sample"]["resized"]


def test_bench_gpu_rejects_too_few_steps():
    proc = subprocess.run([sys.executable, "bench/gpu.py", "--tiny", "--steps", "3", "--log-every", "2"],
                          capture_output=True, text=True, cwd=ROOT, env=cpu_env(), timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "--steps 3 must be at least twice --log-every 2" in proc.stderr.strip().splitlines()[-1]


def test_compile_trains_as_eager_and_its_checkpoint_resumes_without_it(tmp_path):
    args = [*TINY, "--epochs", "1", "--steps-per-epoch", "4"]
    train(tmp_path / "eager", *args)
    compiled = tmp_path / "compiled"
    train(compiled, *args, "--compile")
    eager_loss, compiled_loss = step_losses(tmp_path / "eager"), step_losses(compiled)
    assert len(compiled_loss) == len(eager_loss) == 2
    assert compiled_loss == pytest.approx(eager_loss, rel=1e-3)  # same weights and batches; rounding apart

    # The compiled module keeps its parameter names, so its checkpoint resumes in a run without --compile.
    state = torch.load(compiled / "checkpoint-epoch000.pt", map_location="cpu", weights_only=False)
    assert "conv1.weight" in state["model"] and not any("_orig_mod" in k for k in state["model"])
    assert state["config"]["compile"] is True
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    shutil.copy(compiled / "checkpoint-epoch000.pt", resumed)
    proc = train(resumed, *TINY, "--epochs", "2", "--steps-per-epoch", "4", "--resume")
    assert "resuming from checkpoint-epoch000.pt: epoch 1, step 4" in proc.stdout


def test_gpu_tests_collect_and_say_why_they_skip_without_cuda():
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_gpu.py"],
                          capture_output=True, text=True, cwd=ROOT, env=cpu_env(), timeout=300,
                          # a session of its own: the inner run's machine check counts the processes of its session
                          # started meanwhile as its own, and the other xdist worker's are in the outer one's (a
                          # fresh clone flagged a concurrent `launch run`, 2026-11-28, as test_zzz's did before)
                          start_new_session=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"\b\d+ skipped\b", proc.stdout) and "passed" not in proc.stdout and "error" not in proc.stdout
    assert "needs an NVIDIA GPU (torch.cuda.is_available() is False)" in proc.stdout
