"""The project's own trainer on one GPU: ResNet-50 at 224 px, batch 256, synthetic data, then real shards.

Every row is one run of `python -m training.train` itself, in its own process, exactly as a training rank runs
(the same loop, autocast, loss scaling, cudnn.benchmark, pinned non-blocking copies), with `--engine ddp` and a
world of one: DDP over NCCL initialised through env:// on 127.0.0.1, so no Horovod and no mpirun are needed.
Each row's figure is the run's `steady_images_per_sec` from its summary.json: every logged window but the first,
which holds cuDNN's autotuning, torch.compile's compilation and the loader's start.

  synthetic   one random uint8 batch made on the GPU (no I/O): fp16 and bf16, channels_last; fp16 contiguous;
              fp16 + channels_last with --compile (last: it compiles for a minute or more)
  real        ImageNet-sized JPEGs (500x375 quality 90, about 99 KiB: bench/loader.py's `photo`) generated on
              this machine in the ILSVRC2012 folder layout, converted by training/convert.py as they are and
              with --resize 256, and read by training/loader.py with --workers (default: one per physical core, as
              launch plans a GPU rank: launcher/plans/loading.py; the 2026-11-27 runs used cores - 1), decoded by
              those workers (--decode cpu) or on the GPU (--decode gpu: nvJPEG, training/gpudecode.py); fp16,
              channels_last, as the synthetic row it is compared with

Before the real rows, bench/gpudecode.py's table: the input pipeline alone (no model), CPU decode against GPU
decode, with 1 worker and with all of them.

Prints the tables, then `ratio=` last: real loader (CPU decode) on the --resize 256 shards over synthetic, same
settings (the goal is >= 0.90; >= 5,000 img/s synthetic on one H100). With $OUT set, also writes $OUT/gpu.json
(device, date, command, versions, every row). --budget S skips the rows that would start after S seconds, so a
device call with a hard limit still ends with its tables.

On a machine without a GPU it runs a tiny CPU configuration so tests/test_gpu_bench.py keeps this command
working: resnet18, 16 px, batch 4, 4 steps, one torch thread, the same rows with fp32 in place of fp16 (CPUs
without fp16 arithmetic emulate it, 10x slower); --tiny forces it on a GPU machine too.

The device machine has PyTorch, torchvision and numpy but no network: carry the wheels the trainer needs beyond
them (simplejpeg; pydantic for the shard manifest). Here, in the repo's root (/.whl/ is git-ignored):

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \\
        simplejpeg==1.9.0 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 \\
        typing-inspection==0.4.5 typing-extensions==4.16.0

then, through the device tool, with carry [".whl"]:

    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && \\
        PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 bench/gpu.py

    python3 bench/gpu.py [--steps 40] [--log-every 10] [--workers N] [--budget S] [--tiny]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpudecode import pipeline_rows, pipeline_table  # noqa: E402  (bench/gpudecode.py: the pipeline alone)
from loader import QUALITY, photo  # noqa: E402  (bench/loader.py: the 500x375 stand-in for an ImageNet photo)

from launcher.plans import loading  # noqa: E402
from training.convert import convert  # noqa: E402

RESIZE = 256  # px, the shorter side of the pre-resized shards (the loader's recommended conversion)


@dataclass(frozen=True)
class Setup:
    """What one configuration of the bench runs: the model and sizes, and how many steps each run takes."""

    model: str
    image_size: int   # px
    batch: int        # images per step (one GPU)
    steps: int        # optimizer steps per run
    log_every: int    # steps per logged window; the first window is not counted
    classes: int      # class folders of the generated data set (synthetic runs use 1000)
    images: int       # generated JPEGs: enough for `steps` full batches
    unique: int       # distinct photos among them (the rest are hard links: decoding costs the same)
    workers: int      # loader processes for the real-data runs
    amp: str          # the precision of the rows named after it: fp16 on GPU (AMP), fp32 in the tiny CPU setup
    threads: int      # the trainer's --threads (0: its default)


@dataclass
class Row:
    name: str
    data: str            # synthetic, full-size, resized
    precision: str
    memory_format: str
    compile: bool
    decode: str          # cpu (loader processes) or gpu (nvJPEG); synthetic rows decode nothing
    images_per_sec: float | None  # steady: every logged window but the first; None: skipped (reason in `skipped`)
    time_s: float          # the run's training time (all steps, first window included)
    wall_s: float          # the whole process, start-up and compilation included
    skipped: str = ""      # why the row did not run: no CUDA, or past --budget


def gpu_setup(steps: int, log_every: int, workers: int) -> Setup:
    batch = 256
    return Setup("resnet50", 224, batch, steps, log_every, classes=1000, images=(steps + 4) * batch, unique=512,
                 workers=workers, amp="fp16", threads=1)  # a GPU rank's torch threads, as launch plans it


def tiny_setup(steps: int, log_every: int, workers: int) -> Setup:
    batch = 4
    # One thread: on a shared 2-core machine, two spinning OpenMP threads per process run 10x slower.
    return Setup("resnet18", 16, batch, steps, log_every, classes=4, images=(steps + 4) * batch, unique=8,
                 workers=workers, amp="fp32", threads=1)


# (name, data, precision, memory format, compile, decode); "amp" is the setup's `amp` (fp16 on GPU). The first
# row is the baseline: the ratio compares "real, --resize 256" with it, same settings. The order is the order of
# importance, so a --budget cuts the least wanted rows.
RUNS = [
    ("{amp}", "synthetic", "amp", "channels_last", False, "cpu"),
    ("bf16", "synthetic", "bf16", "channels_last", False, "cpu"),
    (f"real, --resize {RESIZE}", "resized", "amp", "channels_last", False, "cpu"),
    ("real, full-size", "full-size", "amp", "channels_last", False, "cpu"),
    (f"real, --resize {RESIZE}, GPU decode", "resized", "amp", "channels_last", False, "gpu"),
    ("real, full-size, GPU decode", "full-size", "amp", "channels_last", False, "gpu"),
    ("{amp}, contiguous", "synthetic", "amp", "contiguous", False, "cpu"),
    ("{amp}, --compile", "synthetic", "amp", "channels_last", True, "cpu"),
]
NAME_WIDTH = 32


def _photos(seed: int, count: int) -> list[bytes]:
    import io

    rng, out = np.random.default_rng(seed), []
    for _ in range(count):
        buf = io.BytesIO()
        photo(rng).save(buf, format="JPEG", quality=QUALITY)
        out.append(buf.getvalue())
    return out


def make_shards(root: Path, setup: Setup, cores: int) -> dict[str, Path]:
    """ImageNet-sized JPEGs in the ILSVRC2012 train/<wnid>/ layout, converted as they are and with --resize."""
    per_job = -(-setup.unique // cores)
    with futures.ProcessPoolExecutor(cores) as pool:
        photos = [p for batch in pool.map(_photos, range(cores), [per_job] * cores) for p in batch][: setup.unique]
    src = root / "src"
    for i in range(setup.images):
        folder = src / "train" / f"n{i % setup.classes:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        first = src / "unique" / f"{i % setup.unique}.JPEG"
        if i < setup.unique:
            first.parent.mkdir(exist_ok=True)
            first.write_bytes(photos[i])
        os.link(first, folder / f"img_{i}.JPEG")
    shutil.rmtree(src / "unique")
    # Enough shards that every loader worker has some (the loader starts at most one worker per shard).
    shard_size = max(1, setup.images // max(4 * setup.workers, 8))
    convert(src, root / "full-size", shard_size=shard_size, workers=cores)
    convert(src, root / "resized", shard_size=shard_size, resize=RESIZE, quality=QUALITY, workers=cores)
    shutil.rmtree(src)
    return {"full-size": root / "full-size", "resized": root / "resized"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trainer_argv(setup: Setup, run_dir: Path, data: Path | None, precision: str, memory_format: str,
                 compile_: bool, decode: str = "cpu") -> list[str]:
    argv = [sys.executable, "-m", "training.train", "--engine", "ddp", "--output", str(run_dir),
            "--model", setup.model, "--image-size", str(setup.image_size), "--batch-per-gpu", str(setup.batch),
            "--epochs", "1", "--steps-per-epoch", str(setup.steps), "--log-every", str(setup.log_every),
            "--precision", precision, "--memory-format", memory_format, "--threads", str(setup.threads),
            "--no-tensorboard"]
    argv += ["--compile"] if compile_ else []
    if data is None:
        return argv + ["--synthetic", "--num-classes", "1000"]
    return argv + ["--data", str(data), "--workers", str(setup.workers), "--decode", decode]


class RowFailed(RuntimeError):
    """One row's run failed: the bench records it and goes on with the others."""


def run_trainer(argv: list[str], name: str) -> tuple[dict, float]:
    """One single-rank DDP run of the trainer; its summary.json and the process's wall time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OMPI_COMM_WORLD")}
    pythonpath = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    # torch.distributed's env:// rendezvous with a world of one (training/engine.py's DDPEngine reads these).
    env.update(PYTHONPATH=pythonpath, RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        tail = (proc.stdout[-2000:] + proc.stderr[-4000:]).rstrip()
        print(f"{tail}\nthe trainer failed in run '{name}' (exit {proc.returncode}): {' '.join(argv)}", flush=True)
        raise RowFailed(f"failed (exit {proc.returncode}): {tail.splitlines()[-1] if tail else ''}"[:200])
    return json.loads((Path(argv[argv.index("--output") + 1]) / "summary.json").read_text()), wall


def environment(summary: dict, cores: int) -> dict:
    cuda = summary["device"] != "cpu"
    return {"device": summary["device"], "cores": cores, "machine": platform.machine(),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None,
            "cudnn": torch.backends.cudnn.version() if cuda else None}


def table(rows: list[Row]) -> str:
    baseline = rows[0].images_per_sec
    lines = [f"{'run':<{NAME_WIDTH}} {'data':<10} {'precision':<9} {'memory':<13} {'compile':<7} {'decode':<6} "
             f"{'img/s':>9} {'vs ' + rows[0].name:>9} {'run s':>6} {'wall s':>6}"]
    for r in rows:
        start = (f"{r.name:<{NAME_WIDTH}} {r.data:<10} {r.precision:<9} {r.memory_format:<13} "
                 f"{'yes' if r.compile else 'no':<7} {r.decode:<6} ")
        if r.images_per_sec is None:
            lines.append(start + f"skipped: {r.skipped}")
            continue
        lines.append(start + f"{r.images_per_sec:9,.1f} {r.images_per_sec / baseline:9.2f} {r.time_s:6.1f} "
                             f"{r.wall_s:6.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=0, help="optimizer steps per run (default: 40 on GPU, 4 tiny)")
    p.add_argument("--log-every", type=int, default=0, help="steps per logged window (default: 10 on GPU, 2 tiny)")
    p.add_argument("--workers", type=int, default=0, help="loader processes for the real-data runs "
                                                          "(default: one per physical core on GPU, as launch "
                                                          "plans a GPU rank; 1 tiny)")
    p.add_argument("--budget", type=float, default=0.0, help="seconds: rows that would start later are skipped "
                                                             "(0: no limit)")
    p.add_argument("--tiny", action="store_true", help="the tiny CPU configuration, even with a GPU")
    args = p.parse_args(argv)
    began = time.perf_counter()
    cores = os.cpu_count() or 1
    tiny = args.tiny or not torch.cuda.is_available()
    log_every = args.log_every or (2 if tiny else 10)
    steps = args.steps or (4 if tiny else 40)
    if steps < 2 * log_every:
        p.error(f"--steps {steps} must be at least twice --log-every {log_every}: the first window is not counted")
    if args.budget < 0:
        p.error(f"--budget must be >= 0 seconds, got {args.budget:g}")
    if tiny and torch.cuda.is_available():
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the trainer's CPU path, as on a machine without a GPU
    cuda = not tiny
    workers = args.workers or (1 if tiny else loading.for_share(cores, gpus=True).workers_per_rank)
    setup = (tiny_setup if tiny else gpu_setup)(steps, log_every, workers)
    command = " ".join(["python3", "bench/gpu.py", *(argv if argv is not None else sys.argv[1:])])
    print(f"bench/gpu.py: {setup.model} at {setup.image_size} px, batch {setup.batch}, {setup.steps} steps per run "
          f"(the first {setup.log_every} not counted), {'tiny CPU configuration' if tiny else 'GPU'}", flush=True)

    rows: list[Row] = []
    pipeline: list = []
    summary: dict = {}
    with tempfile.TemporaryDirectory(prefix="scaletrain-bench-gpu-") as tmp:
        shards: dict[str, Path] = {}
        for name, data, precision, memory_format, compile_, decode in RUNS:
            name, precision = name.format(amp=setup.amp), setup.amp if precision == "amp" else precision
            skipped = ("no CUDA" if decode == "gpu" and not cuda else
                       f"past --budget {args.budget:g} s" if args.budget and time.perf_counter() - began > args.budget
                       else "")
            if skipped:
                rows.append(Row(name, data, precision, memory_format, compile_, decode, None, 0.0, 0.0, skipped))
                print(f"  {name}: skipped ({skipped})", flush=True)
                continue
            if data != "synthetic" and not shards:
                start = time.perf_counter()
                shards = make_shards(Path(tmp), setup, cores)
                count = len(list(shards["full-size"].glob("train-*.tar")))
                print(f"  shards: {setup.images} images, {count} shards each, made in "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
                try:
                    pipeline = pipeline_rows(shards, setup.workers, setup.image_size, setup.batch,
                                             say=lambda line: print(line, flush=True))
                except Exception as e:  # noqa: BLE001 - the trainer rows still run; the error is printed whole
                    import traceback

                    traceback.print_exc()
                    print(f"  the input pipeline table failed: {e}", flush=True)
            run_dir = Path(tmp) / "runs" / name.replace(" ", "").replace(",", "-")
            try:
                summary, wall = run_trainer(trainer_argv(setup, run_dir, shards.get(data), precision, memory_format,
                                                         compile_, decode), name)
            except RowFailed as e:
                if not rows:  # the baseline itself: nothing to compare with
                    sys.exit(f"error: the baseline run '{name}' {e}")
                rows.append(Row(name, data, precision, memory_format, compile_, decode, None, 0.0, 0.0, str(e)))
                continue
            rows.append(Row(name, data, precision, memory_format, compile_, decode,
                            summary["steady_images_per_sec"], summary["time_s"], wall))
            print(f"  {name}: {rows[-1].images_per_sec:,.1f} img/s ({wall:.0f} s)", flush=True)
        sizes = {k: sum(f.stat().st_size for f in v.glob("train-*.tar")) / setup.images for k, v in shards.items()}

    rate = {r.name: r.images_per_sec for r in rows}
    baseline = rows[0].images_per_sec

    def over_baseline(name: str) -> float | None:
        return None if rate.get(name) is None else rate[name] / baseline

    ratio = over_baseline(f"real, --resize {RESIZE}")
    ratios = {"full_size": over_baseline("real, full-size"),
              "gpu_decode": over_baseline(f"real, --resize {RESIZE}, GPU decode"),
              "gpu_decode_full_size": over_baseline("real, full-size, GPU decode")}
    env = environment(summary, cores)
    print(f"device: {env['device']}; {cores} cores; torch {env['torch']}"
          + (f", CUDA {env['cuda']}, cuDNN {env['cudnn']}" if env["cuda"] else ""))
    if sizes:
        print(f"real data: 500x375 q{QUALITY} JPEGs, {sizes['full-size'] / 1024:.0f} KiB per sample as shards, "
              f"{sizes['resized'] / 1024:.0f} KiB with --resize {RESIZE}; {setup.workers} loader worker(s)")
    if pipeline:
        print(pipeline_table(pipeline))
    print(table(rows))
    shown = {"full-size": ratios["full_size"], f"--resize {RESIZE}": ratio,
             "GPU decode full-size": ratios["gpu_decode_full_size"],
             f"GPU decode --resize {RESIZE}": ratios["gpu_decode"]}
    print(f"real loader / synthetic ({setup.amp}, channels_last): "
          + ", ".join(f"{k} {'n/a' if v is None else f'{v:.2f}'}" for k, v in shown.items()))
    if os.environ.get("OUT"):
        record = {"date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d"), "command": command,
                  "configuration": "tiny" if tiny else "gpu", "setup": asdict(setup), **env,
                  "bytes_per_sample": sizes, "rows": [asdict(r) for r in rows],
                  "pipeline": [asdict(r) for r in pipeline], "ratio_full_size": ratios["full_size"],
                  "ratio_gpu_decode": ratios["gpu_decode"],
                  "ratio_gpu_decode_full_size": ratios["gpu_decode_full_size"], "ratio": ratio}
        out = Path(os.environ["OUT"]) / "gpu.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp_out = out.with_name(".gpu.json.tmp")
        tmp_out.write_text(json.dumps(record, indent=2) + "\n")
        os.replace(tmp_out, out)
        print(f"wrote {out}")
    print(f"ratio={'n/a' if ratio is None else f'{ratio:.2f}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
