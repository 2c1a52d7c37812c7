"""Reads WebDataset shards (KEY.jpg + KEY.cls) for one rank and yields uint8 NCHW batches.

Shards are split across ranks (rank r reads shards r, r+W, r+2W, ...), so across the job every sample is read
once per epoch. Every rank runs the same number of steps per epoch, computed from the manifest, so no rank
waits on a collective the others never call.

Within a rank, worker processes each take a share of the rank's shards (reshuffled every epoch for training)
and hand back whole batches; each worker's last, partial batch is merged with the others' in the main process,
so a rank yields count // batch full batches for training (at most batch - 1 samples left out, whatever the
number of workers) and exactly its samples, once, for validation. Training: a seeded shuffle buffer per
worker, RandomResizedCrop + flip; validation: in shard order, resize + center crop (training.transforms).
Batches are uint8 NCHW (channels_last memory) and pinned when asked, so the copy to the GPU is asynchronous
and normalization happens there. With decode="gpu" (training) the workers decode nothing: a batch is the samples'
encoded JPEGs and their crop boxes and flips (an EncodedBatch), drawn from the headers with the same seeded
draws, and training.gpudecode decodes, crops and flips them on the rank's GPU.
"""

from __future__ import annotations

import random
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training import shards as shard_format
from training.transforms import collate, train_geometry, train_transform, val_transform

SHUFFLE_BUFFER = 2000  # samples (encoded) each worker holds to shuffle across shard boundaries
DECODERS = ("cpu", "gpu")  # where training images are decoded: the loader's workers, or the rank's GPU


class EncodedBatch(NamedTuple):
    """A batch for the GPU decoder: encoded JPEGs and, per sample, its crop box and flip in full-image pixels.

    The files travel end to end in one tensor: a worker hands each tensor over in a shared-memory block of its own
    (torch.multiprocessing), so one per batch, not one per image."""

    keys: list[str]              # "shard:key", to name a sample that does not decode
    data: torch.Tensor           # uint8, 1-D: the samples' JPEG files, one after another
    sizes: list[int]             # bytes of each file in `data`
    geometry: torch.Tensor       # (N, 5) int64: left, top, width, height, flip (0/1)

    def jpegs(self) -> list[torch.Tensor]:
        """Each file as a 1-D uint8 view of `data` (what torchvision's decode_jpeg takes)."""
        return list(torch.split(self.data, self.sizes))


def encoded_batch(keys: list[str], files: list[bytes], geometry: list[tuple[int, ...]]) -> EncodedBatch:
    joined = bytearray(b"".join(files))
    data = torch.frombuffer(joined, dtype=torch.uint8) if joined else torch.empty(0, dtype=torch.uint8)
    return EncodedBatch(list(keys), data, [len(f) for f in files], torch.tensor(geometry, dtype=torch.long).view(-1, 5))


def join(parts: list) -> torch.Tensor | EncodedBatch:
    """Batches (NCHW views of NHWC memory, or EncodedBatch) as one, in order."""
    if isinstance(parts[0], EncodedBatch):
        return EncodedBatch([k for p in parts for k in p.keys], torch.cat([p.data for p in parts]),
                            [n for p in parts for n in p.sizes], torch.cat([p.geometry for p in parts]))
    return torch.cat([p.permute(0, 2, 3, 1) for p in parts]).permute(0, 3, 1, 2)


def part(batch: torch.Tensor | EncodedBatch, start: int, stop: int | None = None) -> torch.Tensor | EncodedBatch:
    """Samples start:stop of a batch."""
    if isinstance(batch, EncodedBatch):
        stop = len(batch.sizes) if stop is None else stop
        first, last = sum(batch.sizes[:start]), sum(batch.sizes[:stop])
        return EncodedBatch(batch.keys[start:stop], batch.data[first:last], batch.sizes[start:stop],
                            batch.geometry[start:stop])
    return batch[start:stop]


class DataError(ValueError):
    """Bad or missing data; the message is one line meant for the user."""


def undecodable(shard: str, key: str, exc: Exception) -> DataError:
    """A sample no decoder takes, named by its shard and key, in one line."""
    return DataError(f"{shard}: {key}.jpg cannot be decoded: {' '.join(str(exc).split())}")


def load_manifest(data: Path, *, training: bool = False) -> dict:
    """The shards' manifest.json, checked by training.shards' model of it (`training`: with what the trainer needs
    on top, at least 2 classes)."""
    try:
        return shard_format.load_manifest(data, training=training)
    except ValueError as e:
        raise DataError(str(e)) from None


def shards_of(manifest: dict, split: str) -> list[dict]:
    return sorted((s for s in manifest["shards"] if s["split"] == split), key=lambda s: s["name"])


def rank_shards(shards: list[dict], rank: int, world: int) -> list[dict]:
    return shards[rank::world]


def steps_per_epoch(shards: list[dict], world: int, batch: int) -> int:
    """Full batches every rank can make: the smallest rank's share decides."""
    return min(sum(s["count"] for s in rank_shards(shards, r, world)) // batch for r in range(world))


class ShardRef(NamedTuple):
    """A shard as the manifest lists it: where it is, and what it must hold (None: not checked)."""

    path: Path
    count: int | None = None      # samples
    bytes: int | None = None      # file size
    classes: int | None = None    # labels are 0 .. classes - 1


def read_shard(ref: ShardRef | Path) -> Iterator[tuple[str, bytes, int]]:
    """(key, jpeg bytes, class index) for each sample, in shard order, the shard held to what the manifest says of
    it: its size before a byte is read, each label as it is read, its sample count at its end. A shard changed since
    conversion would otherwise be a wrong number of steps, or a label the loss indexes out of range."""
    ref = ref if isinstance(ref, ShardRef) else ShardRef(Path(ref))
    path = ref.path
    if ref.bytes is not None:
        try:
            size = path.stat().st_size
        except OSError as exc:
            raise DataError(f"{path.name}: cannot be read: {exc.strerror or exc}") from None
        if size != ref.bytes:
            raise DataError(f"{path.name}: {size} bytes where the manifest says {ref.bytes}: the shard changed after "
                            f"conversion (cut short, or replaced); convert the data again")
    pending: dict[str, dict[str, bytes]] = {}
    count = 0
    try:
        with tarfile.open(path) as tar:
            for member in tar:
                if not member.isfile():
                    continue
                key, _, ext = member.name.rpartition(".")
                f = tar.extractfile(member)
                assert f is not None
                pending.setdefault(key, {})[ext] = f.read()
                sample = pending[key]
                if "jpg" in sample and "cls" in sample:
                    del pending[key]
                    label = int(sample["cls"])
                    if ref.classes is not None and not 0 <= label < ref.classes:
                        raise DataError(f"{path.name}: {key}.cls is {label}, outside the manifest's {ref.classes} "
                                        f"classes (0 to {ref.classes - 1})")
                    count += 1
                    yield key, sample["jpg"], label
    except (OSError, tarfile.TarError, ValueError) as exc:
        if isinstance(exc, DataError):
            raise
        raise DataError(f"{path.name}: unreadable shard: {' '.join(str(exc).split())}") from None
    if pending:
        raise DataError(f"{path.name}: samples without both .jpg and .cls: {', '.join(sorted(pending)[:3])}")
    if ref.count is not None and count != ref.count:
        raise DataError(f"{path.name}: holds {count} samples where the manifest says {ref.count}; convert the data "
                        f"again")


class ShardStream(IterableDataset):
    """One rank's samples as batches, split across the DataLoader's workers.

    Yields (images uint8 NCHW, labels int64, full) with `full` False only for a worker's last, short batch.
    """

    def __init__(self, paths: list[ShardRef | Path], size: int, batch: int, train: bool, seed: int = 0, epoch: int = 0,
                 rank: int = 0, shuffle_buffer: int = SHUFFLE_BUFFER, encoded: bool = False):
        self.paths = [p if isinstance(p, ShardRef) else ShardRef(Path(p)) for p in paths]
        self.size, self.batch, self.train = size, batch, train
        self.seed, self.epoch, self.rank, self.shuffle_buffer = seed, epoch, rank, shuffle_buffer
        self.encoded = encoded and train  # validation decodes on the CPU either way

    def my_paths(self) -> tuple[list[ShardRef], random.Random]:
        """This worker's shards (reshuffled each epoch for training) and its random stream."""
        info = get_worker_info()
        wid, nworkers = (info.id, info.num_workers) if info else (0, 1)
        paths = list(self.paths)
        if self.train:
            random.Random(f"{self.seed}:{self.epoch}:{self.rank}").shuffle(paths)
        return paths[wid::nworkers], random.Random(f"{self.seed}:{self.epoch}:{self.rank}:{wid}")

    def samples(self, paths: list[ShardRef], rng: random.Random) -> Iterator[tuple[str, bytes, int, Path]]:
        if not self.train:
            for p in paths:
                yield from ((key, data, label, p.path) for key, data, label in read_shard(p))
            return
        buffer: list[tuple[str, bytes, int, Path]] = []
        for p in paths:
            for key, data, label in read_shard(p):
                buffer.append((key, data, label, p.path))
                if len(buffer) >= self.shuffle_buffer:
                    yield buffer.pop(rng.randrange(len(buffer)))
        rng.shuffle(buffer)
        yield from buffer

    def transform(self, key: str, data: bytes, path: Path, rng: random.Random):
        """The sample as the batch holds it: decoded (uint8 HWC), or encoded with its geometry (decode="gpu")."""
        try:
            if self.encoded:
                _, _, box, flip = train_geometry(data, rng)  # the header alone: the same draws as the CPU path
                return f"{path.name}:{key}", data, (*box, int(flip))
            return train_transform(data, self.size, rng) if self.train else val_transform(data, self.size)
        except Exception as exc:  # any decoder error: name the sample, in one line
            raise undecodable(path.name, key, exc) from None

    def collate(self, items: list) -> torch.Tensor | EncodedBatch:
        if self.encoded:
            keys, files, geometry = zip(*items, strict=True)
            return encoded_batch(list(keys), list(files), list(geometry))
        return collate(items)

    def __iter__(self) -> Iterator[tuple[torch.Tensor | EncodedBatch, torch.Tensor, bool]]:
        # The converter's pixel limit, not Pillow's: an image it accepted (up to shards.MAX_PIXELS) must decode here
        # too. Pillow warns above Image.MAX_IMAGE_PIXELS (89 Mpx by default) and raises DecompressionBombError above
        # twice that ("Image.open", https://pillow.readthedocs.io/en/stable/reference/Image.html#PIL.Image.open).
        # Set in the process that decodes: each loader worker, or the rank itself with --workers 0.
        Image.MAX_IMAGE_PIXELS = shard_format.MAX_PIXELS
        paths, rng = self.my_paths()
        items: list = []
        labels: list[int] = []
        for key, data, label, path in self.samples(paths, rng):
            items.append(self.transform(key, data, path, rng))
            labels.append(label)
            if len(items) == self.batch:
                yield self.collate(items), torch.tensor(labels, dtype=torch.long), True
                items, labels = [], []
        if items:
            yield self.collate(items), torch.tensor(labels, dtype=torch.long), False


class Loader:
    """Iterates (images uint8 NCHW, labels int64) batches: the workers' full batches, then their remainders
    merged into full batches; the last short one only when not `drop_last`. With an encoded stream the images
    are EncodedBatch, merged the same way."""

    def __init__(self, stream: ShardStream, workers: int, pin_memory: bool, drop_last: bool):
        self.stream, self.pin_memory, self.drop_last = stream, pin_memory, drop_last
        self.loader = DataLoader(stream, batch_size=None, num_workers=workers, pin_memory=pin_memory,
                                 persistent_workers=False)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batch = self.stream.batch
        rest_images: list = []
        rest_labels: list[torch.Tensor] = []
        held = 0
        for images, labels, full in self.loader:
            if full:
                yield images, labels
                continue
            rest_images.append(images)
            rest_labels.append(labels)
            held += len(labels)
            while held >= batch:
                merged, merged_labels = join(rest_images), torch.cat(rest_labels)
                yield self.pinned(part(merged, 0, batch)), self.pinned(merged_labels[:batch])
                rest_images, rest_labels = [part(merged, batch)], [merged_labels[batch:]]
                held -= batch
        if held and not self.drop_last:
            yield self.pinned(join(rest_images)), self.pinned(torch.cat(rest_labels))

    def pinned(self, t):
        return t.pin_memory() if self.pin_memory else t  # make_loader pins no encoded stream


def make_loader(data: Path, shards: list[dict], size: int, batch: int, train: bool, *, seed: int, epoch: int,
                rank: int, workers: int, pin_memory: bool = False, shuffle_buffer: int = SHUFFLE_BUFFER,
                decode: str = "cpu", num_classes: int | None = None) -> Loader:
    """Batches of this rank's `shards` under `data`: training (augmented, shuffled, full batches only) or
    validation (every sample once, in order). decode="gpu": training batches are EncodedBatch, for
    training.gpudecode (the workers only read and draw the geometry). Each shard is held to its manifest entry's
    count and bytes, and its labels to `num_classes` (the manifest's class count) when given."""
    if decode not in DECODERS:
        raise ValueError(f"decode must be one of {', '.join(DECODERS)}, got {decode!r}")
    paths = [ShardRef(Path(data) / s["name"], s.get("count"), s.get("bytes"), num_classes) for s in shards]
    stream = ShardStream(paths, size, batch, train, seed=seed, epoch=epoch, rank=rank, shuffle_buffer=shuffle_buffer,
                         encoded=decode == "gpu")
    return Loader(stream, min(workers, len(paths)), pin_memory and not stream.encoded, drop_last=train)
