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
import json
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image

from training.inputfiles import read_limited

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
# Images per class and split: ILSVRC2012 has at most 1,300 training and 50 validation images per class; a sample is
# for trying the pipeline, and 10,000 x 1,000 classes (10^7 small JPEGs) is already more than that needs. Checked
# before anything is written (99999999999999999999 wrote thousands of images, then failed).
MAX_PER_CLASS = 10_000
# Beside train/ and val/, the record of what this module wrote there: the options of every run whose images may be
# in the directory (one when it finished; two while a run replaces an earlier one), so a later run replaces exactly
# those files and leaves anything else alone.
SAMPLE_RECORD = ".launch-data-sample.json"
JPEG_QUALITY = 90
WRITERS = 8  # threads writing images: enough to overlap a network file system's round trips, few enough to stop fast
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


class OptionError(ValueError):
    """An option out of its range; the message names it as the user types it (--per-class, not per_class)."""


def file_mode() -> int:
    """The mode a new file gets under this process's umask (0644 under umask 022), as open() gives it.

    tempfile.mkstemp creates its file "readable and writable only by the creating user ID" (0600; Python docs,
    tempfile.mkstemp: https://docs.python.org/3/library/tempfile.html#tempfile.mkstemp), so a file written through
    one and renamed into place must be given this mode. The umask is read from /proc/self/status ("Umask", Linux
    4.7 and later; proc(5): https://man7.org/linux/man-pages/man5/proc.5.html), since setting it to read it back
    (umask(2)) would change it for a moment for every thread.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file beside it, so readers never see half a file; the file gets
    the mode the umask gives a new file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        os.fchmod(fd, file_mode())
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


def layout(classes: int, per_class: int, val_per_class: int) -> Iterator[tuple[str, int, str, int, str]]:
    """(split, class index, wnid, image index in its class, path under OUT) of every image, in writing order."""
    val_number = 0
    for split, count in (("train", per_class), ("val", val_per_class)):
        for cls, wnid in enumerate(wnids(classes)):
            for i in range(count):
                if split == "train":
                    name = f"{wnid}_{i + 1}.JPEG"
                else:
                    val_number += 1
                    name = f"ILSVRC2012_val_{val_number:08d}.JPEG"
                yield split, cls, wnid, i, f"{split}/{wnid}/{name}"


def default_val_per_class(per_class: int) -> int:
    """Validation images per class when not given: a fifth of the training images, at least 2."""
    return max(2, per_class // 5)


def check_sample_options(classes: int, per_class: int, val_per_class: int, seed: int) -> None:
    if not MIN_CLASSES <= classes <= MAX_CLASSES:
        raise OptionError(f"--classes must be between {MIN_CLASSES} and {MAX_CLASSES}, got {classes}")
    if per_class < 1:
        raise OptionError(f"--per-class must be >= 1, got {per_class}")
    if per_class > MAX_PER_CLASS:
        raise OptionError(f"--per-class must be <= {MAX_PER_CLASS}, got {per_class} (allowed: 1 to {MAX_PER_CLASS})")
    if val_per_class < 0:
        raise OptionError(f"--val-per-class must be >= 0, got {val_per_class}")
    if val_per_class > MAX_PER_CLASS:
        raise OptionError(f"--val-per-class must be <= {MAX_PER_CLASS}, got {val_per_class} (allowed: 0 to "
                          f"{MAX_PER_CLASS})")
    if seed < 0:
        raise OptionError(f"--seed must be >= 0, got {seed}")


def sample_paths(runs: list[dict]) -> set[str]:
    """Every image path (under OUT) the runs in a sample record write."""
    return {path for run in runs for *_, path in layout(run["classes"], run["per_class"], run["val_per_class"])}


def earlier_runs(out: Path) -> list[dict]:
    """The runs whose images OUT may hold: [] for a new or empty directory; ValueError (one line) when OUT holds
    anything this module did not write there, which it never deletes or mixes into a sample."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a directory")
    if not out.exists() or not any(out.iterdir()):
        return []
    try:
        # read bounded: a FIFO or a link to /dev/zero under the record's name is not one (issue 33)
        runs = json.loads(read_limited(out / SAMPLE_RECORD, SAMPLE_RECORD))["runs"]
        ours = sample_paths(runs)
    except (OSError, ValueError, KeyError, TypeError):
        raise ValueError(f"--out {out} is not empty and holds no sample of launch data sample; choose a new or empty "
                         "directory") from None
    present = {p.relative_to(out).as_posix() for split in ("train", "val") for p in (out / split).rglob("*")
               if not p.is_dir() and not (p.name.startswith(".") and p.name.endswith(".partial"))}
    extra = sorted(present - ours)
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise ValueError(f"--out {out} holds files launch data sample did not write ({extra[0]}{more}); choose a new "
                         "or empty directory")
    return runs


def remove_earlier(out: Path, earlier: list[dict], now: dict) -> None:
    """Delete what the earlier runs wrote that this one did not (and partial files a killed run left)."""
    keep = sample_paths([now])
    for path in sorted(sample_paths(earlier) - keep):
        (out / path).unlink(missing_ok=True)
    for split, count in (("train", now["per_class"]), ("val", now["val_per_class"])):
        if not (out / split).is_dir():
            continue
        for partial in (out / split).glob("*/.*.partial"):
            partial.unlink(missing_ok=True)
        folders = {w for w in wnids(now["classes"])} if count else set()
        for folder in sorted((out / split).iterdir()):
            if folder.is_dir() and folder.name not in folders and not any(folder.iterdir()):
                folder.rmdir()
        if not count and not any((out / split).iterdir()):
            (out / split).rmdir()


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

    `val_per_class` defaults to default_val_per_class(per_class). `on_image` is called once per written image. OUT
    may be new, empty, or an earlier sample (also one a Ctrl-C or kill cut short): the result is exactly this
    sample, and files it holds besides train/ and val/ stay. OUT holding anything else is refused (ValueError).
    """
    if val_per_class is None:
        val_per_class = default_val_per_class(per_class)
    check_sample_options(classes, per_class, val_per_class, seed)
    out = Path(out)
    now = {"classes": classes, "per_class": per_class, "val_per_class": val_per_class, "seed": seed}
    try:
        earlier = earlier_runs(out)
    except OSError as exc:
        raise ValueError(f"cannot read {out}: {exc.strerror or exc}") from None
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"cannot create {out}: {exc.strerror or exc}") from None
    try:
        record = out / SAMPLE_RECORD
        write_atomic(record, json.dumps({"runs": [r for r in earlier if r != now] + [now]}).encode())
        names = wnids(classes)
        for split, count in (("train", per_class), ("val", val_per_class)):
            for wnid in names if count else []:  # no val/ for --val-per-class 0: the converter lists no val split
                (out / split / wnid).mkdir(parents=True, exist_ok=True)
        # Rendering holds the GIL; writing waits on the file system (a network one on a cluster: /fsx over sshfs
        # or Lustre, each file a create, a write and a rename, round trips each), so a few writers overlap the waits.
        # At most WRITERS * 2 images are in flight: a Ctrl-C leaves little behind, and the next run removes it.
        with ThreadPoolExecutor(WRITERS, thread_name_prefix="sample-write") as pool:
            pending: deque[Future] = deque()
            for split, cls, _, i, path in layout(classes, per_class, val_per_class):
                rng = np.random.default_rng([seed, SPLITS[split], cls, i])
                data = jpeg_bytes(render(rng, class_style(cls, classes)))
                pending.append(pool.submit(write_atomic, out / path, data))
                while pending and (len(pending) >= WRITERS * 2 or pending[0].done()):
                    pending.popleft().result()
                    if on_image is not None:
                        on_image()
            while pending:
                pending.popleft().result()
                if on_image is not None:
                    on_image()
        remove_earlier(out, earlier, now)
        write_atomic(record, json.dumps({"runs": [now]}).encode())
    except OSError as exc:
        raise ValueError(f"cannot write in {out}: {exc.strerror or exc}") from None
    return {
        "classes": names,
        "train": classes * per_class,
        "val": classes * val_per_class,
        "out": str(out),
    }
