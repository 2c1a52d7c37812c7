"""ILSVRC2012 folder layout -> WebDataset shards, with a manifest.

    SRC/train/<wnid>/*  and/or  SRC/val/<wnid>/*
        -> OUT/train-000000.tar, ..., OUT/val-000000.tar, ..., OUT/manifest.json

Each shard holds, per sample, `KEY.jpg` then `KEY.cls` (the class index in ASCII), KEY being the input's file
stem; the class index is the WNID's position in the sorted union of class folders of both splits. Samples are
shuffled with `seed` (each split on its own) before being cut into shards of `shard_size`, and tar metadata is
fixed, so the same input and options give byte-identical shards.

A clean RGB JPEG passes through byte for byte; anything else Pillow can decode (a PNG named .JPEG, a CMYK
or grayscale JPEG) is re-encoded as an RGB JPEG; an empty, truncated or undecodable file is listed in the
manifest's `rejected` with the reason. Nothing is dropped silently and one bad file never stops the run.

Several nodes share the work: every node computes the same shuffled plan, and node i of N writes the shards
whose index (counting train shards, then val shards) is i modulo N, plus `manifest.node-<i>-of-<N>.json`;
`merge_manifests` then writes `manifest.json`. A single node writes `manifest.json` itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import tarfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, TypeVar

from PIL import Image, ImageFile
from pydantic import BaseModel, ValidationError

SPLITS = ("train", "val")
FORMAT, VERSION = "webdataset", 1
MANIFEST = "manifest.json"
REENCODE_QUALITY = 95

T = TypeVar("T")


@dataclass(frozen=True)
class Source:
    """One input file. `problem` is set when the listing alone shows it cannot become a sample."""

    split: str
    path: str  # relative to SRC, with forward slashes
    wnid: str
    key: str
    problem: str | None = None


@dataclass(frozen=True)
class ShardPlan:
    name: str
    split: str
    sources: list[Source]


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


def plan(sources: dict[str, list[Source]], shard_size: int, seed: int) -> list[ShardPlan]:
    """Every shard of the run, train shards first; identical on every node."""
    return [
        ShardPlan(shard_name(split, i), split, chunk)
        for split in SPLITS
        if split in sources
        for i, chunk in enumerate(plan_shards(sources[split], shard_size, seed))
    ]


def prepare_image(data: bytes) -> tuple[bytes | None, str | None]:
    """The JPEG bytes to store for an input file, or None and the reason it is rejected.

    A clean RGB JPEG (baseline or progressive) passes through unchanged; any other image Pillow decodes
    fully is re-encoded as an RGB JPEG.
    """
    if not data:
        return None, "empty file"
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()  # decodes every byte: a truncated file fails here, not in the trainer
            if image.format == "JPEG" and image.mode == "RGB":
                return data, None
            rgb = image.convert("RGB")
    except Image.UnidentifiedImageError:
        return None, "truncated or corrupt image: cannot identify image file"
    except Exception as exc:  # Pillow's decoders raise many types; any of them means this file is unusable
        return None, f"truncated or corrupt image: {' '.join(str(exc).split()) or type(exc).__name__}"
    buf = io.BytesIO()
    rgb.save(buf, format="JPEG", quality=REENCODE_QUALITY)
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


def build_manifest(
    classes: list[str],
    splits: Sequence[str],
    shards: list[dict],
    rejected: list[dict],
    options: dict,
) -> dict:
    """The manifest for these shards; shards and rejected inputs are sorted, so the result is canonical."""
    split_order = {split: i for i, split in enumerate(SPLITS)}
    shards = sorted(shards, key=lambda s: (split_order[s["split"]], s["name"]))
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
        "rejected": rejected,
        "options": options,
    }


def node_manifest_name(node_index: int, node_count: int) -> str:
    return f"manifest.node-{node_index}-of-{node_count}.json"


# ---------------------------------------------------------------------------------------------------------
# The shell: listing, reading, writing.


def discover(src: Path) -> tuple[list[str], dict[str, list[Source]]]:
    """The sorted class list and, per split present, its input files sorted by path."""
    wnids: set[str] = set()
    sources: dict[str, list[Source]] = {}
    for split in SPLITS:
        split_dir = src / split
        if not split_dir.is_dir():
            continue
        entries = sorted(split_dir.iterdir())
        class_dirs = [p for p in entries if p.is_dir()]
        strays = [p for p in entries if not p.is_dir()]
        if not class_dirs:
            if strays:
                raise ValueError(
                    f"{split_dir} holds {len(strays)} files but no <wnid>/ class folders; "
                    f"sort them into {split}/<wnid>/ first"
                )
            continue
        found = [Source(split, rel(p, src), "", p.stem, "outside a class folder") for p in strays]
        for class_dir in class_dirs:
            wnids.add(class_dir.name)
            for p in sorted(f for f in class_dir.rglob("*") if f.is_file()):
                problem = None if p.parent == class_dir else "in a subfolder of its class folder"
                found.append(Source(split, rel(p, src), class_dir.name, p.stem, problem))
        sources[split] = mark_bad_keys(sorted(found, key=lambda s: s.path))
    if not sources:
        raise ValueError(f"no train/ or val/ class folders under SRC {src}")
    return sorted(wnids), sources


def rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def mark_bad_keys(sources: list[Source]) -> list[Source]:
    """Flag keys WebDataset would mangle: a '.' in the stem, or a stem already used in the split."""
    first_with_key: dict[str, str] = {}
    marked = []
    for s in sources:
        if s.problem is None and "." in s.key:
            s = replace(s, problem="file stem contains '.', which would split the key")
        elif s.problem is None and s.key in first_with_key:
            s = replace(s, problem=f"duplicate key: same stem as {first_with_key[s.key]}")
        elif s.problem is None:
            first_with_key[s.key] = s.path
        marked.append(s)
    return marked


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(partial, path)


def write_shard(
    src: Path,
    out: Path,
    shard: ShardPlan,
    classes: dict[str, int],
    rejected: list[dict],
    on_sample: Callable[[], None] | None,
) -> dict:
    """Write one shard through `.<name>.partial`; append rejected inputs to `rejected`; return its entry."""
    partial = out / f".{shard.name}.partial"
    count = 0
    with tarfile.open(partial, "w", format=tarfile.GNU_FORMAT) as tar:
        for source in shard.sources:
            jpeg, reason = None, source.problem
            if reason is None:
                try:
                    jpeg, reason = prepare_image((src / source.path).read_bytes())
                except OSError as exc:
                    reason = f"unreadable: {exc.strerror or exc}"
            if jpeg is None:
                rejected.append({"path": source.path, "split": source.split, "reason": reason})
            else:
                label = str(classes[source.wnid]).encode("ascii")
                tar.addfile(tar_member(f"{source.key}.jpg", len(jpeg)), io.BytesIO(jpeg))
                tar.addfile(tar_member(f"{source.key}.cls", len(label)), io.BytesIO(label))
                count += 1
            if on_sample is not None:
                on_sample()
    entry = {
        "name": shard.name,
        "split": shard.split,
        "count": count,
        "bytes": partial.stat().st_size,
        "sha256": sha256_of(partial),
    }
    os.replace(partial, out / shard.name)
    return entry


@contextmanager
def strict_decoding() -> Iterator[None]:
    """Make Pillow fail on truncated files for the duration, whatever another module set."""
    saved = ImageFile.LOAD_TRUNCATED_IMAGES
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES = saved


def convert(
    src: Path,
    out: Path,
    *,
    shard_size: int = 1000,
    seed: int = 0,
    node_index: int = 0,
    node_count: int = 1,
    on_sample: Callable[[], None] | None = None,
) -> dict:
    """Convert this node's share of SRC into shards under OUT; return the manifest it wrote.

    `on_sample` is called once per input this node processes, written or rejected.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be 1 or more, got {shard_size}")
    if node_count < 1:
        raise ValueError(f"node_count must be 1 or more, got {node_count}")
    if not 0 <= node_index < node_count:
        raise ValueError(
            f"node_index must be between 0 and node_count - 1 ({node_count - 1}), got {node_index}"
        )
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise ValueError(f"SRC {src} does not exist")

    wnids, sources = discover(src)
    classes = class_index(wnids)
    shards = plan(sources, shard_size, seed)
    out.mkdir(parents=True, exist_ok=True)

    written: list[dict] = []
    rejected: list[dict] = []
    with strict_decoding():
        for i in shards_for_node(len(shards), node_index, node_count):
            written.append(write_shard(src, out, shards[i], classes, rejected, on_sample))

    options = {"shard_size": shard_size, "seed": seed, "source": str(src)}
    manifest = build_manifest(wnids, list(sources), written, rejected, options)
    if node_count == 1:
        write_json_atomic(out / MANIFEST, manifest)
    else:
        manifest["node"] = {"index": node_index, "count": node_count, "planned": [s.name for s in shards]}
        write_json_atomic(out / node_manifest_name(node_index, node_count), manifest)
    return manifest


def merge_manifests(out: Path, node_count: int) -> dict:
    """Combine the node manifests of an N-node conversion into `manifest.json`; return it.

    Fails if a node manifest is missing, if the nodes disagree on classes or options, or if a planned shard
    is missing. With one node there is nothing to merge and the existing manifest is returned.
    """
    out = Path(out)
    if node_count < 1:
        raise ValueError(f"node_count must be 1 or more, got {node_count}")
    if node_count == 1:
        return load_manifest(out)
    parts = []
    for i in range(node_count):
        path = out / node_manifest_name(i, node_count)
        if not path.is_file():
            raise ValueError(f"{path} not found: node {i} of {node_count} has not finished converting")
        parts.append(json.loads(path.read_text()))
    first = parts[0]

    def agreed(part: dict) -> tuple:
        return part["classes"], list(part["splits"]), part["options"], part["node"]["planned"]

    if any(agreed(part) != agreed(first) for part in parts[1:]):
        raise ValueError(
            f"node manifests under {out} disagree on classes, options or shard plan; "
            "convert again on every node"
        )
    shards = [shard for part in parts for shard in part["shards"]]
    missing = sorted(set(first["node"]["planned"]) - {s["name"] for s in shards})
    if missing:
        raise ValueError(f"shards missing from the node manifests under {out}: {', '.join(missing)}")
    manifest = build_manifest(
        first["classes"],
        list(first["splits"]),
        shards,
        [r for part in parts for r in part["rejected"]],
        first["options"],
    )
    write_json_atomic(out / MANIFEST, manifest)
    return manifest


# ---------------------------------------------------------------------------------------------------------
# Reading a manifest back.


class _Split(BaseModel):
    samples: int
    shards: int


class _Shard(BaseModel):
    name: str
    split: str
    count: int
    bytes: int
    sha256: str


class _Rejected(BaseModel):
    path: str
    split: str
    reason: str


class _Options(BaseModel):
    shard_size: int
    seed: int
    source: str


class _Manifest(BaseModel):
    format: Literal["webdataset"]
    version: Literal[1]
    classes: list[str]
    splits: dict[str, _Split]
    shards: list[_Shard]
    rejected: list[_Rejected]
    options: _Options


def load_manifest(directory: Path) -> dict:
    """The manifest under `directory`, checked; ValueError with a one-line message if missing or invalid."""
    path = Path(directory) / MANIFEST
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} not found; convert the data set first (launch data convert)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    try:
        _Manifest.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "top level"
        raise ValueError(f"{path} is not a valid shard manifest: {where}: {error['msg']}") from None
    return data
