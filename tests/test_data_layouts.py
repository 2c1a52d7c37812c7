"""The converter on every SRC layout people have, with the quirks of the real ILSVRC2012 files.

One small logical data set (a quirk of each kind in both splits) is written out in every layout: class folders,
the official tars with the devkit or Kaggle's LOC_val_solution.csv, flat val files, Kaggle's CLS-LOC tree.
Every layout must give the same samples with the right labels, byte-identical shards, and the same rejections.
"""

from __future__ import annotations

import csv
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image, ImageFile
from scipy.io import savemat

from training.convert import convert
from training.shards import Encoding, prepare_image, resized_size
from training.shardwriter import strict_decoding

TENCH, GOLDFISH, SHARK = "n01440764", "n01443537", "n01484850"
NON_LEAF = "n00001740"  # "entity": a synset of the devkit's hierarchy that is not a class
CLASSES = [TENCH, GOLDFISH, SHARK]  # sorted: class index = position
DEVKIT_IDS = {1: SHARK, 2: TENCH, 3: GOLDFISH}  # ILSVRC2012_ID order is not WNID order, as in the real devkit
RED = (220, 30, 30)


def encode(image: Image.Image, fmt: str = "JPEG", **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}) | options)
    return buf.getvalue()


def noise(seed: int, size=(64, 48)) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))


def gradient(width: int, height: int) -> Image.Image:
    """A smooth RGB image: large in pixels, small in bytes."""
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    pixels = np.concatenate([x + 0 * y, y + 0 * x, (x + y) / 2], axis=2)
    return Image.fromarray(pixels.astype(np.uint8))


def quirks() -> dict[str, list[tuple[str, str, bytes]]]:
    """split -> [(wnid, file name, bytes)]: clean inputs and one of each quirk of the real download."""
    red = Image.new("RGB", (48, 40), RED)
    truncated = encode(noise(1))[:1500]
    truncated_progressive = encode(noise(2), progressive=True)[:1500]
    train = [
        (TENCH, f"{TENCH}_1.JPEG", encode(noise(3))),
        (TENCH, f"{TENCH}_2.JPEG", encode(noise(4), progressive=True)),
        (TENCH, f"{TENCH}_3.JPEG", encode(red, "PNG")),  # a PNG named .JPEG (n02105855_2933 in the real set)
        (TENCH, f"{TENCH}_4.JPEG", encode(red.convert("CMYK"))),  # 22 CMYK JPEGs in the real set
        (TENCH, f"{TENCH}_5.JPEG", encode(noise(5).convert("L"))),  # grayscale JPEGs
        (TENCH, f"{TENCH}_6.JPEG", truncated),
        (TENCH, f"{TENCH}_7.JPEG", b""),
        (GOLDFISH, f"{GOLDFISH}_1.JPEG", encode(gradient(2400, 1800))),  # a very large original
        (GOLDFISH, f"{GOLDFISH}_2.JPEG", truncated_progressive),
        (GOLDFISH, f"{GOLDFISH}_3.JPEG", encode(noise(6))),
        (SHARK, f"{SHARK}_1.JPEG", encode(noise(7, (40, 64)))),
    ]
    val = [
        (GOLDFISH, "ILSVRC2012_val_00000001.JPEG", encode(noise(8))),
        (TENCH, "ILSVRC2012_val_00000002.JPEG", encode(red.convert("CMYK"))),
        (SHARK, "ILSVRC2012_val_00000003.JPEG", truncated),
        (SHARK, "ILSVRC2012_val_00000004.JPEG", encode(noise(9).convert("L"))),
        (TENCH, "ILSVRC2012_val_00000005.JPEG", encode(red, "PNG")),
    ]
    return {"train": train, "val": val}


REJECTED_KEYS = {
    f"{TENCH}_6": "truncated or corrupt image: image file is truncated",
    f"{TENCH}_7": "empty file",
    f"{GOLDFISH}_2": "truncated or corrupt image: image file is truncated",
    "ILSVRC2012_val_00000003": "truncated or corrupt image: image file is truncated",
}


def expected_labels() -> dict[str, int]:
    return {Path(name).stem: CLASSES.index(wnid) for items in quirks().values() for wnid, name, _ in items
            if Path(name).stem not in REJECTED_KEYS}


# --- writing the layouts -----------------------------------------------------------------------------------


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)


def tar_bytes(files: dict[str, bytes], gz: bool = False) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz" if gz else "w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def class_folders(items) -> dict[str, bytes]:
    return {f"{wnid}/{name}": data for wnid, name, data in items}


def train_tar(items) -> bytes:
    """ILSVRC2012_img_train.tar: one <wnid>.tar per class."""
    per_class: dict[str, dict[str, bytes]] = {}
    for wnid, name, data in items:
        per_class.setdefault(wnid, {})[name] = data
    return tar_bytes({f"{wnid}.tar": tar_bytes(files) for wnid, files in sorted(per_class.items())})


def loc_csv(items) -> bytes:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(["ImageId", "PredictionString"])
    for wnid, name, _ in items:
        writer.writerow([Path(name).stem, f"{wnid} 10 12 40 30 {wnid} 1 2 20 20"])
    return buf.getvalue().encode()


def devkit_files(items) -> dict[str, bytes]:
    """The devkit's ground truth (one ILSVRC2012_ID per val image, in file-number order) and meta.mat."""
    id_of = {wnid: i for i, wnid in DEVKIT_IDS.items()}
    by_number = sorted((int(Path(name).stem.rsplit("_", 1)[1]), wnid) for wnid, name, _ in items)
    assert [n for n, _ in by_number] == list(range(1, len(by_number) + 1))
    truth = "".join(f"{id_of[wnid]}\n" for _, wnid in by_number).encode()
    fields = ["ILSVRC2012_ID", "WNID", "words", "gloss", "num_children", "children", "wordnet_height",
              "num_train_images"]
    synsets = [*((i, wnid, 0) for i, wnid in DEVKIT_IDS.items()), (1001, NON_LEAF, 3)]
    table = np.zeros((len(synsets), 1), dtype=[(f, "O") for f in fields])
    for row, (i, wnid, children) in enumerate(synsets):
        table[row, 0] = (i, wnid, "words", "gloss", children, np.zeros((1, 0)), 0, 0)
    meta = io.BytesIO()
    savemat(meta, {"synsets": table})
    return {"ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt": truth,
            "ILSVRC2012_devkit_t12/data/meta.mat": meta.getvalue()}


def make_layout(root: Path, layout: str) -> Path:
    data = quirks()
    train, val = data["train"], data["val"]
    flat_val = {name: d for _, name, d in val}
    if layout == "folders":
        write_files(root / "train", class_folders(train))
        write_files(root / "val", class_folders(val))
    elif layout == "tars+devkit.tar.gz":
        write_files(root, {"ILSVRC2012_img_train.tar": train_tar(train), "ILSVRC2012_img_val.tar": tar_bytes(flat_val),
                           "ILSVRC2012_devkit_t12.tar.gz": tar_bytes(devkit_files(val), gz=True)})
    elif layout == "tars+LOC_val_solution.csv":
        write_files(root, {"ILSVRC2012_img_train.tar": train_tar(train), "ILSVRC2012_img_val.tar": tar_bytes(flat_val),
                           "LOC_val_solution.csv": loc_csv(val)})
    elif layout == "folders+flat val+devkit folder":
        write_files(root / "train", class_folders(train))
        write_files(root / "val", flat_val)
        write_files(root, devkit_files(val))
    elif layout == "kaggle":
        write_files(root / "ILSVRC/Data/CLS-LOC/train", class_folders(train))
        write_files(root / "ILSVRC/Data/CLS-LOC/val", flat_val)
        write_files(root, {"LOC_val_solution.csv": loc_csv(val), "LOC_synset_mapping.txt": b"n01440764 tench\n"})
    else:
        raise AssertionError(layout)
    return root


LAYOUTS = {
    "folders": {"train": "train/", "val": "val/"},
    "tars+devkit.tar.gz": {
        "train": "ILSVRC2012_img_train.tar",
        "val": "ILSVRC2012_img_val.tar + ILSVRC2012_devkit_t12.tar.gz (ILSVRC2012_validation_ground_truth.txt)"},
    "tars+LOC_val_solution.csv": {"train": "ILSVRC2012_img_train.tar",
                                  "val": "ILSVRC2012_img_val.tar + LOC_val_solution.csv"},
    "folders+flat val+devkit folder": {
        "train": "train/", "val": "val/ + ILSVRC2012_devkit_t12 (ILSVRC2012_validation_ground_truth.txt)"},
    "kaggle": {"train": "ILSVRC/Data/CLS-LOC/train/", "val": "ILSVRC/Data/CLS-LOC/val/ + LOC_val_solution.csv"},
}


def shard_samples(out: Path, manifest: dict) -> dict[str, tuple[bytes, int]]:
    samples = {}
    for entry in manifest["shards"]:
        with tarfile.open(out / entry["name"]) as tar:
            members = [(m.name, tar.extractfile(m).read()) for m in tar.getmembers()]
        for (jpg, data), (cls, label) in zip(members[::2], members[1::2], strict=True):
            assert jpg.endswith(".jpg") and cls == jpg.replace(".jpg", ".cls")
            samples[jpg.removesuffix(".jpg")] = (data, int(label))
    return samples


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, tuple[Path, Path, dict]]:
    """layout -> (SRC, OUT, manifest), every layout converted with the same options."""
    results = {}
    for layout in LAYOUTS:
        root = tmp_path_factory.mktemp("layout")
        src = make_layout(root / "src", layout)
        results[layout] = (src, root / "out", convert(src, root / "out", shard_size=4, seed=5))
    return results


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_layout_gives_the_right_labels_and_rejections(converted, layout):
    src, out, manifest = converted[layout]
    stored = shard_samples(out, manifest)
    assert {key: label for key, (_, label) in stored.items()} == expected_labels()
    assert manifest["classes"] == CLASSES
    assert manifest["options"]["layout"] == LAYOUTS[layout]
    reasons = {Path(r["path"]).stem: r["reason"] for r in manifest["rejected"]}
    assert reasons.keys() == REJECTED_KEYS.keys()
    assert all(reasons[key].startswith(REJECTED_KEYS[key]) for key in reasons)
    # Nothing dropped silently: every input is a sample or a rejection, and only once.
    assert len(stored) + len(manifest["rejected"]) == sum(len(items) for items in quirks().values())
    assert manifest["splits"] == {"train": {"samples": 8, "shards": 3}, "val": {"samples": 4, "shards": 2}}


def test_every_layout_gives_byte_identical_shards(converted):
    reference_out, reference = converted["folders"][1:]
    for layout, (_, out, manifest) in converted.items():
        assert manifest["shards"] == reference["shards"], layout
        for entry in manifest["shards"]:
            assert (out / entry["name"]).read_bytes() == (reference_out / entry["name"]).read_bytes()


def test_tar_layout_paths_name_the_member_inside_the_tars(converted):
    rejected = {r["path"] for r in converted["tars+LOC_val_solution.csv"][2]["rejected"]}
    assert rejected == {
        f"ILSVRC2012_img_train.tar/{TENCH}.tar/{TENCH}_6.JPEG",
        f"ILSVRC2012_img_train.tar/{TENCH}.tar/{TENCH}_7.JPEG",
        f"ILSVRC2012_img_train.tar/{GOLDFISH}.tar/{GOLDFISH}_2.JPEG",
        "ILSVRC2012_img_val.tar/ILSVRC2012_val_00000003.JPEG",
    }


def test_clean_jpegs_pass_through_and_quirks_become_rgb_jpegs(converted):
    src, out, manifest = converted["folders"]
    stored = shard_samples(out, manifest)
    originals = {p.stem: p.read_bytes() for p in src.rglob("*.JPEG")}
    passed = {f"{TENCH}_1", f"{TENCH}_2", f"{GOLDFISH}_1", f"{GOLDFISH}_3", f"{SHARK}_1", "ILSVRC2012_val_00000001"}
    for key in passed:  # baseline, progressive and very large RGB JPEGs: byte for byte
        assert stored[key][0] == originals[key]
    for key in set(stored) - passed:
        assert stored[key][0] != originals[key]
        with Image.open(io.BytesIO(stored[key][0])) as image:
            assert (image.format, image.mode) == ("JPEG", "RGB")
            pixels = np.asarray(image, dtype=np.int32)
            original = Image.open(io.BytesIO(originals[key]))
            assert image.size == original.size
        if original.mode == "L":
            expected = np.asarray(original.convert("RGB"), dtype=np.int32)
            assert np.abs(pixels - expected).mean() < 4  # the gray image, not garbage
        else:  # the PNG and the CMYK JPEGs were solid red: colours survive, not inverted
            assert np.abs(pixels - RED).max() <= 12


def test_webdataset_reads_the_shards_of_the_official_tars(converted):
    _, out, manifest = converted["tars+devkit.tar.gz"]
    seen = {}
    for item in wds.WebDataset([str(out / e["name"]) for e in manifest["shards"]], shardshuffle=False):
        with Image.open(io.BytesIO(item["jpg"])) as image:
            image.load()
            assert image.mode == "RGB"
        seen[item["__key__"]] = int(item["cls"])
    assert seen == expected_labels()


def test_parallel_workers_write_the_same_bytes(converted, tmp_path):
    src, out, manifest = converted["tars+LOC_val_solution.csv"]
    ticks = []
    parallel = convert(src, tmp_path, shard_size=4, seed=5, workers=2, on_sample=lambda: ticks.append(1))
    assert parallel == manifest
    assert len(ticks) == sum(len(items) for items in quirks().values())
    for entry in manifest["shards"]:
        assert (tmp_path / entry["name"]).read_bytes() == (out / entry["name"]).read_bytes()


# --- resizing ----------------------------------------------------------------------------------------------


def test_resized_size_shrinks_the_shorter_side_and_never_enlarges():
    assert resized_size(500, 375, 256) == (341, 256)
    assert resized_size(375, 500, 256) == (256, 341)
    assert resized_size(2400, 1800, 64) == (85, 64)
    assert resized_size(300, 256, 256) is None and resized_size(200, 100, 256) is None
    assert resized_size(500, 375, None) is None


def test_resize_decodes_large_originals_at_a_reduced_dct_scale(monkeypatch):
    import simplejpeg

    decoded = []
    load, decode_jpeg = ImageFile.ImageFile.load, simplejpeg.decode_jpeg

    def spy(image):
        result = load(image)
        decoded.append(image.size)
        return result

    def spy_turbo(data, **options):
        pixels = decode_jpeg(data, **options)
        decoded.append((pixels.shape[1], pixels.shape[0]))
        return pixels

    monkeypatch.setattr(ImageFile.ImageFile, "load", spy)
    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy_turbo)
    large = encode(gradient(2400, 1800))
    data, reason = prepare_image(large, Encoding(resize=64, quality=90))
    assert reason is None
    assert set(decoded) == {(300, 225)}  # 1/8 scale, still at least 85x64: 1/64 of the pixels decoded
    decoded.clear()
    assert prepare_image(large) == (large, None)
    assert set(decoded) == {(300, 225)}  # passing through, it is checked at 1/8 scale too
    with Image.open(io.BytesIO(data)) as image:
        assert (image.format, image.size) == ("JPEG", (85, 64))
        small = np.asarray(image, dtype=np.int32)
    reference = np.asarray(gradient(2400, 1800).resize((85, 64), Image.Resampling.BICUBIC), dtype=np.int32)
    assert np.abs(small - reference).mean() < 3


def photo(seed: int, width: int = 500, height: int = 375) -> Image.Image:
    """Smooth colour fields, a hard-edged object, fine stripes and grain: detail a resize without its antialiasing
    filter aliases (nearest-neighbour lands at a mean error of 10-16 levels below, PSNR 19-23 dB)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([60 * np.sin(x * f + y * g) for f, g in rng.uniform(0.005, 0.06, (3, 2))], axis=2) + 128
    pixels[((y - height / 2) / 80) ** 2 + ((x - width / 3) / 120) ** 2 <= 1] += rng.uniform(-70, 70, 3)
    pixels[:, width * 2 // 3:] += 50 * np.sign(np.sin(x[:, width * 2 // 3:] * 2.2))[..., None]  # ~3 px stripes
    pixels += rng.normal(0, 4, pixels.shape)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


@pytest.mark.parametrize("size", [(500, 375), (375, 500), (333, 500), (1200, 900)])
def test_fast_resize_hits_the_size_and_looks_like_a_full_decode_then_resize(size):
    """--resize 256 through the fast path (training.jpegresize: reduced-DCT decode, torch's antialiased bilinear,
    libjpeg-turbo encode) gives the requested shorter side and the picture Pillow's full decode + bicubic resize of
    the same input gives, to within JPEG noise; the slow path's output is the reference."""
    from training import jpegresize

    original = encode(photo(sum(size), *size), quality=90)
    data, reason = prepare_image(original, Encoding(resize=256, quality=90))
    assert reason is None and jpegresize.available()
    target = resized_size(*size, 256)
    with Image.open(io.BytesIO(data)) as image:
        assert (image.format, image.mode, image.size, min(image.size)) == ("JPEG", "RGB", target, 256)
        fast = np.asarray(image, dtype=np.float32)
    with Image.open(io.BytesIO(original)) as image:
        reference = np.asarray(image.convert("RGB").resize(target, Image.Resampling.BICUBIC), dtype=np.float32)
    error = np.abs(fast - reference)
    assert error.mean() < 5, error.mean()  # 0-255 levels; measured 2.4-3.4 (Pillow's bilinear: 0.7-1.4)
    psnr = 10 * np.log10(255**2 / np.mean((fast - reference) ** 2))
    assert psnr > 31, psnr  # measured 34-38 dB
    assert abs(fast.mean() - reference.mean()) < 1  # no brightness or colour shift


@pytest.mark.parametrize(("size", "decoded"), [((500, 375), (500, 375)), ((1200, 900), (600, 450))])
def test_fast_resize_decodes_at_power_of_two_scales_only(monkeypatch, size, decoded):
    """Asked for the target size, simplejpeg would decode at libjpeg-turbo's smallest scale in eighths that covers
    it (3/4 of 500x375, 3/8 of 1200x900), which has no SIMD IDCT and runs slower than full size (bench/convert.py
    prints both); the fast path asks for the power-of-two size instead."""
    import simplejpeg

    shapes, decode_jpeg = [], simplejpeg.decode_jpeg

    def spy(data, **options):
        pixels = decode_jpeg(data, **options)
        shapes.append((pixels.shape[1], pixels.shape[0]))
        return pixels

    monkeypatch.setattr(simplejpeg, "decode_jpeg", spy)
    data, reason = prepare_image(encode(photo(1, *size), quality=90), Encoding(resize=256, quality=90))
    assert reason is None and shapes == [decoded]


@pytest.mark.parametrize(("size", "target"), [((500, 375), (341, 256)), ((375, 500), (256, 341)),
                                              ((300, 256), (280, 256)), ((256, 300), (256, 280))])
def test_fast_resize_rows_first_is_torchs_one_call_resize_to_a_level(size, target):
    """jpegresize.resize runs the vertical pass first (the cheaper order for torch's uint8 kernels); the picture
    is torch's own antialiased bilinear, to within one level of rounding of the intermediate rows."""
    import torch

    from training import jpegresize

    pixels = np.array(photo(3, *size))  # writable, as a decoder's output is
    ours = jpegresize.resize(pixels, target).astype(int)
    theirs = torch.nn.functional.interpolate(torch.from_numpy(pixels).permute(2, 0, 1)[None], size=target[::-1],
                                             mode="bilinear", antialias=True, align_corners=False)
    theirs = theirs[0].permute(1, 2, 0).numpy().astype(int)
    assert ours.shape == theirs.shape == (target[1], target[0], 3)
    assert np.abs(ours - theirs).max() <= 1 and np.abs(ours - theirs).mean() < 0.5


def test_resize_without_the_fast_path_takes_pillows(monkeypatch):
    from training import jpegresize

    monkeypatch.setattr(jpegresize, "_modules", lambda: None)
    original = encode(photo(1), quality=90)
    data, reason = prepare_image(original, Encoding(resize=256, quality=90))
    assert reason is None
    with Image.open(io.BytesIO(data)) as image:
        assert image.size == (341, 256)


def test_resizing_runs_torch_on_one_thread_then_gives_the_threads_back(converted, monkeypatch, tmp_path):
    """The converter's processes are one per core; torch's default of a thread per core in each of them made
    every resize wait on a descheduled partner thread (3.8-6 ms of CPU per image instead of 3.15 when another
    job held the other core)."""
    import torch

    from training import jpegresize

    threads, real = [], jpegresize._bilinear_aa
    monkeypatch.setattr(jpegresize, "_bilinear_aa", lambda *a: threads.append(torch.get_num_threads()) or real(*a))
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        convert(converted["folders"][0], tmp_path, shard_size=4, seed=5, resize=44, quality=80)
        assert threads and set(threads) == {1}
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_resize_shrinks_large_images_and_keeps_small_ones(converted, tmp_path):
    src, out, manifest = converted["folders"]
    resized = convert(src, tmp_path, shard_size=4, seed=5, resize=44, quality=80)
    stored = shard_samples(tmp_path, resized)
    originals = {p.stem: p.read_bytes() for p in src.rglob("*.JPEG")}
    assert {k: label for k, (_, label) in stored.items()} == expected_labels()
    assert resized["options"]["resize"] == 44 and resized["options"]["quality"] == 80
    kept = set()
    for key, (data, _) in stored.items():
        with Image.open(io.BytesIO(data)) as image, Image.open(io.BytesIO(originals[key])) as before:
            assert image.format == "JPEG" and image.mode == "RGB"
            if min(before.size) > 44:
                assert min(image.size) == 44
                assert abs(image.size[0] / image.size[1] - before.size[0] / before.size[1]) < 0.05
            else:
                assert image.size == before.size
            if data == originals[key]:
                kept.add(key)
    assert kept == {f"{SHARK}_1"}  # the one clean JPEG small enough passes through; the rest is re-encoded
    again = convert(src, tmp_path / "again", shard_size=4, seed=5, resize=44, quality=80)
    for entry in again["shards"]:
        assert (tmp_path / "again" / entry["name"]).read_bytes() == (tmp_path / entry["name"]).read_bytes()


# --- what a layout can get wrong ---------------------------------------------------------------------------


def test_a_broken_class_tar_is_rejected_and_the_rest_converted(tmp_path):
    good = {f"{TENCH}_1.JPEG": encode(noise(1)), f"{TENCH}_2.JPEG": encode(noise(2))}
    broken = tar_bytes({f"{GOLDFISH}_1.JPEG": encode(noise(3)), f"{GOLDFISH}_2.JPEG": encode(noise(4))})
    outer = tar_bytes({f"{TENCH}.tar": tar_bytes(good), f"{GOLDFISH}.tar": broken[:1024 + 700],
                       "README.txt": b"not a class"})
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ILSVRC2012_img_train.tar").write_bytes(outer)
    manifest = convert(tmp_path / "src", tmp_path / "out")
    assert set(shard_samples(tmp_path / "out", manifest)) == {f"{TENCH}_1", f"{TENCH}_2"}
    reasons = {r["path"]: r["reason"] for r in manifest["rejected"]}
    assert reasons["ILSVRC2012_img_train.tar/README.txt"] == "not a class tar (<wnid>.tar) at the top of the train tar"
    goldfish = [path for path in reasons if f"{GOLDFISH}.tar" in path]
    assert goldfish, reasons
    assert all(reasons[p].startswith(("unreadable class tar", "truncated")) for p in goldfish)
    assert manifest["classes"] == [TENCH, GOLDFISH]


def test_flat_val_files_without_a_label_are_rejected_not_guessed(tmp_path):
    src = tmp_path / "src"
    write_files(src / "val", {"ILSVRC2012_val_00000001.JPEG": encode(noise(1)),
                              "ILSVRC2012_val_00000002.JPEG": encode(noise(2))})
    write_files(src, {"LOC_val_solution.csv": loc_csv([(TENCH, "ILSVRC2012_val_00000001.JPEG", b"")])})
    manifest = convert(src, tmp_path / "out")
    assert manifest["rejected"] == [{"path": "val/ILSVRC2012_val_00000002.JPEG", "split": "val",
                                     "reason": "no label in LOC_val_solution.csv"}]
    assert manifest["splits"] == {"val": {"samples": 1, "shards": 1}}


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"LOC_val_solution.csv": b"id,label\nx,y\n"}, "LOC_val_solution.csv has no ImageId,PredictionString header"),
        ({"ILSVRC2012_devkit_t12.tar.gz": b"not a tar"}, "ILSVRC2012_devkit_t12.tar.gz is not a readable devkit"),
        ({"ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt": b"1\n",
          "ILSVRC2012_devkit_t12/data/meta.mat": b"garbage"}, "data/meta.mat is not the devkit's synset table"),
        ({"ILSVRC2012_img_val.tar": b"x" * 2000, "LOC_val_solution.csv": b"ImageId,PredictionString\n"},
         "ILSVRC2012_img_val.tar is not an uncompressed tar"),
    ],
)
def test_unreadable_labels_files_and_tars_stop_the_run_in_one_line(tmp_path, files, message):
    src = tmp_path / "src"
    write_files(src, files)
    if "ILSVRC2012_img_val.tar" not in files:
        write_files(src / "val", {"ILSVRC2012_val_00000001.JPEG": encode(noise(1))})
    with pytest.raises(ValueError) as raised:
        convert(src, tmp_path / "out")
    assert message in str(raised.value) and "\n" not in str(raised.value)


def test_an_image_too_large_to_decode_is_rejected_not_decoded():
    """A JPEG header claiming 40000x40000 px (1.6 Gpx): rejected with the reason, no 4.8 GB decode tried."""
    data = bytearray(encode(Image.new("RGB", (16, 16))))
    sof = data.index(b"\xff\xc0")
    data[sof + 5 : sof + 9] = (40000).to_bytes(2, "big") * 2
    with strict_decoding():
        assert prepare_image(bytes(data)) == (None, "image too large: 40000x40000 px is over 1073741824 px")
