"""The synthetic ILSVRC sample (training.sample) and the shard converter (training.convert)."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from PIL import Image

from training.convert import convert, merge_manifests
from training.sample import IMAGENET_WNIDS, SAMPLE_RECORD, make_sample, wnids
from training.shards import (
    class_index,
    load_manifest,
    plan_shards,
    shards_for_node,
    tar_end,
    tar_header,
    tar_member,
    tar_padding,
)

CLASSES, PER_CLASS, VAL_PER_CLASS, SAMPLE_SEED = 3, 4, 2, 7
SHARD_SIZE, SHUFFLE_SEED = 5, 3


@pytest.fixture(scope="module")
def sample(tmp_path_factory) -> tuple[Path, dict, int]:
    out = tmp_path_factory.mktemp("sample") / "ILSVRC2012"
    calls: list[None] = []
    summary = make_sample(
        out,
        classes=CLASSES,
        per_class=PER_CLASS,
        val_per_class=VAL_PER_CLASS,
        seed=SAMPLE_SEED,
        on_image=lambda: calls.append(None),
    )
    return out, summary, len(calls)


@pytest.fixture(scope="module")
def shards(sample, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("shards")
    return out, convert(sample[0], out, shard_size=SHARD_SIZE, seed=SHUFFLE_SEED)


def files_under(root: Path) -> dict[str, bytes]:
    """Every file under `root` (hidden ones too), by relative path."""
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def images_under(root: Path) -> dict[str, bytes]:
    """The sample's images (without its record, SAMPLE_RECORD), by relative path."""
    return {path: data for path, data in files_under(root).items() if path.endswith(".JPEG")}


def read_shard(path: Path) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(path) as tar:
        return [(m, tar.extractfile(m).read()) for m in tar.getmembers()]


def shard_samples(out: Path, manifest: dict) -> dict[str, tuple[bytes, int]]:
    """KEY -> (jpg bytes, class index) over every shard in the manifest."""
    samples = {}
    for entry in manifest["shards"]:
        members = read_shard(out / entry["name"])
        for (jpg, jpg_data), (cls, cls_data) in zip(members[::2], members[1::2], strict=True):
            key = jpg.name.removesuffix(".jpg")
            assert cls.name == f"{key}.cls"
            samples[key] = (jpg_data, int(cls_data.decode("ascii")))
    return samples


def jpeg(image: Image.Image, **options) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=90, **options)
    return buf.getvalue()


def noise_image(seed: int, size: int = 64) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8))


# ---------------------------------------------------------------------------------------------------------
# training.sample


def test_sample_has_the_ilsvrc2012_layout_and_names(sample):
    out, summary, images_reported = sample
    classes = list(IMAGENET_WNIDS[:CLASSES])
    expected = {f"train/{w}/{w}_{n}.JPEG" for w in classes for n in range(1, PER_CLASS + 1)}
    val_numbers = iter(range(1, CLASSES * VAL_PER_CLASS + 1))  # global, from 00000001
    expected |= {
        f"val/{w}/ILSVRC2012_val_{next(val_numbers):08d}.JPEG" for w in classes for _ in range(VAL_PER_CLASS)
    }

    expected.add(SAMPLE_RECORD)  # what the sample holds, for a later `launch data sample` into it
    assert set(files_under(out)) == expected  # nothing else, no temporary files left behind
    assert summary == {
        "classes": classes,
        "train": CLASSES * PER_CLASS,
        "val": CLASSES * VAL_PER_CLASS,
        "out": str(out),
    }
    assert images_reported == len(expected) - 1


def test_sample_images_are_rgb_jpegs_of_varied_imagenet_like_shapes(sample):
    sizes = set()
    for data in images_under(sample[0]).values():
        with Image.open(io.BytesIO(data)) as image:
            assert (image.format, image.mode) == ("JPEG", "RGB")
            width, height = image.size
        assert 64 <= min(width, height) <= 128
        assert 3 / 4 - 0.01 <= width / height <= 4 / 3 + 0.01
        sizes.add((width, height))
    assert len(sizes) > 10


def test_sample_wnids_are_real_then_synthetic_and_sorted():
    names = wnids(1000)
    assert names[:20] == list(IMAGENET_WNIDS[:20])
    assert names[:3] == ["n01440764", "n01443537", "n01484850"]
    assert len(set(names)) == 1000 and names == sorted(names)
    assert all(len(n) == 9 and n[0] == "n" and n[1:].isdigit() for n in names)
    assert names[len(IMAGENET_WNIDS)].startswith("n9")


def test_sample_default_val_count_is_a_fifth_but_at_least_two(tmp_path):
    assert make_sample(tmp_path / "a", classes=2, per_class=1)["val"] == 2 * 2
    assert make_sample(tmp_path / "b", classes=2, per_class=15)["val"] == 2 * 3


def test_sample_is_byte_identical_for_a_seed_and_differs_across_seeds(sample, tmp_path):
    args = {"classes": CLASSES, "per_class": PER_CLASS, "val_per_class": VAL_PER_CLASS}
    make_sample(tmp_path / "same", seed=SAMPLE_SEED, **args)
    make_sample(tmp_path / "other", seed=SAMPLE_SEED + 1, **args)
    first = files_under(sample[0])
    assert files_under(tmp_path / "same") == first
    other = files_under(tmp_path / "other")
    assert other.keys() == first.keys()
    assert all(other[path] != first[path] for path in first)


def test_sample_classes_are_separable_at_low_resolution(tmp_path):
    """A stand-in for "a small ResNet learns it": nearest class mean on 8x8 thumbnails beats chance by far."""
    classes = 10
    make_sample(tmp_path, classes=classes, per_class=12, val_per_class=4, seed=1)

    def features(split: str) -> tuple[np.ndarray, np.ndarray]:
        xs, ys = [], []
        for label, folder in enumerate(sorted((tmp_path / split).iterdir())):
            for path in sorted(folder.iterdir()):
                with Image.open(path) as image:
                    xs.append(np.asarray(image.resize((8, 8)), dtype=np.float32).ravel() / 255)
                ys.append(label)
        return np.stack(xs), np.array(ys)

    train_x, train_y = features("train")
    val_x, val_y = features("val")
    means = np.stack([train_x[train_y == c].mean(axis=0) for c in range(classes)])
    predicted = np.argmin(((val_x[:, None, :] - means[None]) ** 2).sum(axis=2), axis=1)
    assert (predicted == val_y).mean() >= 0.8


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"classes": 1, "per_class": 1}, "--classes must be between 2 and 1000, got 1"),
        ({"classes": 1001, "per_class": 1}, "--classes must be between 2 and 1000, got 1001"),
        ({"classes": 2, "per_class": 0}, "--per-class must be >= 1, got 0"),
        ({"classes": 2, "per_class": 1, "val_per_class": -1}, "--val-per-class must be >= 0, got -1"),
    ],
)
def test_sample_rejects_bad_options_in_one_line(tmp_path, options, message):
    with pytest.raises(ValueError) as raised:
        make_sample(tmp_path / "out", **options)
    assert str(raised.value) == message
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------------------------------------------------
# training.shards: pure helpers


def test_class_index_is_the_sorted_position():
    assert class_index(["n02", "n01", "n03", "n01"]) == {"n01": 0, "n02": 1, "n03": 2}


def test_plan_shards_shuffles_by_seed_and_cuts_every_sample_once():
    samples = list(range(23))
    planned = plan_shards(samples, 5, seed=1)
    assert [len(s) for s in planned] == [5, 5, 5, 5, 3]
    assert sorted(x for s in planned for x in s) == samples
    assert planned == plan_shards(samples, 5, seed=1)
    assert planned != plan_shards(samples, 5, seed=2)
    assert [x for s in planned for x in s] != samples


def test_shards_for_node_partitions_the_shards():
    assigned = [shards_for_node(10, i, 3) for i in range(3)]
    assert assigned == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    assert shards_for_node(2, 2, 3) == []


# ---------------------------------------------------------------------------------------------------------
# training.convert: shards and manifest


def source_labels(src: Path) -> dict[str, int]:
    """KEY -> class index, read off the class folders."""
    index = class_index([d.name for split in ("train", "val") for d in (src / split).iterdir()])
    return {p.stem: index[p.parent.name] for p in src.rglob("*.JPEG")}


def test_convert_labels_match_the_class_folders(sample, shards):
    out, manifest = shards
    labels = {key: label for key, (_, label) in shard_samples(out, manifest).items()}
    assert labels == source_labels(sample[0])
    assert manifest["classes"] == list(IMAGENET_WNIDS[:CLASSES])


def test_shards_have_fixed_tar_metadata_and_jpg_before_cls(shards):
    out, manifest = shards
    for entry in manifest["shards"]:
        members = read_shard(out / entry["name"])
        assert [m.name.rsplit(".", 1)[1] for m, _ in members] == ["jpg", "cls"] * entry["count"]
        for member, _ in members:
            assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (0, 0, 0, "", "")
            assert member.mode == 0o644 and member.isfile()


def tarfile_archive(members: list[tuple[str, bytes]]) -> bytes:
    """What Python's tarfile writes for ``members`` with tar_member's metadata in GNU format."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data in members:
            tar.addfile(tar_member(name, len(data)), io.BytesIO(data))
    return buf.getvalue()


@pytest.mark.parametrize("name", ["n01440764_10026.jpg", "n01440764_10026.cls", "a", "x" * 99, "x" * 100,
                                  "y" * 180, "caf\u00e9.jpg", "ILSVRC2012_val_00000001.jpg"])
def test_shard_tar_bytes_are_what_tarfile_writes(name):
    # The converter writes headers from a template (training.shards.tar_header); a reader sees tarfile's bytes.
    rng = np.random.default_rng(len(name))
    for size in (0, 1, 3, 511, 512, 513, 8704, 25_000):
        members = [(name, rng.integers(0, 256, size, dtype=np.uint8).tobytes()), ("k.cls", b"7")]
        ours = b"".join(tar_header(n, len(d)) + d + tar_padding(len(d)) for n, d in members)
        assert ours + tar_end(len(ours)) == tarfile_archive(members), (name, size)
    for size in (8**11 - 1, 8**11, 1 << 40):  # the 11-digit octal field's limit, then tarfile's base-256
        assert tar_header(name, size) == tar_member(name, size).tobuf(tarfile.GNU_FORMAT, "utf-8",
                                                                     "surrogateescape")


def test_shards_on_disk_are_byte_for_byte_what_tarfile_writes(shards):
    out, manifest = shards
    for entry in manifest["shards"]:
        members = [(m.name, data) for m, data in read_shard(out / entry["name"])]
        assert (out / entry["name"]).read_bytes() == tarfile_archive(members), entry["name"]


def test_webdataset_reads_every_shard(sample, shards):
    out, manifest = shards
    urls = [str(out / entry["name"]) for entry in manifest["shards"]]
    seen = {}
    for item in wds.WebDataset(urls, shardshuffle=False):
        assert {"jpg", "cls"} <= item.keys()
        with Image.open(io.BytesIO(item["jpg"])) as image:
            image.load()
        seen[item["__key__"]] = int(item["cls"])
    assert seen == source_labels(sample[0])


def test_manifest_describes_the_shards_on_disk(sample, shards):
    out, manifest = shards
    assert load_manifest(out) == manifest
    assert sorted(files_under(out)) == sorted([e["name"] for e in manifest["shards"]] + ["manifest.json"])
    assert [e["name"] for e in manifest["shards"]] == [
        "train-000000.tar", "train-000001.tar", "train-000002.tar", "val-000000.tar", "val-000001.tar",
    ]  # fmt: skip
    for entry in manifest["shards"]:
        data = (out / entry["name"]).read_bytes()
        assert entry["bytes"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest()
        assert entry["count"] == len(read_shard(out / entry["name"])) // 2
    assert manifest["splits"] == {
        "train": {"samples": CLASSES * PER_CLASS, "shards": 3},
        "val": {"samples": CLASSES * VAL_PER_CLASS, "shards": 2},
    }
    assert manifest["rejected"] == []
    assert manifest["options"] == {
        "shard_size": SHARD_SIZE, "seed": SHUFFLE_SEED, "resize": None, "quality": 95, "source": str(sample[0]),
        "layout": {"train": "train/", "val": "val/"}, "max_input_bytes": 256 << 20,
    }  # fmt: skip
    assert manifest["classes_without_train_images"] == []
    assert len(manifest["plan_sha256"]) == 64
    assert (manifest["format"], manifest["version"]) == ("webdataset", 1)


def test_clean_jpegs_pass_through_byte_for_byte(sample, shards):
    sources = {Path(path).stem: data for path, data in images_under(sample[0]).items()}
    stored = shard_samples(*shards)
    assert {key: jpg for key, (jpg, _) in stored.items()} == sources


def test_convert_is_byte_identical_for_the_same_input_and_shuffles_by_seed(sample, shards, tmp_path):
    calls: list[None] = []
    again = tmp_path / "again"
    convert(sample[0], again, shard_size=SHARD_SIZE, seed=SHUFFLE_SEED, on_sample=lambda: calls.append(None))
    assert files_under(again) == files_under(shards[0])
    assert len(calls) == CLASSES * (PER_CLASS + VAL_PER_CLASS)

    other = convert(sample[0], tmp_path / "reseeded", shard_size=SHARD_SIZE, seed=SHUFFLE_SEED + 1)
    first_shard = [m.name for m, _ in read_shard(tmp_path / "reseeded" / "train-000000.tar")]
    assert first_shard != [m.name for m, _ in read_shard(shards[0] / "train-000000.tar")]
    assert other["splits"] == shards[1]["splits"]


@pytest.fixture(scope="module")
def quirky_source(tmp_path_factory) -> Path:
    """A small ILSVRC tree with the inputs real downloads contain besides clean JPEGs."""
    src = tmp_path_factory.mktemp("quirky")
    tench, goldfish = src / "train" / "n01440764", src / "train" / "n01443537"
    val = src / "val" / "n01443537"
    for folder in (tench, goldfish, val):
        folder.mkdir(parents=True)
    red = Image.new("RGB", (48, 40), (220, 30, 30))
    png = io.BytesIO()
    red.save(png, format="PNG")
    truncated = jpeg(noise_image(1))
    files = {
        tench / "n01440764_1.JPEG": jpeg(noise_image(2)),
        tench / "n01440764_2.JPEG": jpeg(noise_image(3), progressive=True),
        tench / "n01440764_3.JPEG": png.getvalue(),  # a PNG named .JPEG
        tench / "n01440764_4.JPEG": jpeg(red.convert("CMYK")),
        tench / "n01440764_5.JPEG": jpeg(noise_image(4).convert("L")),
        tench / "n01440764_6.JPEG": truncated[: len(truncated) // 2],
        tench / "n01440764_7.JPEG": b"",
        goldfish / "n01443537_1.JPEG": jpeg(noise_image(5)),
        val / "ILSVRC2012_val_00000001.JPEG": jpeg(noise_image(6)),
    }
    for path, data in files.items():
        path.write_bytes(data)
    return src


def test_quirky_inputs_are_reencoded_or_rejected_with_a_reason(quirky_source, tmp_path):
    src = quirky_source
    manifest = convert(src, tmp_path, shard_size=3)
    stored = shard_samples(tmp_path, manifest)

    assert manifest["rejected"] == [
        {
            "path": "train/n01440764/n01440764_6.JPEG",
            "split": "train",
            "reason": manifest["rejected"][0]["reason"],
        },
        {"path": "train/n01440764/n01440764_7.JPEG", "split": "train", "reason": "empty file"},
    ]
    assert manifest["rejected"][0]["reason"].startswith("truncated or corrupt image: image file is truncated")
    # Nothing dropped silently: every input is either a sample or a rejection.
    assert len(stored) + len(manifest["rejected"]) == len(list(src.rglob("*.JPEG")))
    assert set(stored) == {p.stem for p in src.rglob("*.JPEG")} - {"n01440764_6", "n01440764_7"}

    for key in ("n01440764_1", "n01440764_2", "n01443537_1", "ILSVRC2012_val_00000001"):
        original = next(src.rglob(f"{key}.JPEG")).read_bytes()
        assert stored[key][0] == original  # baseline and progressive RGB JPEGs pass through
    for key in ("n01440764_3", "n01440764_4", "n01440764_5"):
        data, label = stored[key]
        assert label == 0
        with Image.open(io.BytesIO(data)) as image:
            assert (image.format, image.mode) == ("JPEG", "RGB")
            pixels = np.asarray(image, dtype=np.int32)
        if key != "n01440764_5":  # PNG and CMYK were solid red: colours survive, not inverted
            assert np.abs(pixels - [220, 30, 30]).max() <= 12
    assert stored["n01443537_1"][1] == 1 and stored["ILSVRC2012_val_00000001"][1] == 1
    assert manifest["splits"] == {"train": {"samples": 6, "shards": 3}, "val": {"samples": 1, "shards": 1}}


def test_files_the_listing_cannot_use_are_rejected_and_a_flat_val_folder_is_refused(tmp_path):
    src = tmp_path / "src"
    tench = src / "train" / "n01440764"
    (tench / "extra").mkdir(parents=True)
    image = jpeg(noise_image(7))
    for path in ("n01440764_1.JPEG", "n01440764_1.jpg", "n01440764_2.v2.JPEG", "extra/n01440764_3.JPEG"):
        (tench / path).write_bytes(image)
    (src / "train" / "README.txt").write_text("stray")

    manifest = convert(src, tmp_path / "out")
    assert manifest["splits"] == {"train": {"samples": 1, "shards": 1}}
    assert [(r["path"], r["reason"]) for r in manifest["rejected"]] == [
        ("train/README.txt", "outside a class folder"),
        ("train/n01440764/extra/n01440764_3.JPEG", "in a subfolder of its class folder"),
        ("train/n01440764/n01440764_1.jpg", "duplicate key: same stem as train/n01440764/n01440764_1.JPEG"),
        ("train/n01440764/n01440764_2.v2.JPEG", "file stem contains '.', which would split the key"),
    ]

    (src / "val").mkdir()
    (src / "val" / "ILSVRC2012_val_00000001.JPEG").write_bytes(image)  # the download's flat val/ folder
    with pytest.raises(
        ValueError, match=r"^val/ holds validation images without class folders and SRC has no labels file; "
        r"put LOC_val_solution.csv or the devkit \(ILSVRC2012_devkit_t12.tar.gz\) in "
    ):
        convert(src, tmp_path / "out")


def test_three_nodes_write_disjoint_shards_that_merge_into_the_single_node_manifest(sample, tmp_path):
    options = {"shard_size": 2, "seed": SHUFFLE_SEED}
    single = convert(sample[0], tmp_path / "single", **options)
    shared = tmp_path / "shared"
    parts = []
    for node in range(3):
        if node == 2:
            with pytest.raises(ValueError, match="node 2 of 3 has not finished"):
                merge_manifests(shared, 3)
        parts.append(convert(sample[0], shared, node_index=node, node_count=3, **options))

    names = [{e["name"] for e in part["shards"]} for part in parts]
    assert all(a.isdisjoint(b) for i, a in enumerate(names) for b in names[i + 1 :])
    assert set().union(*names) == {e["name"] for e in single["shards"]}
    assert not (shared / "manifest.json").exists()

    merged = merge_manifests(shared, 3)
    assert merged == single
    assert load_manifest(shared) == single
    for entry in single["shards"]:
        assert (shared / entry["name"]).read_bytes() == (tmp_path / "single" / entry["name"]).read_bytes()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"shard_size": 0}, "--shard-size must be >= 1, got 0"),
        ({"node_count": 0}, "--node-count must be >= 1, got 0"),
        ({"node_index": 3, "node_count": 3}, "--node-index must be between 0 and 2 (--node-count 3), got 3"),
        ({"node_index": -1, "node_count": 3}, "--node-index must be between 0 and 2 (--node-count 3), got -1"),
        ({"resize": 0}, "--resize must be >= 1, got 0"),
        ({"quality": 101}, "--quality must be between 1 and 100, got 101"),
        ({"quality": 0}, "--quality must be between 1 and 100, got 0"),
        ({"workers": 0}, "--workers must be >= 1, got 0"),
        ({"seed": -1}, "--seed must be >= 0, got -1"),
    ],
)
def test_convert_rejects_bad_options_in_one_line(sample, tmp_path, options, message):
    with pytest.raises(ValueError) as raised:
        convert(sample[0], tmp_path / "out", **options)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
    assert not (tmp_path / "out").exists()


def test_convert_rejects_a_missing_or_empty_source(tmp_path):
    with pytest.raises(ValueError, match=r"^SRC .*nowhere does not exist$"):
        convert(tmp_path / "nowhere", tmp_path / "out")
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"^no ImageNet under SRC .*: expected train/<wnid>/ or val/ folders, "
                                         r"ILSVRC2012_img_train.tar or ILSVRC2012_img_val.tar$"):
        convert(tmp_path / "empty", tmp_path / "out")


def test_load_manifest_explains_a_missing_or_broken_manifest_in_one_line(shards, tmp_path):
    with pytest.raises(ValueError, match="manifest.json not found"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not valid JSON"):
        load_manifest(tmp_path)
    broken = (shards[0] / "manifest.json").read_text().replace('"sha256"', '"sha1"', 1)
    (tmp_path / "manifest.json").write_text(broken)
    with pytest.raises(ValueError, match=r"not a valid shard manifest: shards\.0\.sha256: Field required$"):
        load_manifest(tmp_path)
