"""The loader's training pipeline against a naive PIL pipeline, per core, on generated 500x375 JPEG shards.

Shards of 500x375 quality-90 JPEGs (colour fields, edges, texture and grain: about the entropy of an ImageNet
photo) are made with the project's converter, as given and pre-resized (`--resize PX --quality 90`, PX 256 by
default). On one core (one process, one torch thread), in alternating rounds, it times:

  naive       open, convert RGB, RandomResizedCrop (crop, then PIL bilinear resize), flip, to float tensor,
              normalize: torchvision's recipe on PIL
  steps       each change the loader makes, one at a time (uint8 path, crop inside the resize, reduced-DCT
              decoding, torch's uint8 resize, libjpeg-turbo's decoder), so the table shows what each bought
  loader      training.loader.make_loader itself (tar reading, shuffle buffer, the transforms, collation),
              on the same shards and on the pre-resized ones

All read shards with the same tar reader and build batches. Prints `ratio=` last: the loader on the pre-resized
shards over naive on the 500x375 shards, the pipeline as we recommend running it (convert with --resize, then
load); the same-shards ratio is printed above it.

    .venv/bin/python bench/loader.py [--images 128] [--rounds 5] [--size 224] [--resize 256] [--record]

With --record, the loader's per-core rate on the full-size shards goes to <state root>/measured/loader.json, where
`launch plan` and `launch cost` read it in place of the model's default (launcher.cost.inputs,
loader_img_per_sec_per_core; the resized rate is printed beside it for loader_img_per_sec_per_core_resized).
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import random
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cputime import median_rates  # noqa: E402

from training.convert import convert  # noqa: E402
from training.loader import load_manifest, make_loader, read_shard, shards_of  # noqa: E402
from training.transforms import (  # noqa: E402
    IMAGENET_MEAN,
    IMAGENET_STD,
    dct_scale,
    decode_reduced,
    jpeg_size,
    random_resized_crop_box,
    train_transform,
)

WIDTH, HEIGHT, QUALITY, BATCH = 500, 375, 90, 32
MEAN = torch.tensor(IMAGENET_MEAN).view(3, 1, 1) / 255
STD = torch.tensor(IMAGENET_STD).view(3, 1, 1) / 255


def photo(rng: np.random.Generator) -> Image.Image:
    """A 500x375 stand-in for a photo: smooth colour fields, a few hard edges, texture and grain; about 100 KiB
    at quality 90, the entropy of an average ImageNet JPEG of that size (140 GB / 1.28M images at ~470x390)."""
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH].astype(np.float32)
    pixels = np.zeros((HEIGHT, WIDTH, 3), np.float32)
    for c in range(3):
        for _ in range(5):
            fx, fy = rng.uniform(0.002, 0.04, 2)
            pixels[..., c] += rng.uniform(15, 45) * np.sin(fx * x + fy * y + rng.uniform(0, 6.3))
    for _ in range(4):  # objects: ellipses with their own colour
        cy, cx, ry, rx = rng.uniform(0, HEIGHT), rng.uniform(0, WIDTH), rng.uniform(20, 120), rng.uniform(20, 160)
        inside = ((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1
        pixels[inside] += rng.uniform(-60, 60, 3)
    texture = rng.normal(0, 30, (HEIGHT // 2, WIDTH // 2, 3)).astype(np.float32)
    for c in range(3):
        layer = Image.fromarray(texture[..., c]).resize((WIDTH, HEIGHT), Image.Resampling.BILINEAR)
        pixels[..., c] += np.asarray(layer)
    pixels += 128 + rng.normal(0, 10, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make_shards(root: Path, images: int, resize: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    for i in range(images):
        folder = root / "src" / "train" / f"n{i % 4:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        photo(rng).save(folder / f"img_{i}.JPEG", quality=QUALITY)
    convert(root / "src", root / "orig", shard_size=64)
    convert(root / "src", root / "resized", shard_size=64, resize=resize, quality=QUALITY)
    return root / "orig", root / "resized"


# --- the pipelines: naive, then one change at a time ------------------------------------------------------


def naive(data: bytes, size: int, rng: random.Random) -> torch.Tensor:
    im = Image.open(io.BytesIO(data)).convert("RGB")
    left, top, w, h = random_resized_crop_box(im.width, im.height, rng)
    im = im.crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    x = torch.from_numpy(np.array(im)).permute(2, 0, 1).float().div(255)  # ToTensor
    return (x - MEAN) / STD  # Normalize


def uint8_path(data: bytes, size: int, rng: random.Random) -> torch.Tensor:
    im = Image.open(io.BytesIO(data)).convert("RGB")
    left, top, w, h = random_resized_crop_box(im.width, im.height, rng)
    im = im.crop((left, top, left + w, top + h)).resize((size, size), Image.Resampling.BILINEAR)
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(im))


def crop_in_resize(data: bytes, size: int, rng: random.Random) -> torch.Tensor:
    im = Image.open(io.BytesIO(data)).convert("RGB")
    left, top, w, h = random_resized_crop_box(im.width, im.height, rng)
    im = im.resize((size, size), Image.Resampling.BILINEAR, box=(left, top, left + w, top + h))
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(im))


def draft_decode(data: bytes, size: int, rng: random.Random) -> Image.Image:
    im = Image.open(io.BytesIO(data))
    width, height = im.size
    box = random_resized_crop_box(width, height, rng)
    scale = dct_scale(box[2], box[3], size)
    if scale > 1:
        im.draft("RGB", (width // scale, height // scale))  # Pillow picks the scale by floor division
    return im.convert("RGB"), box, (width, height)


def reduced_dct(data: bytes, size: int, rng: random.Random) -> torch.Tensor:
    im, (left, top, w, h), (width, height) = draft_decode(data, size, rng)
    fx, fy = im.width / width, im.height / height
    im = im.resize((size, size), Image.Resampling.BILINEAR,
                   box=(left * fx, top * fy, (left + w) * fx, (top + h) * fy), reducing_gap=2.0)
    if rng.random() < 0.5:
        im = im.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return torch.from_numpy(np.array(im))


def torch_resize(data: bytes, size: int, rng: random.Random) -> torch.Tensor:
    im, (left, top, w, h), (width, height) = draft_decode(data, size, rng)
    pixels = np.asarray(im)
    fx, fy = pixels.shape[1] / width, pixels.shape[0] / height
    x0, y0 = round(left * fx), round(top * fy)
    crop = pixels[y0 : max(y0 + 1, round((top + h) * fy)), x0 : max(x0 + 1, round((left + w) * fx))]
    x = torch.from_numpy(crop.copy()).permute(2, 0, 1).unsqueeze(0)
    out = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)[0].permute(1, 2, 0)
    if rng.random() < 0.5:
        out = out.flip(1)
    return out.contiguous()


def simplejpeg_decode(data: bytes, size: int, rng: random.Random) -> torch.Tensor:
    width, height = jpeg_size(data)
    left, top, w, h = random_resized_crop_box(width, height, rng)
    pixels = decode_reduced(data, width, height, dct_scale(w, h, size), fast=False)
    fx, fy = pixels.shape[1] / width, pixels.shape[0] / height
    x0, y0 = round(left * fx), round(top * fy)
    crop = pixels[y0 : max(y0 + 1, round((top + h) * fy)), x0 : max(x0 + 1, round((left + w) * fx))]
    x = torch.from_numpy(crop).permute(2, 0, 1).unsqueeze(0)
    out = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True)[0].permute(1, 2, 0)
    if rng.random() < 0.5:
        out = out.flip(1)
    return out.contiguous()


STEPS = [  # (name, per-sample function, what changed)
    ("naive", naive, "PIL, float32 tensor, normalized on the CPU"),
    ("uint8", uint8_path, "+ uint8 HWC out, float and normalize left to the device"),
    ("crop-in-resize", crop_in_resize, "+ crop inside PIL's resize (box=), no intermediate crop"),
    ("reduced-DCT", reduced_dct, "+ draft: decode at 1/2, 1/4, 1/8 when the crop allows"),
    ("torch-resize", torch_resize, "+ resize the crop with torch's uint8 antialiased kernel"),
    ("simplejpeg", simplejpeg_decode, "+ libjpeg-turbo via simplejpeg: header parse, scaled decode"),
    ("fast-dct", train_transform, "+ fast DCT and chroma upsampling: training.transforms.train_transform"),
]


def run_pipeline(shards: list[Path], fn, size: int) -> int:
    """Every sample of `shards` through `fn`, in batches; returns the number of images."""
    rng, done, batch = random.Random(0), 0, []
    float_out = fn is naive
    for path in shards:
        for _, data, _ in read_shard(path):
            batch.append(fn(data, size, rng))
            if len(batch) == BATCH:
                images = torch.stack(batch) if float_out else torch.stack(batch).permute(0, 3, 1, 2)
                done += len(images)
                batch = []
    return done


def run_loader(directory: Path, size: int) -> int:
    shards = shards_of(load_manifest(directory), "train")
    loader = make_loader(directory, shards, size, BATCH, True, seed=0, epoch=0, rank=0, workers=0)
    return sum(len(labels) for _, labels in loader)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=128)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", type=int, default=224, help="output crop (px)")
    p.add_argument("--resize", type=int, default=256, help="shorter side of the pre-resized shards (px)")
    p.add_argument("--record", action="store_true", help="record the per-core rate for the cost model")
    args = p.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory(prefix="scaletrain-bench-") as tmp:
        orig, resized = make_shards(Path(tmp), args.images, args.resize)
        orig_paths = [orig / s["name"] for s in shards_of(load_manifest(orig), "train")]
        candidates = {name: (lambda fn=fn: run_pipeline(orig_paths, fn, args.size)) for name, fn, _ in STEPS}
        candidates["loader"] = lambda: run_loader(orig, args.size)
        candidates["loader, pre-resized"] = lambda: run_loader(resized, args.size)
        rate = median_rates(candidates, args.rounds)
        bytes_orig = sum(p.stat().st_size for p in orig_paths) / args.images
        bytes_small = sum(p.stat().st_size for p in resized.glob("train-*.tar")) / args.images

    base = rate["naive"]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, 1 process x 1 thread; {args.images} images "
          f"{WIDTH}x{HEIGHT} q{QUALITY} ({bytes_orig / 1024:.0f} KiB each, {bytes_small / 1024:.0f} KiB pre-resized), "
          f"{args.size} px crops, median of {args.rounds} rounds of process CPU time")
    previous = base
    for name, _, what in STEPS:
        print(f"  {name:<20} {rate[name]:7.0f} img/s  x{rate[name] / base:4.2f}  (step x{rate[name] / previous:4.2f})"
              f"  {what}")
        previous = rate[name]
    print(f"  {'loader':<20} {rate['loader']:7.0f} img/s  x{rate['loader'] / base:4.2f}  make_loader on the same "
          f"shards (tar, shuffle buffer, collation)")
    print(f"  {'loader, pre-resized':<20} {rate['loader, pre-resized']:7.0f} img/s  "
          f"x{rate['loader, pre-resized'] / base:4.2f}  make_loader on shards converted with --resize {args.resize}")
    print(f"per core for the cost model: {rate['loader']:.0f} img/s full-size, {rate['loader, pre-resized']:.0f} "
          f"--resize {args.resize}")
    if args.record:
        import datetime as dt

        from launcher.cluster import state_root
        from launcher.cost import measured

        file = measured.loader_path(state_root())
        measured.record_loader(file, rate["loader"], f"bench/loader.py on {dt.date.today()}: {platform.machine()}, "
                               f"{os.cpu_count()} cores, make_loader on {WIDTH}x{HEIGHT} q{QUALITY} shards, one core "
                               f"({rate['loader, pre-resized']:.0f} img/s on --resize {args.resize} shards)")
        print(f"recorded {rate['loader']:.0f} img/s per core in {file}")
    print(f"same shards: loader / naive = {rate['loader'] / base:.2f}")
    print(f"ratio={rate['loader, pre-resized'] / base:.2f}")


if __name__ == "__main__":
    main()
