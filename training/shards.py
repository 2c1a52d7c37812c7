"""The shard format and the decisions about it, without files: which inputs go in which shard, how an image is
encoded, what a shard's fingerprint and the manifest say, and the manifest read back. training.convert tells the
whole story; training.shardwriter writes what is decided here.
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import re
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import PIL
from PIL import Image
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from training import jpegresize
from training.sample import OptionError  # an option out of its range, named as the user types it
from training.sources import SPLITS, Source

FORMAT, VERSION = "webdataset", 1
MANIFEST = "manifest.json"
JOURNAL = ".journal"
DEFAULT_QUALITY = 95
MAX_PIXELS = 1 << 30  # a larger image is rejected rather than decoded (Pillow's own limit is 89 Mpx)
ENCODER = f"pillow {PIL.__version__}"  # re-encoded bytes depend on it, so finished shards do too
RESAMPLE = Image.Resampling.BICUBIC  # antialiased in Pillow; Lanczos is 40% slower for no visible gain at these scales

T = TypeVar("T")


class ConvertError(ValueError):
    """A problem with the run as a whole (options, SRC, OUT); the message is one line."""


@dataclass(frozen=True)
class ShardPlan:
    name: str
    split: str
    sources: list[Source]
    fingerprint: str  # sha256 of everything that decides the shard's bytes


@dataclass(frozen=True)
class Encoding:
    resize: int | None = None
    quality: int = DEFAULT_QUALITY


# ---------------------------------------------------------------------------------------------------------
# Pure helpers: the decisions, without files.


def class_index(wnids: Sequence[str]) -> dict[str, int]:
    """WNID -> class index: its position in sorted order, 0-based."""
    return {wnid: i for i, wnid in enumerate(sorted(set(wnids)))}


def plan_shards(samples: Sequence[T], shard_size: int, seed: int) -> list[list[T]]:
    """Shuffle `samples` with `seed`, then cut them into shards of `shard_size` (the last may be short)."""
    order = list(samples)
    random.Random(seed).shuffle(order)
    return [order[i : i + shard_size] for i in range(0, len(order), shard_size)]


def shards_for_node(n_shards: int, node_index: int, node_count: int) -> list[int]:
    """The shard indices node `node_index` of `node_count` writes: those equal to it modulo `node_count`."""
    return list(range(node_index, n_shards, node_count))


def shard_name(split: str, index: int) -> str:
    return f"{split}-{index:06d}.tar"


def empty_entry(name: str) -> dict:
    """The record entry of a planned shard whose every input was rejected: no file is written for it."""
    return {"name": name, "split": name.rsplit("-", 1)[0], "count": 0, "bytes": 0, "sha256": ""}


def fingerprint(name: str, sources: Sequence[Source], labels: dict[str, int], encoding: Encoding) -> str:
    """sha256 of what decides a shard's bytes: its inputs (where, how big, key, label) and the encoding."""
    planned = [[s.path, s.container, s.offset, s.size, s.key, labels.get(s.wnid), s.problem] for s in sources]
    # Resized images are re-encoded by the fast path when it is installed (training.jpegresize): its libraries
    # decide their bytes, so they are part of what a finished shard was made with.
    encoder = ENCODER if encoding.resize is None else f"{ENCODER}; {jpegresize.encoder()}"
    text = json.dumps([FORMAT, VERSION, encoder, name, encoding.resize, encoding.quality, planned])
    return hashlib.sha256(text.encode()).hexdigest()


def plan(
    sources: dict[str, list[Source]], shard_size: int, seed: int, labels: dict[str, int], encoding: Encoding
) -> list[ShardPlan]:
    """Every shard of the run, train shards first; identical on every node."""
    shards = []
    for split in SPLITS:
        for i, chunk in enumerate(plan_shards(sources.get(split, []), shard_size, seed)):
            name = shard_name(split, i)
            shards.append(ShardPlan(name, split, chunk, fingerprint(name, chunk, labels, encoding)))
    return shards


def plan_digest(shards: Sequence[ShardPlan]) -> str:
    return hashlib.sha256("\n".join(s.fingerprint for s in shards).encode()).hexdigest()


def resized_size(width: int, height: int, resize: int | None) -> tuple[int, int] | None:
    """(w, h) with the shorter side `resize`, or None when the image needs no shrinking."""
    short = min(width, height)
    if resize is None or short <= resize:
        return None
    if width <= height:
        return resize, max(1, round(height * resize / width))
    return max(1, round(width * resize / height)), resize


def prepare_image(data: bytes, encoding: Encoding = Encoding()) -> tuple[bytes | None, str | None]:
    """The JPEG bytes to store for an input file, or None and the reason it is rejected.

    A clean RGB JPEG (baseline or progressive) that needs no resizing passes through unchanged, checked by
    decoding every byte at 1/8 scale (a truncated or corrupt file fails the same way as at full scale, for a
    fraction of the work); any other image Pillow decodes is re-encoded as an RGB JPEG, shrunk first when it
    is larger than `encoding.resize`.
    """
    if not data:
        return None, "empty file"
    size = jpegresize.jpeg_size(data) if encoding.resize is not None else None
    if size is not None and size[0] * size[1] <= MAX_PIXELS:
        target = resized_size(*size, encoding.resize)
        shrunk = jpegresize.shrink(data, *size, target, encoding.quality) if target is not None else None
        if shrunk is not None:  # else (no simplejpeg/torch, a decoder error) Pillow's path, which says why
            return shrunk, None
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                return None, f"image too large: {width}x{height} px is over {MAX_PIXELS} px"
            target = resized_size(width, height, encoding.resize)
            if target is None and image.format == "JPEG" and image.mode == "RGB":
                image.draft("RGB", (max(1, width // 8), max(1, height // 8)))
                image.load()  # decodes every byte: a truncated file fails here, not in the trainer
                return data, None
            if target is not None:
                image.draft("RGB", target)  # JPEG: decode at the smallest DCT scale still at least `target`
            image.load()
            rgb = image.convert("RGB")
            if target is not None:
                rgb = rgb.resize(target, RESAMPLE)
    except Image.UnidentifiedImageError:
        return None, "truncated or corrupt image: cannot identify image file"
    except Image.DecompressionBombError as exc:
        return None, f"image too large: {' '.join(str(exc).split())}"
    except Exception as exc:  # Pillow's decoders raise many types; any of them means this file is unusable
        return None, f"truncated or corrupt image: {' '.join(str(exc).split()) or type(exc).__name__}"
    buf = io.BytesIO()
    rgb.save(buf, format="JPEG", quality=encoding.quality)
    return buf.getvalue(), None


def tar_member(name: str, size: int) -> tarfile.TarInfo:
    """A tar header with fixed metadata, so the same content always gives the same bytes."""
    info = tarfile.TarInfo(name)
    info.size = size
    info.mtime = 0
    info.mode = 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.type = tarfile.REGTYPE
    return info


# A shard is the tar that tarfile writes in GNU format with tar_member's metadata, byte for byte; writing its
# headers from a template skips tarfile's per-member TarInfo copy and field-by-field header build (0.24 ms of
# the converter's 3.8 ms per resized image, bench/convert.py). Layout of a header (POSIX.1-1988 ustar, GNU
# magic): name[100] mode[8] uid[8] gid[8] size[12] mtime[12] chksum[8] typeflag[1] linkname[100] magic[8]
# uname[32] gname[32] devmajor[8] devminor[8] prefix[155] pad[12].
_TAR_TEMPLATE = bytearray(tar_member("", 0).tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape"))
_TAR_TEMPLATE[148:156] = b" " * 8  # the checksum is summed with its own field as spaces
_TAR_TEMPLATE_SUM = sum(_TAR_TEMPLATE) - sum(_TAR_TEMPLATE[124:136])  # without the size field, set per member
_TAR_MAX_SIZE = 8**11 - 1  # what 11 octal digits hold; tarfile switches to base-256 above it


def tar_header(name: str, size: int) -> bytes:
    """The header tarfile writes for ``tar_member(name, size)`` in GNU format (a long or non-ASCII name, or an
    8 GiB member, goes through tarfile itself: GNU long-name blocks, base-256 sizes)."""
    encoded = name.encode("ascii") if name.isascii() else b""
    if not encoded or len(encoded) >= tarfile.LENGTH_NAME or size > _TAR_MAX_SIZE:
        return tar_member(name, size).tobuf(tarfile.GNU_FORMAT, "utf-8", "surrogateescape")
    header = bytearray(_TAR_TEMPLATE)
    header[: len(encoded)] = encoded
    header[124:136] = b"%011o\0" % size
    checksum = _TAR_TEMPLATE_SUM + sum(encoded) + sum(header[124:136])
    header[148:155] = b"%06o\0" % checksum
    return bytes(header)


def tar_padding(size: int) -> bytes:
    """The NULs after a member of ``size`` bytes up to the next 512-byte block."""
    return bytes(-size % tarfile.BLOCKSIZE)


def tar_end(offset: int) -> bytes:
    """What tarfile's close writes after the last member at ``offset``: two zero blocks, then zeros to the end
    of its 10240-byte record."""
    end = offset + 2 * tarfile.BLOCKSIZE
    return bytes(2 * tarfile.BLOCKSIZE + (-end % tarfile.RECORDSIZE))


def build_manifest(
    classes: list[str],
    splits: Sequence[str],
    shards: list[dict],
    rejected: list[dict],
    options: dict,
    plan_sha256: str,
) -> dict:
    """The manifest for these shards; shards and rejected inputs are sorted, so the result is canonical. A planned
    shard whose every input was rejected has no file: it is named in ``empty_shards``, not listed or counted in
    ``shards`` and ``splits`` (which said "24 samples in 5 shards" for 4 shards and an empty tar)."""
    split_order = {split: i for i, split in enumerate(SPLITS)}
    shards = sorted(shards, key=lambda s: (split_order[s["split"]], s["name"]))
    empty = [s["name"] for s in shards if not s["count"]]
    shards = [s for s in shards if s["count"]]
    rejected = sorted(rejected, key=lambda r: (split_order[r["split"]], r["path"]))
    return {
        "format": FORMAT,
        "version": VERSION,
        "classes": classes,
        "splits": {
            split: {
                "samples": sum(s["count"] for s in shards if s["split"] == split),
                "shards": sum(1 for s in shards if s["split"] == split),
            }
            for split in SPLITS
            if split in splits
        },
        "shards": shards,
        "empty_shards": empty,
        "rejected": rejected,
        "options": options,
        "plan_sha256": plan_sha256,
    }


def node_manifest_name(node_index: int, node_count: int) -> str:
    return f"manifest.node-{node_index}-of-{node_count}.json"


def check_options(shard_size: int, resize: int | None, quality: int, workers: int, node_index: int,
                  node_count: int, seed: int = 0) -> None:
    """OptionError naming the first option out of its range as `launch data convert` takes it."""
    if shard_size < 1:
        raise OptionError(f"--shard-size must be >= 1, got {shard_size}")
    if resize is not None and resize < 1:
        raise OptionError(f"--resize must be >= 1, got {resize}")
    if not 1 <= quality <= 100:
        raise OptionError(f"--quality must be between 1 and 100, got {quality}")
    if seed < 0:  # as `launch data sample --seed`; random.Random takes any integer, but a seed is a count here
        raise OptionError(f"--seed must be >= 0, got {seed}")
    if workers < 1:
        raise OptionError(f"--workers must be >= 1, got {workers}")
    if node_count < 1:
        raise OptionError(f"--node-count must be >= 1, got {node_count}")
    if not 0 <= node_index < node_count:
        raise OptionError(f"--node-index must be between 0 and {node_count - 1} (--node-count {node_count}), "
                          f"got {node_index}")


# ---------------------------------------------------------------------------------------------------------
# Reading a manifest back.


# The manifest is the trainer's only description of its data: the steps per epoch come from its counts, the paths it
# opens from its names, the labels' range from its class list. So every field is checked for what it is (strict:
# a count of "5", 5.0 or true is refused, not coerced; https://docs.pydantic.dev/latest/concepts/strict_mode/).
_SHARD_NAME = re.compile(r"(?P<split>[a-z]+)-\d{6}\.tar")  # shard_name's: a plain file name, no "/" or ".."


class _Split(BaseModel):
    model_config = ConfigDict(strict=True)
    samples: int = Field(ge=0)
    shards: int = Field(ge=0)


class _Shard(BaseModel):
    model_config = ConfigDict(strict=True)
    name: str
    split: Literal[SPLITS]  # type: ignore[valid-type]  # train, val: training.sources.SPLITS
    count: int = Field(ge=1)  # an empty shard has no file: build_manifest names it in empty_shards instead
    bytes: int = Field(ge=1)
    sha256: str

    @model_validator(mode="after")
    def _named_as_written(self) -> _Shard:
        match = _SHARD_NAME.fullmatch(self.name)
        if match is None or match["split"] != self.split:
            raise ValueError(f"shard name {self.name!r} is not {self.split}-NNNNNN.tar (a file in the shards "
                             f"directory, named for its split)")
        return self


class _Rejected(BaseModel):
    path: str
    split: str
    reason: str


class _Options(BaseModel):
    shard_size: int
    seed: int
    source: str
    resize: int | None = None
    quality: int = DEFAULT_QUALITY
    layout: dict[str, str] = {}


class _Manifest(BaseModel):
    format: Literal["webdataset"]
    version: Literal[1]
    classes: list[str] = Field(min_length=1)  # a label is an index into it
    splits: dict[Literal[SPLITS], _Split]  # type: ignore[valid-type]
    shards: list[_Shard]
    empty_shards: list[str] = []  # planned shards every input of was rejected: no file (build_manifest)
    rejected: list[_Rejected]
    options: _Options
    plan_sha256: str | None = None

    @field_validator("classes")
    @classmethod
    def _classes_once_each(cls, classes: list[str]) -> list[str]:
        if twice := sorted({c for c in classes if classes.count(c) > 1}):
            raise ValueError(f"class {twice[0]!r} is listed twice; a class's index is its place in the list")
        return classes

    @field_validator("shards")
    @classmethod
    def _shards_once_each(cls, shards: list[_Shard]) -> list[_Shard]:
        names = [s.name for s in shards]
        if twice := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"shard {twice[0]} is listed twice; its samples would be read twice an epoch")
        return shards


class _TrainingManifest(_Manifest):
    """What the trainer needs on top: something to tell apart (`launch data sample --classes` asks for 2 too)."""

    classes: list[str] = Field(min_length=2)


def load_manifest(directory: Path, *, training: bool = False) -> dict:
    """The manifest under `directory`, checked (`training`: also what the trainer needs); ValueError with a one-line
    message if missing, unreadable or invalid."""
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} not found; convert the data set first (launch data convert)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, not text
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise ValueError(f"{path} cannot be read as the shards' manifest: {reason}") from None
    try:
        (_TrainingManifest if training else _Manifest).model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "top level"
        msg = error["msg"].removeprefix("Value error, ")
        if training and where == "classes" and error["type"] == "too_short":
            msg = f"{len(data['classes'])} class(es); training needs at least 2 (launch data sample --classes 2)"
        raise ValueError(f"{path} is not a valid shard manifest: {where}: {msg}") from None
    return data
