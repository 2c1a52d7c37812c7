"""Reads WebDataset shards (KEY.jpg + KEY.cls) for one rank and yields uint8 batches.

Shards are split across ranks (rank r reads shards r, r+W, r+2W, ...). Every rank runs the same number
of steps per epoch, computed from the manifest, so no rank waits on a collective the others never call.
Training: a seeded shuffle buffer, RandomResizedCrop + flip. Validation: every sample exactly once.
"""

from __future__ import annotations

import random
import tarfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from training import convert
from training.transforms import train_transform, val_transform


class DataError(ValueError):
    """Bad or missing data; the message is one line meant for the user."""


def load_manifest(data: Path) -> dict:
    """The shards' manifest.json, checked (training.convert owns the format)."""
    try:
        return convert.load_manifest(data)
    except ValueError as e:
        raise DataError(str(e)) from None


def shards_of(manifest: dict, split: str) -> list[dict]:
    return sorted((s for s in manifest["shards"] if s["split"] == split), key=lambda s: s["name"])


def rank_shards(shards: list[dict], rank: int, world: int) -> list[dict]:
    return shards[rank::world]


def steps_per_epoch(shards: list[dict], world: int, batch: int) -> int:
    """Full batches every rank can make: the smallest rank's share decides."""
    return min(sum(s["count"] for s in rank_shards(shards, r, world)) // batch for r in range(world))


def read_shard(path: Path) -> Iterator[tuple[str, bytes, int]]:
    """(key, jpeg bytes, class index) for each sample, in shard order."""
    pending: dict[str, dict[str, bytes]] = {}
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
                yield key, sample["jpg"], int(sample["cls"])
    if pending:
        raise DataError(f"{path.name}: samples without both .jpg and .cls: {', '.join(sorted(pending)[:3])}")


class ShardStream(IterableDataset):
    """One rank's samples. Train: shuffled through a buffer, augmented; val: in order, center-cropped."""

    def __init__(self, paths: list[Path], size: int, train: bool, seed: int = 0, epoch: int = 0,
                 rank: int = 0, shuffle_buffer: int = 2000):
        self.paths, self.size, self.train = paths, size, train
        self.seed, self.epoch, self.rank, self.shuffle_buffer = seed, epoch, rank, shuffle_buffer

    def __iter__(self) -> Iterator[tuple[np.ndarray, int]]:
        info = get_worker_info()
        wid, nworkers = (info.id, info.num_workers) if info else (0, 1)
        rng = random.Random(f"{self.seed}:{self.epoch}:{self.rank}:{wid}")
        paths = list(self.paths[wid::nworkers])
        if not self.train:
            for p in paths:
                for _, jpeg, label in read_shard(p):
                    yield val_transform(jpeg, self.size), label
            return
        rng.shuffle(paths)
        buffer: list[tuple[bytes, int]] = []
        for p in paths:
            for _, jpeg, label in read_shard(p):
                buffer.append((jpeg, label))
                if len(buffer) >= self.shuffle_buffer:
                    jpeg_out, label_out = buffer.pop(rng.randrange(len(buffer)))
                    yield train_transform(jpeg_out, self.size, rng), label_out
        rng.shuffle(buffer)
        for jpeg, label in buffer:
            yield train_transform(jpeg, self.size, rng), label


def _collate(samples: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.from_numpy(np.stack([s[0] for s in samples]))
    labels = torch.tensor([s[1] for s in samples], dtype=torch.long)
    return images, labels


def make_loader(data: Path, shards: list[dict], size: int, batch: int, train: bool, *, seed: int, epoch: int,
                rank: int, workers: int, pin_memory: bool = False) -> DataLoader:
    paths = [data / s["name"] for s in shards]
    workers = min(workers, len(paths))
    return DataLoader(ShardStream(paths, size, train, seed=seed, epoch=epoch, rank=rank),
                      batch_size=batch, num_workers=workers, collate_fn=_collate,
                      drop_last=train, pin_memory=pin_memory, persistent_workers=False)
