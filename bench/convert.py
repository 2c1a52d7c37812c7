"""The converter's images/s per core against decoding the same images, nothing else.

Generated ImageNet-like JPEGs (500x375, quality 90, about 100 KiB; see bench/loader.py) in the ILSVRC folder
layout, plus a set of large originals (2000x1500). On one core (workers=1), in alternating rounds, it times:

  decode-only          read each file and decode it fully with Pillow (what checking an image costs naively)
  convert              launch data convert's default: list, read, check, pass clean JPEGs through, write
                       shards with sha256 and the manifest
  convert --resize     the same, shrinking to a 256 px shorter side and re-encoding at quality 90 (reduced-DCT
                       decode, antialiased bilinear on uint8, libjpeg-turbo encode: training.jpegresize)
  large originals      decode-only vs convert --resize 480 on the 2000x1500 set (reduced-DCT decoding)

Then, with training.jpegresize's fast path installed, where a `--resize 256` image's time goes: its decode,
resize and encode timed alone on the same files (and, for the record, the 3/4 decode simplejpeg would pick if
asked for the target size), the rest of the converter (read, tar, sha256, write) being what is left.

Prints the pass-through ratio, then `ratio=` last: `convert --resize 256` over decode-only (the goal is 0.8 or
more; the resize path is training.jpegresize when simplejpeg and torch are installed, Pillow's otherwise).

    .venv/bin/python bench/convert.py [--images 192] [--large 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cputime import median_rates  # noqa: E402

from training import jpegresize  # noqa: E402
from training.convert import convert  # noqa: E402
from training.shards import resized_size  # noqa: E402

WIDTH, HEIGHT, QUALITY = 500, 375, 90


def photo(rng: np.random.Generator, width: int = WIDTH, height: int = HEIGHT) -> Image.Image:
    """Colour fields, hard edges, texture and grain: about the entropy of an ImageNet photo (as bench/loader.py)."""
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.zeros((height, width, 3), np.float32)
    k = WIDTH / width
    for c in range(3):
        for _ in range(5):
            fx, fy = rng.uniform(0.002, 0.04, 2) * k
            pixels[..., c] += rng.uniform(15, 45) * np.sin(fx * x + fy * y + rng.uniform(0, 6.3))
    for _ in range(4):
        cy, cx = rng.uniform(0, height), rng.uniform(0, width)
        ry, rx = rng.uniform(20, 120) / k, rng.uniform(20, 160) / k
        pixels[((y - cy) / ry) ** 2 + ((x - cx) / rx) ** 2 <= 1] += rng.uniform(-60, 60, 3)
    texture = rng.normal(0, 30, (height // 2, width // 2, 3)).astype(np.float32)
    for c in range(3):
        layer = Image.fromarray(texture[..., c]).resize((width, height), Image.Resampling.BILINEAR)
        pixels[..., c] += np.asarray(layer)
    pixels += 128 + rng.normal(0, 10, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


def make_source(root: Path, images: int, width: int, height: int) -> list[Path]:
    rng = np.random.default_rng(0)
    paths = []
    for i in range(images):
        folder = root / "train" / f"n{i % 4:08d}"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"img_{i}.JPEG"
        photo(rng, width, height).save(path, quality=QUALITY)
        paths.append(path)
    return paths


def decode_only(paths: list[Path]) -> int:
    for path in paths:
        with Image.open(io.BytesIO(path.read_bytes())) as image:
            image.convert("RGB")
    return len(paths)


def stages(paths: list[Path], resize: int) -> dict[str, Callable[[], int]]:
    """training.jpegresize's steps, each alone, on the first 64 of ``paths`` (decoded and resized beforehand)."""
    data = [p.read_bytes() for p in paths[:64]]
    target = resized_size(WIDTH, HEIGHT, resize)
    decoded = [jpegresize.decode(d, WIDTH, HEIGHT, target) for d in data]
    resized = [jpegresize.resize(p, target) for p in decoded]
    import simplejpeg  # installed: the caller checked jpegresize.available()

    def each(fn, items):
        return lambda: sum(1 for item in items if fn(item) is not None)

    return {
        "decode": each(lambda d: jpegresize.decode(d, WIDTH, HEIGHT, target), data),
        "resize": each(lambda p: jpegresize.resize(p, target), decoded),
        "encode": each(lambda p: jpegresize.encode(p, QUALITY), resized),
        "decode at 3/4 (eighths)": each(lambda d: simplejpeg.decode_jpeg(
            d, colorspace="RGB", fastdct=True, fastupsample=True, min_width=target[0], min_height=target[1]), data),
    }


def converting(src: Path, scratch: Path, **options) -> int:
    out = Path(tempfile.mkdtemp(dir=scratch))  # a fresh directory: nothing to resume
    manifest = convert(src, out, shard_size=64, workers=1, **options)
    return sum(s["count"] for s in manifest["shards"]) + len(manifest["rejected"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=192)
    p.add_argument("--large", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()

    with tempfile.TemporaryDirectory(prefix="scaletrain-bench-") as tmp:
        root = Path(tmp)
        paths = make_source(root / "src", args.images, WIDTH, HEIGHT)
        large = make_source(root / "large", args.large, 4 * WIDTH, 4 * HEIGHT)
        (root / "scratch").mkdir()
        candidates = {
            "decode-only": lambda: decode_only(paths),
            "convert": lambda: converting(root / "src", root / "scratch"),
            "convert --resize 256": lambda: converting(root / "src", root / "scratch", resize=256, quality=QUALITY),
            "large: decode-only": lambda: decode_only(large),
            "large: convert --resize 480": lambda: converting(root / "large", root / "scratch", resize=480,
                                                              quality=QUALITY),
        }
        steps = stages(paths, 256) if jpegresize.available() else {}
        with jpegresize.one_thread():  # as the converter's writers run torch (its own calls set it too)
            rate = median_rates({**candidates, **steps}, args.rounds)  # the steps in the same interleaved rounds
        kib = sum(p.stat().st_size for p in paths) / len(paths) / 1024
        large_kib = sum(p.stat().st_size for p in large) / len(large) / 1024

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, 1 process (workers=1); {args.images} images "
          f"{WIDTH}x{HEIGHT} q{QUALITY} ({kib:.0f} KiB), {args.large} large {4 * WIDTH}x{4 * HEIGHT} "
          f"({large_kib:.0f} KiB), median of {args.rounds} rounds of process CPU time")
    for name in candidates:
        base = rate["large: decode-only" if name.startswith("large") else "decode-only"]
        print(f"  {name:<28} {rate[name]:7.0f} img/s  x{rate[name] / base:4.2f} of decode-only")
    if steps:
        ms = {name: 1000 / rate[name] for name in steps}
        total = 1000 / rate["convert --resize 256"]
        rest = total - ms["decode"] - ms["resize"] - ms["encode"]
        print(f"per image, ms of CPU: decode-only {1000 / rate['decode-only']:.2f}; convert --resize 256 {total:.2f} = "
              f"decode {ms['decode']:.2f} + resize {ms['resize']:.2f} + encode {ms['encode']:.2f} + the rest "
              f"{rest:.2f} (read, tar, sha256, write); a 3/4 decode instead: {ms['decode at 3/4 (eighths)']:.2f}")
    print(f"pass-through: convert / decode-only = {rate['convert'] / rate['decode-only']:.2f}")
    print(f"ratio={rate['convert --resize 256'] / rate['decode-only']:.2f}")


if __name__ == "__main__":
    main()
