"""--decode gpu without a GPU: the loader's encoded batches, the crop/resize/flip and the prefetching thread, with a
CPU decoder (libjpeg-turbo) standing in for nvJPEG on device "cpu". tests/test_gpu.py runs the same path with
nvJPEG on a device machine; here every decision around the decoder is checked.

What a real GPU would do differently, and where it is seen: nvJPEG decodes with its own IDCT (a pixel or two apart
from libjpeg-turbo's) and refuses CMYK; the thread's CUDA stream and event ordering exist only there
(tests/test_gpu.py, bench/gpu.py)."""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import simplejpeg
import torch
from PIL import Image

from training import gpudecode
from training.loader import DataError, EncodedBatch, encoded_batch, join, load_manifest, make_loader, part, shards_of
from training.transforms import random_resized_crop_box, train_geometry, train_transform

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")


def cpu_decoder(jpegs: list[torch.Tensor]) -> list[torch.Tensor]:
    """nvJPEG's stand-in: full-size RGB CHW, one list in, one list out; refuses what libjpeg-turbo refuses."""
    try:
        return [torch.from_numpy(simplejpeg.decode_jpeg(j.numpy().tobytes(), colorspace="RGB")).permute(2, 0, 1)
                for j in jpegs]
    except ValueError as e:
        raise RuntimeError(f"nvjpeg stand-in: {e}") from None


def jpeg(width: int, height: int, seed: int = 0, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([(x * 255 // width), (y * 255 // height), ((x + y) * 3) % 256], axis=-1).astype(np.uint8)
    pixels[: height // 3, : width // 4] = rng.integers(0, 255, 3)  # an asymmetric patch: a flip shows
    buf = io.BytesIO()
    Image.fromarray(pixels).convert(mode).save(buf, format="JPEG", quality=95)
    return buf.getvalue()


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    from training.convert import convert
    from training.sample import make_sample

    root = tmp_path_factory.mktemp("gpudecode")
    make_sample(root / "raw", classes=3, per_class=30, val_per_class=4)
    # Smooth images of several sizes in place of the sample's noisy ones: two decoders (reduced DCT and fast IDCT
    # on the CPU path, full decode here) then agree to a few levels, and a wrong box or flip stands out.
    rng = random.Random(0)
    for i, path in enumerate(sorted((root / "raw").rglob("*.JPEG"))):
        path.write_bytes(jpeg(rng.randint(60, 400), rng.randint(60, 300), i))
    convert(root / "raw", root / "shards", shard_size=16, workers=1)
    return root / "shards"


def test_train_geometry_draws_what_train_transform_draws():
    data = jpeg(300, 200)
    a, b = random.Random(7), random.Random(7)
    width, height, box, flip = train_geometry(data, a)
    assert (width, height) == (300, 200)
    c = random.Random(7)
    assert box == random_resized_crop_box(300, 200, c) and flip == (c.random() < 0.5)
    train_transform(data, 32, b)
    assert a.getstate() == b.getstate() == c.getstate()  # the same draws, in the same order


def test_encoded_batches_split_and_join_without_losing_a_byte():
    files = [b"a" * 3, b"bb" * 5, b"c", b"d" * 7]
    batch = encoded_batch(["s:0", "s:1", "s:2", "s:3"], files, [(i, i, 1, 1, i % 2) for i in range(4)])
    assert [bytes(j.numpy()) for j in batch.jpegs()] == files and all(j.is_contiguous() for j in batch.jpegs())
    head, tail = part(batch, 0, 3), part(batch, 3)
    assert head.sizes == [3, 10, 1] and bytes(tail.data.numpy()) == b"d" * 7 and tail.keys == ["s:3"]
    again = join([tail, head])
    assert [bytes(j.numpy()) for j in again.jpegs()] == files[3:] + files[:3]
    assert again.geometry[:, 0].tolist() == [3, 0, 1, 2]
    empty = encoded_batch([], [], [])
    assert empty.data.numel() == 0 and empty.geometry.shape == (0, 5)


def test_crop_resize_flip_matches_the_cpu_resize_and_flips_exactly_the_flagged():
    image = torch.from_numpy(simplejpeg.decode_jpeg(jpeg(120, 90), colorspace="RGB")).permute(2, 0, 1)
    geometry = torch.tensor([[10, 5, 60, 40, 0], [10, 5, 60, 40, 1], [0, 0, 120, 90, 0]])
    out = gpudecode.crop_resize_flip([image, image, image], geometry, 32)
    assert out.dtype == torch.uint8 and out.shape == (3, 3, 32, 32)
    assert out.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(out[1], out[0].flip(2)) and not torch.equal(out[0], out[1])
    # The CPU path's resize (uint8, antialiased bilinear) of the same crop: a rounding apart.
    crop = image[None, :, 5:45, 10:70]
    reference = torch.nn.functional.interpolate(crop, size=(32, 32), mode="bilinear", antialias=True)[0]
    assert (out[0].int() - reference.int()).abs().max() <= 1


def test_a_box_past_the_decoded_image_stays_inside_it():
    image = torch.full((3, 20, 30), 200, dtype=torch.uint8)
    out = gpudecode.crop_resize_flip([image], torch.tensor([[40, 25, 10, 10, 0]]), 8)  # a header that lied
    assert out.shape == (1, 3, 8, 8) and int(out.min()) == 200


def test_gpu_path_yields_the_cpu_paths_samples_crops_and_flips(shards):
    data = load_manifest(shards)
    train = shards_of(data, "train")
    kwargs = dict(seed=3, epoch=1, rank=0, workers=2)
    cpu = list(make_loader(shards, train, 24, 8, True, **kwargs))
    encoded = make_loader(shards, train, 24, 8, True, decode="gpu", **kwargs)
    raw = list(encoded)
    assert all(isinstance(images, EncodedBatch) and len(images.sizes) == 8 for images, _ in raw)
    gpu = list(gpudecode.GpuBatches(encoded, 24, CPU, decode=cpu_decoder))
    assert len(gpu) == len(cpu) == 90 // 8
    for (a, la), (b, lb) in zip(cpu, gpu, strict=True):
        assert torch.equal(la, lb)  # same samples, same order
        assert a.shape == b.shape == (8, 3, 24, 24) and b.dtype == torch.uint8
        # Same boxes and flips; the CPU path decodes at a reduced DCT scale with the fast IDCT, so pixels differ a
        # little. A wrong flip or box would differ by tens of levels on these images.
        same = (a.float() - b.float()).abs().mean(dim=(1, 2, 3))
        flipped = (a.float() - b.flip(3).float()).abs().mean(dim=(1, 2, 3))
        assert float(same.max()) < 12 and bool((same * 4 < flipped).all()), (same, flipped)


def test_an_image_the_gpu_decoder_refuses_is_decoded_on_the_cpu_and_a_broken_one_is_named():
    good, cmyk = jpeg(64, 48, 1), jpeg(64, 48, 2, mode="CMYK")

    def picky(jpegs):  # nvJPEG refuses CMYK; the stand-in refuses anything that is not the good file
        if any(bytes(j.numpy()) != good for j in jpegs):
            raise RuntimeError("Error while decoding JPEG images")
        return cpu_decoder(jpegs)

    batch = encoded_batch(["a.tar:k1", "a.tar:k2"], [good, cmyk], [(0, 0, 64, 48, 0)] * 2)
    images = gpudecode.decode_batch(batch, picky, CPU)
    assert [tuple(i.shape) for i in images] == [(3, 48, 64)] * 2
    broken = encoded_batch(["a.tar:k1", "b.tar:n01/x"], [good, good[:200]], [(0, 0, 64, 48, 0)] * 2)
    with pytest.raises(DataError, match=r"^b\.tar: n01/x\.jpg cannot be decoded: "):
        gpudecode.decode_batch(broken, picky, CPU)


def test_a_loader_error_reaches_the_training_loop_as_itself_and_close_stops_the_thread(tmp_path, shards):
    # A shard whose second sample has no label: the reader raises (before any batch: training shuffles through a
    # buffer); the consumer sees the DataError itself, on this call and every later one.
    bad = tmp_path / "bad.tar"
    with tarfile.open(bad, "w") as tar:
        for name, payload in [("k1.jpg", jpeg(40, 40)), ("k1.cls", b"0"), ("k2.jpg", jpeg(40, 40))]:
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    loader = make_loader(tmp_path, [{"name": "bad.tar"}], 16, 1, True, seed=0, epoch=0, rank=0, workers=0,
                         decode="gpu")
    it = gpudecode.GpuBatches(loader, 16, CPU, decode=cpu_decoder)
    with pytest.raises(DataError, match="bad.tar: samples without both .jpg and .cls: k2"):
        next(it)
    with pytest.raises(DataError):
        next(it)

    train = shards_of(load_manifest(shards), "train")
    it = gpudecode.GpuBatches(make_loader(shards, train, 16, 4, True, seed=0, epoch=0, rank=0, workers=2,
                                          decode="gpu"), 16, CPU, decode=cpu_decoder, ahead=1)
    next(it)
    it.close()  # the thread waits on a full queue: close() must end it, not hang
    assert not it.thread.is_alive()
    it = gpudecode.GpuBatches(make_loader(shards, train, 16, 4, True, seed=0, epoch=0, rank=0, workers=0,
                                          decode="gpu"), 16, CPU, decode=cpu_decoder)
    assert sum(len(labels) for _, labels in it) == 88  # 90 samples, batches of 4, the last short one dropped
    it.thread.join(timeout=10)  # the thread ends once it has handed over the end
    assert not it.thread.is_alive()


def test_validation_and_the_cpu_default_are_untouched_by_decode_gpu(shards):
    val = shards_of(load_manifest(shards), "val")
    batches = list(make_loader(shards, val, 16, 5, False, seed=0, epoch=0, rank=0, workers=1, decode="gpu"))
    assert all(isinstance(images, torch.Tensor) for images, _ in batches)  # validation decodes on the CPU
    with pytest.raises(ValueError, match="decode must be one of cpu, gpu, got 'tpu'"):
        make_loader(shards, val, 16, 5, False, seed=0, epoch=0, rank=0, workers=1, decode="tpu")
    with pytest.raises(gpudecode.GpuDecodeError, match="--decode gpu needs a CUDA GPU"):
        gpudecode.nvjpeg(CPU)


@pytest.mark.parametrize("args,code,message", [
    (["--decode", "gpu"], 1, "error: --decode gpu needs a CUDA GPU; this rank has none (use --decode cpu)"),
    (["--decode", "tpu"], 2, "argument --decode: invalid choice: 'tpu'"),
    (["--synthetic", "--decode", "gpu"], 2, "error: --decode gpu decodes shards; --synthetic reads none"),
])
def test_the_trainer_says_in_one_line_when_decode_gpu_cannot_run(shards, tmp_path, args, code, message):
    data = [] if "--synthetic" in args else ["--data", str(shards)]
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": pythonpath, "CUDA_VISIBLE_DEVICES": "", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-m", "training.train", "--engine", "ddp", "--output", str(tmp_path / "r"),
                           "--model", "resnet18", "--image-size", "16", "--batch-per-gpu", "4", "--epochs", "1",
                           "--threads", "1", "--workers", "0", "--no-tensorboard", *data, *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == code, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
