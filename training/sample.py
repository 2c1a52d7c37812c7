"""A small synthetic data set in the real ILSVRC2012 folder layout.

It stands in for ImageNet wherever the real thing is too big or not at hand (the local cluster, the tests,
`launch data sample`). The layout, names and JPEG files are the ones `training.convert` reads from a real
ImageNet download:

    OUT/train/<wnid>/<wnid>_<n>.JPEG
    OUT/val/<wnid>/ILSVRC2012_val_<8-digit n>.JPEG      (n counts from 00000001 across all classes)

Each class has its own base hue and a stripe or checker pattern at its own orientation and frequency; each
image jitters hue, brightness and stripe phase, gets a random occluding ellipse and mild noise, and has its
own size (shorter side 64-128 px, aspect ratio between 3/4 and 4/3). A small ResNet at 32x32 px learns it in
a few epochs, so a training run on it shows whether the pipeline learns at all.

The same call writes byte-identical files: every image draws from its own numpy Generator seeded by
(seed, split, class, index).
"""

from __future__ import annotations

import colorsys
import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from PIL import Image

# The first 50 ImageNet-1k WNIDs in sorted order (class indices 0-49 of the real set).
IMAGENET_WNIDS = (
    "n01440764", "n01443537", "n01484850", "n01491361", "n01494475",
    "n01496331", "n01498041", "n01514668", "n01514859", "n01518878",
    "n01530575", "n01531178", "n01532829", "n01534433", "n01537544",
    "n01558993", "n01560419", "n01580077", "n01582220", "n01592084",
    "n01601694", "n01608432", "n01614925", "n01616318", "n01622779",
    "n01629819", "n01630670", "n01631663", "n01632458", "n01632777",
    "n01641577", "n01644373", "n01644900", "n01664065", "n01665541",
    "n01667114", "n01667778", "n01669191", "n01675722", "n01677366",
    "n01682714", "n01685808", "n01687978", "n01688243", "n01689811",
    "n01692333", "n01693334", "n01694178", "n01695060", "n01697457",
)  # fmt: skip

MIN_CLASSES, MAX_CLASSES = 2, 1000
JPEG_QUALITY = 90
SPLITS = {"train": 0, "val": 1}  # split -> id in the per-image RNG seed

# Image geometry (pixels) and per-image jitter.
MIN_SHORT_SIDE, MAX_SHORT_SIDE = 64, 128
MAX_ASPECT = 4 / 3
HUE_JITTER = 0.02  # fraction of the colour wheel, well under the spacing between 10 classes' hues
BRIGHTNESS_RANGE = (0.8, 1.2)
NOISE_SIGMA = 6.0  # grey levels
MAX_OCCLUDER_AXIS = 0.35  # an occluding ellipse's semi-axis, as a fraction of the image's shorter side


def wnids(classes: int) -> list[str]:
    """The first `classes` real ImageNet WNIDs, then synthetic `n9xxxxxxx` ids past the list, sorted."""
    real = list(IMAGENET_WNIDS[:classes])
    synthetic = [f"n9{i:07d}" for i in range(classes - len(real))]
    return sorted(real + synthetic)


def class_style(index: int, classes: int) -> dict:
    """What makes class `index` of `classes` recognisable: hue, pattern, orientation, frequency."""
    golden_angle = 137.508  # degrees; spreads orientations of neighbouring classes far apart
    return {
        "hue": index / classes,
        "pattern": "checker" if index % 2 else "stripes",
        "angle": np.deg2rad((index * golden_angle) % 180.0),
        "cycles": 2.0 + (index * 3) % 5,  # stripe periods across the shorter side: 2-6
    }


def render(rng: np.random.Generator, style: dict) -> Image.Image:
    """One image of a class, drawn with `rng`."""
    short = int(rng.integers(MIN_SHORT_SIDE, MAX_SHORT_SIDE + 1))
    long = int(round(short * rng.uniform(1.0, MAX_ASPECT)))
    height, width = (short, long) if rng.random() < 0.5 else (long, short)

    # Pattern in [0, 1], in coordinates where the shorter side has length 1 so it survives resizing.
    y, x = np.mgrid[0:height, 0:width].astype(np.float32) / short
    u = x * np.cos(style["angle"]) + y * np.sin(style["angle"])
    phase = rng.uniform(0.0, 2 * np.pi)
    wave = np.sin(2 * np.pi * style["cycles"] * u + phase)
    if style["pattern"] == "checker":
        v = -x * np.sin(style["angle"]) + y * np.cos(style["angle"])
        wave = wave * np.sign(np.sin(2 * np.pi * style["cycles"] * v + phase))
    pattern = (wave > 0).astype(np.float32)[..., None]

    hue = (style["hue"] + rng.uniform(-HUE_JITTER, HUE_JITTER)) % 1.0
    light = np.array(colorsys.hsv_to_rgb(hue, 0.75, 0.9), dtype=np.float32) * 255
    dark = light * 0.35
    pixels = light * pattern + dark * (1 - pattern)
    pixels *= rng.uniform(*BRIGHTNESS_RANGE)

    cy, cx = rng.uniform(0, height), rng.uniform(0, width)
    ry, rx = rng.uniform(0.1, MAX_OCCLUDER_AXIS, size=2) * short
    rows, cols = np.arange(height)[:, None], np.arange(width)[None, :]
    occluded = ((rows - cy) / ry) ** 2 + ((cols - cx) / rx) ** 2 <= 1
    pixels[occluded] = rng.uniform(0, 255, size=3)

    pixels += rng.normal(0.0, NOISE_SIGMA, size=pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).round().astype(np.uint8))


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file beside it, so readers never see half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jpeg_bytes(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=JPEG_QUALITY)
    return buf.getvalue()


def make_sample(
    out: Path,
    *,
    classes: int,
    per_class: int,
    val_per_class: int | None = None,
    seed: int = 0,
    on_image: Callable[[], None] | None = None,
) -> dict:
    """Write the synthetic data set under `out`; return {"classes", "train", "val", "out"}.

    `val_per_class` defaults to max(2, per_class // 5). `on_image` is called once per written image.
    """
    if not MIN_CLASSES <= classes <= MAX_CLASSES:
        raise ValueError(f"classes must be between {MIN_CLASSES} and {MAX_CLASSES}, got {classes}")
    if per_class < 1:
        raise ValueError(f"per_class must be 1 or more, got {per_class}")
    if val_per_class is None:
        val_per_class = max(2, per_class // 5)
    if val_per_class < 0:
        raise ValueError(f"val_per_class must be 0 or more, got {val_per_class}")
    if seed < 0:
        raise ValueError(f"seed must be 0 or more, got {seed}")

    out = Path(out)
    names = wnids(classes)
    counts = {"train": per_class, "val": val_per_class}
    val_number = 0
    for split, count in counts.items():
        for cls, wnid in enumerate(names):
            folder = out / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            style = class_style(cls, classes)
            for i in range(count):
                if split == "train":
                    name = f"{wnid}_{i + 1}.JPEG"
                else:
                    val_number += 1
                    name = f"ILSVRC2012_val_{val_number:08d}.JPEG"
                rng = np.random.default_rng([seed, SPLITS[split], cls, i])
                write_atomic(folder / name, jpeg_bytes(render(rng, style)))
                if on_image is not None:
                    on_image()
    return {
        "classes": names,
        "train": classes * per_class,
        "val": classes * val_per_class,
        "out": str(out),
    }
