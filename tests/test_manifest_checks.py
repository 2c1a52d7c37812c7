"""The trainer trusts nothing it reads (issue 33 item 5): the manifest is checked whole before the first step (names,
counts, splits, classes), each shard against its manifest entry as it is read (its size before a byte, its labels as
they come, its count at its end), and images decode up to the converter's own pixel limit."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest
from PIL import Image

from training import shards as shard_format
from training.convert import convert
from training.loader import DataError, ShardRef, load_manifest, make_loader, read_shard, shards_of
from training.sample import make_sample
from training.shards import tar_member

WNIDS = ("n01440764", "n01443537", "n01484850")


def jpeg(colour: tuple[int, int, int], size=(40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, colour).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """3 classes, 12 training and 6 validation images, in shards of 4."""
    root = tmp_path_factory.mktemp("manifest")
    make_sample(root / "src", classes=3, per_class=4, val_per_class=2, seed=1)
    convert(root / "src", root / "out", shard_size=4, seed=1)
    return root / "out"


@pytest.fixture
def data(converted, tmp_path) -> Path:
    """A copy of the converted shards to change."""
    return Path(shutil.copytree(converted, tmp_path / "data"))


def edit(data: Path, change) -> None:
    path = data / "manifest.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def first(manifest: dict, split: str = "train") -> dict:
    return next(s for s in manifest["shards"] if s["split"] == split)


@pytest.mark.parametrize(("change", "said"), [
    (lambda m: first(m).update(count="4"), "shards.0.count: Input should be a valid integer"),
    (lambda m: first(m).update(count=4.0), "shards.0.count: Input should be a valid integer"),
    (lambda m: first(m).update(count=True), "shards.0.count: Input should be a valid integer"),
    (lambda m: first(m).update(count=0), "shards.0.count: Input should be greater than or equal to 1"),
    (lambda m: first(m).update(count=-3), "shards.0.count: Input should be greater than or equal to 1"),
    (lambda m: first(m).update(split="test", name="test-000000.tar"), "shards.0.split: Input should be 'train' or "
                                                                      "'val'"),
    (lambda m: m["splits"].update(test={"samples": 1, "shards": 1}), "splits.test.[key]: Input should be 'train'"),
    (lambda m: first(m).update(name="../train-000000.tar"), "shards.0: shard name '../train-000000.tar' is not "
                                                            "train-NNNNNN.tar"),
    (lambda m: first(m).update(name="/etc/train-000000.tar"), "shards.0: shard name '/etc/train-000000.tar' is not"),
    (lambda m: first(m).update(name="val-000000.tar"), "shard name 'val-000000.tar' is not train-NNNNNN.tar"),
    (lambda m: m["shards"].append(dict(first(m))), "shards: shard train-000000.tar is listed twice"),
    (lambda m: m.update(classes=[]), "classes: List should have at least 1 item"),
    (lambda m: m.update(classes=["n01440764", "n01443537", "n01440764"]), "classes: class 'n01440764' is listed "
                                                                          "twice"),
])
def test_a_manifest_that_lies_is_refused_in_one_line_naming_the_field(data, change, said):
    edit(data, change)
    with pytest.raises(DataError) as error:
        load_manifest(data)
    message = str(error.value)
    assert message.startswith(f"{data / 'manifest.json'} is not a valid shard manifest: ") and said in message
    assert "\n" not in message


def test_the_converters_own_manifest_passes_and_the_trainer_needs_two_classes(data):
    manifest = load_manifest(data, training=True)  # 3 classes: the other side of the boundary
    assert len(manifest["classes"]) == 3 and len(shards_of(manifest, "train")) == 3
    edit(data, lambda m: m.update(classes=m["classes"][:2]))
    assert len(load_manifest(data, training=True)["classes"]) == 2
    edit(data, lambda m: m.update(classes=m["classes"][:1]))
    assert load_manifest(data)["classes"] == [WNIDS[0]]  # the format allows one class; training does not
    with pytest.raises(DataError, match=r"classes: 1 class\(es\); training needs at least 2"):
        load_manifest(data, training=True)


def test_a_manifest_that_is_a_directory_or_not_text_is_one_line(tmp_path):
    (tmp_path / "manifest.json").mkdir()
    with pytest.raises(DataError, match=r"manifest.json cannot be read as the shards' manifest: Is a directory$"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").rmdir()
    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DataError, match=r"cannot be read as the shards' manifest: UnicodeDecodeError$"):
        load_manifest(tmp_path)


def shard_ref(data: Path, entry: dict, classes: int = 3, **changes) -> ShardRef:
    return ShardRef(data / entry["name"], entry["count"], entry["bytes"], classes)._replace(**changes)


def test_a_shard_is_held_to_its_manifest_entry(data):
    entry = first(load_manifest(data))
    assert len(list(read_shard(shard_ref(data, entry)))) == entry["count"] == 4
    with pytest.raises(DataError, match=r"^train-000000.tar: holds 4 samples where the manifest says 5; convert"):
        list(read_shard(shard_ref(data, entry, count=5)))
    with pytest.raises(DataError, match=r"^train-000000.tar: holds 4 samples where the manifest says 3; convert"):
        list(read_shard(shard_ref(data, entry, count=3)))
    with pytest.raises(DataError, match=rf"^train-000000.tar: {entry['bytes']} bytes where the manifest says "
                                        rf"{entry['bytes'] + 1}: the shard changed after conversion"):
        next(read_shard(shard_ref(data, entry, bytes=entry["bytes"] + 1)))  # before a sample is read


def write_shard(path: Path, labels: list[bytes]) -> int:
    with tarfile.open(path, "w") as tar:
        for i, label in enumerate(labels):
            for ext, payload in (("jpg", jpeg((10, 10, 10))), ("cls", label)):
                tar.addfile(tar_member(f"k{i}.{ext}", len(payload)), io.BytesIO(payload))
    return path.stat().st_size


@pytest.mark.parametrize(("label", "ok"), [(b"0", True), (b"2", True), (b"3", False), (b"-1", False)])
def test_labels_are_range_checked_as_they_are_read(tmp_path, label, ok):
    size = write_shard(tmp_path / "train-000000.tar", [b"1", label])
    ref = ShardRef(tmp_path / "train-000000.tar", 2, size, 3)
    if ok:
        assert [x[2] for x in read_shard(ref)] == [1, int(label)]
        return
    with pytest.raises(DataError, match=rf"^train-000000.tar: k1.cls is {int(label)}, outside the manifest's 3 "
                                        r"classes \(0 to 2\)$"):
        list(read_shard(ref))


def test_the_trainers_loader_checks_counts_and_labels_from_the_manifest(data):
    manifest = load_manifest(data)
    train = shards_of(manifest, "train")
    wrong = [dict(train[0], count=train[0]["count"] + 1), *train[1:]]
    with pytest.raises(DataError, match="holds 4 samples where the manifest says 5"):
        list(make_loader(data, wrong, 16, 2, train=True, seed=0, epoch=0, rank=0, workers=0))
    with pytest.raises(DataError, match=r"\.cls is 2, outside the manifest's 2 classes"):
        list(make_loader(data, train, 16, 2, train=False, seed=0, epoch=0, rank=0, workers=0, num_classes=2))
    assert sum(len(y) for _, y in make_loader(data, train, 16, 2, train=False, seed=0, epoch=0, rank=0, workers=0,
                                              num_classes=3)) == 12


def test_the_loader_decodes_what_the_converter_accepts(tmp_path, monkeypatch):
    """The converter takes images up to shards.MAX_PIXELS (1 Gpx); Pillow's own limit (89 Mpx: a warning, twice
    that: DecompressionBombError) stopped training mid-epoch on such an image. The loader's decoding process runs
    under the converter's limit."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", Image.MAX_IMAGE_PIXELS)  # restored after the test
    size = write_shard(tmp_path / "val-000000.tar", [b"0"])
    loader = make_loader(tmp_path, [{"name": "val-000000.tar", "count": 1, "bytes": size}], 16, 1, train=False,
                         seed=0, epoch=0, rank=0, workers=0, num_classes=1)
    Image.MAX_IMAGE_PIXELS = 1000  # a stricter limit than the image's 1,200 px, as Pillow's is for a huge image
    assert [len(y) for _, y in loader] == [1]
    assert Image.MAX_IMAGE_PIXELS == shard_format.MAX_PIXELS
