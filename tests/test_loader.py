"""The shard loader and its transforms: rank splits, worker batching, exact validation, uint8 NCHW batches.

Samples are solid colours, one per sample, so a batch tells which samples it holds whatever the crop.
"""

from __future__ import annotations

import io
import random
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from training.convert import convert
from training.loader import DataError, load_manifest, make_loader, rank_shards, shards_of, steps_per_epoch
from training.shards import tar_member
from training.transforms import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    center_crop_box,
    dct_scale,
    normalize,
    random_resized_crop_box,
    train_transform,
    val_transform,
)

WNIDS = ("n01440764", "n01443537", "n01484850")
TRAIN, VAL, SIZE = 46, 17, 24


def colour(i: int) -> tuple[int, int, int]:
    """Sample i's colour: 64 well-separated colours, far apart enough to survive JPEG and resizing."""
    return 20 + 70 * (i % 4), 20 + 70 * (i // 4 % 4), 20 + 70 * (i // 16 % 4)


def identify(images: torch.Tensor) -> list[int]:
    """Which sample each image of a uint8 NCHW batch is, from its mean colour."""
    palette = torch.tensor([colour(i) for i in range(64)], dtype=torch.float32)
    means = images.float().mean(dim=(2, 3))
    return torch.cdist(means, palette).argmin(dim=1).tolist()


def jpeg(image: Image.Image, quality: int = 95) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="JPEG", quality=quality)
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> tuple[Path, dict, dict[int, int]]:
    """Shards of TRAIN + VAL solid-colour samples of assorted sizes; sample id -> label."""
    root = tmp_path_factory.mktemp("loader")
    labels = {}
    rng = np.random.default_rng(0)
    for i in range(TRAIN + VAL):
        split = "train" if i < TRAIN else "val"
        label = i % 3
        width, height = int(rng.integers(30, 90)), int(rng.integers(30, 90))
        folder = root / "src" / split / WNIDS[label]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"s{i:03d}.JPEG").write_bytes(jpeg(Image.new("RGB", (width, height), colour(i))))
        labels[i] = label
    return root / "out", convert(root / "src", root / "out", shard_size=5, seed=2), labels


def batches(out: Path, shards: list[dict], train: bool, batch: int, workers: int, epoch: int = 0, rank: int = 0):
    return list(make_loader(out, shards, SIZE, batch, train, seed=7, epoch=epoch, rank=rank, workers=workers))


@pytest.mark.parametrize("workers", [0, 2])
def test_each_rank_reads_its_shards_and_the_job_sees_every_sample_once(shards, workers):
    out, manifest, labels = shards
    train = shards_of(load_manifest(out), "train")
    world, batch = 3, 4
    seen = Counter()
    for rank in range(world):
        mine = rank_shards(train, rank, world)
        held = sum(s["count"] for s in mine)
        got = batches(out, mine, True, batch, workers, rank=rank)
        # Full batches only, and as many as the rank's samples make, whatever the number of workers.
        assert [len(labels_) for _, labels_ in got] == [batch] * (held // batch)
        assert len(got) >= steps_per_epoch(train, world, batch)
        for images, batch_labels in got:
            ids = identify(images)
            assert batch_labels.tolist() == [labels[i] for i in ids]
            seen.update(ids)
        # With a batch of 1 nothing is left out: exactly this rank's samples.
        whole = Counter(i for images, _ in batches(out, mine, True, 1, workers, rank=rank) for i in identify(images))
        assert sum(whole.values()) == held and set(whole.values()) == {1}
        assert not whole.keys() & {i for r in range(rank) for i in rank_ids(out, train, r, world, workers)}
    assert max(seen.values()) == 1
    covered = set()
    for r in range(world):
        covered |= rank_ids(out, train, r, world, workers)
    assert covered == set(range(TRAIN))


def rank_ids(out: Path, train: list[dict], rank: int, world: int, workers: int) -> set[int]:
    mine = rank_shards(train, rank, world)
    return {i for images, _ in batches(out, mine, True, 1, workers, rank=rank) for i in identify(images)}


@pytest.mark.parametrize(("world", "workers"), [(1, 0), (2, 2), (3, 1)])
def test_validation_covers_exactly_the_validation_set_once(shards, world, workers):
    out, manifest, labels = shards
    val = shards_of(manifest, "val")
    ids, count = [], 0
    for rank in range(world):
        for images, batch_labels in batches(out, rank_shards(val, rank, world), False, 4, workers, rank=rank):
            ids += identify(images)
            count += len(batch_labels)
            assert batch_labels.tolist() == [labels[i] for i in identify(images)]
    assert count == manifest["splits"]["val"]["samples"] == VAL  # the short last batch counted, no padding
    assert sorted(ids) == list(range(TRAIN, TRAIN + VAL))


def test_training_order_is_seeded_and_changes_every_epoch(shards):
    out, manifest, _ = shards
    train = shards_of(manifest, "train")

    def order(epoch: int) -> list[int]:
        return [i for images, _ in batches(out, train, True, 2, 2, epoch=epoch) for i in identify(images)]

    assert order(0) == order(0)
    assert order(0) != order(1) and sorted(order(0)) == sorted(order(1))


def test_batches_are_uint8_nchw_views_of_nhwc_memory_and_normalize_on_the_device(shards):
    out, manifest, _ = shards
    images, labels = batches(out, shards_of(manifest, "train"), True, 4, 0)[0]
    assert images.dtype == torch.uint8 and images.shape == (4, 3, SIZE, SIZE)
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert labels.dtype == torch.int64 and labels.shape == (4,)
    mean = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    expected = (images.float() - mean) / std
    for memory_format in (torch.contiguous_format, torch.channels_last):
        x = normalize(images, memory_format)
        assert x.dtype == torch.float32 and x.is_contiguous(memory_format=memory_format)
        assert torch.allclose(x, expected)
    with pytest.raises(ValueError, match=r"takes uint8 NCHW images with 3 channels, got shape \(4, 24, 24, 3\)"):
        normalize(images.permute(0, 2, 3, 1))


# --- transforms --------------------------------------------------------------------------------------------


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def test_center_crop_geometry_is_torchvisions():
    assert center_crop_box(500, 375, 224) == ((341, 256), (58, 16, 282, 240))
    assert center_crop_box(375, 500, 224) == ((256, 341), (16, 58, 240, 282))
    assert center_crop_box(333, 500, 224) == ((256, 384), (16, 80, 240, 304))  # 384.38 truncated, not rounded
    assert center_crop_box(300, 300, 32) == ((37, 37), (2, 2, 34, 34))  # 32 * 256 / 224 = 36.6 -> 37
    assert center_crop_box(120, 90, 160) == ((244, 183), (42, 12, 202, 172))  # enlarged: shorter side 183


@pytest.mark.parametrize(("width", "height", "size"), [(500, 375, 224), (375, 500, 224), (333, 500, 224),
                                                       (1024, 683, 224), (90, 60, 32), (47, 61, 40)])
def test_validation_transform_is_resize_then_center_crop_pixel_for_pixel(width, height, size):
    data = jpeg(noise(width, height), quality=90)
    decoded = Image.open(io.BytesIO(data)).convert("RGB")
    short = round(size * 256 / 224)
    new = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
    left, top = int(round((new[0] - size) / 2)), int(round((new[1] - size) / 2))
    reference = decoded.resize(new, Image.Resampling.BILINEAR).crop((left, top, left + size, top + size))
    got = val_transform(data, size)
    assert got.dtype == torch.uint8 and got.shape == (size, size, 3)
    assert np.array_equal(got.numpy(), np.asarray(reference))


def test_dct_scale_is_the_largest_reduction_that_still_covers_the_crop():
    assert dct_scale(447, 900, 224) == 1
    assert dct_scale(448, 448, 224) == 2
    assert dct_scale(900, 1000, 224) == 4
    assert dct_scale(1792, 1800, 224) == 8
    assert dct_scale(5000, 5000, 224) == 8
    assert dct_scale(100, 100, 32) == 2


@pytest.mark.parametrize(("width", "height", "size"), [(500, 375, 224), (1600, 1200, 224), (1600, 1200, 64)])
def test_training_transform_is_the_random_resized_crop_of_the_full_image(width, height, size):
    """Decoding at a reduced DCT scale and resizing the crop in torch match PIL on the full image closely."""
    x = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None, None]
    smooth = np.concatenate([x + 0 * y, y + 0 * x, 255 - (x + y) / 2], axis=2).astype(np.uint8)
    data = jpeg(Image.fromarray(smooth))
    full = Image.open(io.BytesIO(data)).convert("RGB")
    flips = 0
    for seed in range(12):
        left, top, w, h = random_resized_crop_box(width, height, random.Random(seed))
        reference = np.asarray(full.resize((size, size), Image.Resampling.BILINEAR,
                                           box=(left, top, left + w, top + h)), dtype=np.float32)
        got = train_transform(data, size, random.Random(seed)).numpy().astype(np.float32)
        assert got.shape == (size, size, 3)
        plain, flipped = np.abs(got - reference).mean(), np.abs(got[:, ::-1] - reference).mean()
        assert min(plain, flipped) < 2.5, (seed, plain, flipped)
        flips += flipped < plain
    assert 2 <= flips <= 10


def test_a_bad_shard_or_sample_is_a_one_line_data_error(tmp_path):
    def shard(name: str, members: dict[str, bytes]) -> dict:
        with tarfile.open(tmp_path / name, "w") as tar:
            for member, data in members.items():
                tar.addfile(tar_member(member, len(data)), io.BytesIO(data))
        return {"name": name, "split": "val", "count": 1}

    good = jpeg(Image.new("RGB", (40, 40), (1, 2, 3)))
    cases = {
        "no-cls.tar": ({"a.jpg": good}, "no-cls.tar: samples without both .jpg and .cls: a"),
        "garbage.tar": ({"b.jpg": b"not an image", "b.cls": b"0"}, "garbage.tar: b.jpg cannot be decoded: "),
    }
    for name, (members, message) in cases.items():
        for train in (False, True):
            with pytest.raises(DataError) as raised:
                batches(tmp_path, [shard(name, members)], train, 1, 0)
            assert str(raised.value).startswith(message) and "\n" not in str(raised.value)
    (tmp_path / "cut.tar").write_bytes((tmp_path / "garbage.tar").read_bytes()[:700])
    with pytest.raises(DataError, match="^cut.tar: unreadable shard: "):
        batches(tmp_path, [{"name": "cut.tar", "count": 1}], False, 1, 0)


def test_images_libjpeg_turbo_cannot_take_go_through_pillow():
    """Shards from elsewhere may hold a PNG or a CMYK JPEG: decoded by Pillow, reduced the same way."""
    red = Image.new("RGB", (900, 700), (220, 30, 30))
    png, cmyk = io.BytesIO(), io.BytesIO()
    red.save(png, format="PNG")
    red.convert("CMYK").save(cmyk, format="JPEG", quality=95)
    for data in (png.getvalue(), cmyk.getvalue()):
        for seed in range(4):
            out = train_transform(data, 32, random.Random(seed)).numpy().astype(np.int32)
            assert out.shape == (32, 32, 3) and np.abs(out - (220, 30, 30)).max() <= 12
        assert np.abs(val_transform(data, 32).numpy().astype(np.int32) - (220, 30, 30)).max() <= 12
