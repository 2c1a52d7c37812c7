"""The input pipeline alone, no model: the CPU loader's decode against GPU-side decode (training.gpudecode).

On the shards bench/gpu.py makes (500x375 q90 JPEGs, as they are and --resize 256), each row iterates training
batches of 256 at 224 px exactly as the trainer reads them, and counts images per second after the first batch
(worker start-up left out):

  cpu   training.loader.make_loader: the workers read, decode (libjpeg-turbo, reduced DCT), crop, resize and flip;
        the batch is pinned and copied to the GPU
  gpu   make_loader(decode="gpu"): the workers read and draw the crop boxes from the headers; the rank's process
        decodes the batch with nvJPEG and crops, resizes and flips on the GPU (training.gpudecode.GpuBatches)

with 1 worker (the per-core rate `launch plan` reads) and with the machine's cores - 1. Without CUDA the gpu rows
are skipped.

    python3 bench/gpudecode.py [--images 4096] [--workers N]     # makes its own shards; prints ratio= last
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training import gpudecode  # noqa: E402
from training.loader import load_manifest, make_loader, shards_of  # noqa: E402


@dataclass
class PipelineRow:
    data: str       # full-size, resized
    decode: str     # cpu, gpu
    workers: int
    images_per_sec: float | None  # None: skipped (no CUDA) or failed
    images: int     # images counted (after the first batch)
    error: str = ""  # why there is no figure


def pipeline_rate(data: Path, decode: str, workers: int, size: int, batch: int, limit: int) -> tuple[float, int]:
    """Images/s over `data`'s training shards (at most `limit` counted), batches landing on the GPU (or staying on
    the CPU without one)."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    shards = shards_of(load_manifest(data), "train")
    loader = make_loader(data, shards, size, batch, train=True, seed=0, epoch=0, rank=0, workers=workers,
                         pin_memory=cuda, decode=decode)
    batches = gpudecode.batches(loader, size, device)
    next(batches)  # the workers' start and the first batch are not counted
    if cuda:
        torch.cuda.synchronize()
    start, count = time.perf_counter(), 0
    for images, labels in batches:
        images = images.to(device, non_blocking=True)
        count += len(labels)
        if count >= limit:
            break
    if cuda:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if isinstance(batches, gpudecode.GpuBatches):
        batches.close()
    del batches
    if cuda:
        torch.cuda.empty_cache()  # the trainer runs after this, in a process of its own, on the same GPU
    return (count / elapsed if elapsed > 0 and count else 0.0), count


def pipeline_rows(shards: dict[str, Path], workers: int, size: int, batch: int, say=print) -> list[PipelineRow]:
    rows = []
    counts = sorted({1, workers})
    for decode in ("cpu", "gpu"):
        for n in counts:
            for data, path in shards.items():
                if decode == "gpu" and not torch.cuda.is_available():
                    rows.append(PipelineRow(data, decode, n, None, 0, "no CUDA"))
                    continue
                try:
                    rate, images = pipeline_rate(path, decode, n, size, batch, limit=batch * (6 if n == 1 else 40))
                except Exception as e:  # noqa: BLE001 - a bench row that fails says why; the others still run
                    rows.append(PipelineRow(data, decode, n, None, 0, f"{type(e).__name__}: {e}"[:300]))
                    say(f"  pipeline {decode} decode, {n} worker(s), {data}: failed: {rows[-1].error}")
                    continue
                rows.append(PipelineRow(data, decode, n, rate, images))
                say(f"  pipeline {decode} decode, {n} worker(s), {data}: {rate:,.0f} img/s ({images} images)")
    return rows


def pipeline_table(rows: list[PipelineRow]) -> str:
    lines = [f"{'input pipeline alone':<22} {'data':<10} {'workers':>7} {'img/s':>9} {'per worker':>10}"]
    for r in rows:
        rate = (r.error or "skipped")[:40] if r.images_per_sec is None else f"{r.images_per_sec:,.1f}"
        per = "" if r.images_per_sec is None else f"{r.images_per_sec / r.workers:,.1f}"
        lines.append(f"{r.decode + ' decode':<22} {r.data:<10} {r.workers:>7} {rate:>9} {per:>10}")
    return "\n".join(lines)


def rate_of(rows: list[PipelineRow], data: str, decode: str, workers: int) -> float | None:
    return next((r.images_per_sec for r in rows if (r.data, r.decode, r.workers) == (data, decode, workers)), None)


def main(argv: list[str] | None = None) -> int:
    from gpu import gpu_setup, make_shards  # noqa: PLC0415 - bench/gpu.py imports this module

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=4096, help="generated JPEGs")
    p.add_argument("--workers", type=int, default=0, help="loader processes (default: cores - 1)")
    args = p.parse_args(argv)
    cores = os.cpu_count() or 1
    workers = args.workers or max(1, cores - 1)
    setup = gpu_setup(steps=args.images // 256, log_every=1, workers=workers)
    with tempfile.TemporaryDirectory(prefix="scaletrain-bench-gpudecode-") as tmp:
        shards = make_shards(Path(tmp), setup, cores)
        rows = pipeline_rows(shards, workers, setup.image_size, setup.batch)
    print(pipeline_table(rows))
    gpu, cpu = rate_of(rows, "resized", "gpu", workers), rate_of(rows, "resized", "cpu", workers)
    print(f"ratio={gpu / cpu:.2f}" if gpu and cpu else "ratio=n/a")
    return 0


if __name__ == "__main__":
    sys.exit(main())
