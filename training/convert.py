"""ImageNet, in any layout people have, -> WebDataset shards with a manifest.

    SRC (see training.sources: class folders, the official tars, flat val files with a labels file)
        -> OUT/train-000000.tar, ..., OUT/val-000000.tar, ..., OUT/manifest.json

Each shard holds, per sample, `KEY.jpg` then `KEY.cls` (the class index in ASCII), KEY being the input's file
stem; the class index is the WNID's position in the sorted class list. Samples are sorted by key and shuffled
with `seed` (each split on its own) before being cut into shards of `shard_size`, and tar metadata is fixed, so
the same input and options give byte-identical shards, whichever layout the input came in.

Without `resize`, a clean RGB JPEG passes through byte for byte; anything else Pillow can decode (a PNG named
.JPEG, a CMYK or grayscale JPEG) is re-encoded as an RGB JPEG at `quality`. With `resize`, an image whose
shorter side is above `resize` px is shrunk to it (JPEGs decoded at a reduced DCT scale first, so a very large
original costs little) and re-encoded; smaller ones are kept as they are. An empty, truncated or undecodable
input is listed in the manifest's `rejected` with the reason. Nothing is dropped silently and one bad file
never stops the run.

Resumable: a shard is written under a temporary name and renamed only when complete, after its journal record
(OUT/.journal/<shard>.json: fingerprint of its planned inputs and options, size, sha256, rejected inputs). A run
started again, after a kill -9 at any point, keeps every shard whose record matches the plan and whose bytes
match the record, and writes the rest; the result is byte-identical to an uninterrupted run. The journal is
removed once the manifest is written; a finished manifest with the same plan serves as the record after that.
The plan knows inputs by path and size: an input rewritten in place at the same size goes unnoticed, so after
editing a data set, convert into a fresh OUT.

Parallel: `workers` processes write whole shards. Several nodes share the work: every node computes the same
plan, and node i of N writes the shards whose index (counting train shards, then val shards) is i modulo N,
plus `manifest.node-<i>-of-<N>.json`; `merge_manifests` then writes `manifest.json`. A single node writes
`manifest.json` itself.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import ctypes
import hashlib
import io
import json
import multiprocessing
import os
import queue
import random
import signal
import sys
import tarfile
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures.process import BrokenProcessPool
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import PIL
from PIL import Image, ImageFile
from pydantic import BaseModel, ValidationError

from training.sample import write_atomic
from training.sources import SPLITS, Source, discover, read_input

FORMAT, VERSION = "webdataset", 1
MANIFEST = "manifest.json"
JOURNAL = ".journal"
DEFAULT_QUALITY = 95
MAX_PIXELS = 1 << 30  # a larger image is rejected rather than decoded (Pillow's own limit is 89 Mpx)
ENCODER = f"pillow {PIL.__version__}"  # re-encoded bytes depend on it, so finished shards do too
RESAMPLE = Image.Resampling.BICUBIC  # antialiased in Pillow; Lanczos is 40% slower for no visible gain at these scales
PROGRESS_BATCH = 16  # inputs a worker process handles between two progress reports

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


def fingerprint(name: str, sources: Sequence[Source], labels: dict[str, int], encoding: Encoding) -> str:
    """sha256 of what decides a shard's bytes: its inputs (where, how big, key, label) and the encoding."""
    planned = [[s.path, s.container, s.offset, s.size, s.key, labels.get(s.wnid), s.problem] for s in sources]
    text = json.dumps([FORMAT, VERSION, ENCODER, name, encoding.resize, encoding.quality, planned])
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


def build_manifest(
    classes: list[str],
    splits: Sequence[str],
    shards: list[dict],
    rejected: list[dict],
    options: dict,
    plan_sha256: str,
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
        "plan_sha256": plan_sha256,
    }


def node_manifest_name(node_index: int, node_count: int) -> str:
    return f"manifest.node-{node_index}-of-{node_count}.json"


def check_options(shard_size: int, resize: int | None, quality: int, workers: int, node_index: int,
                  node_count: int) -> None:
    if shard_size < 1:
        raise ConvertError(f"shard_size must be 1 or more, got {shard_size}")
    if resize is not None and resize < 1:
        raise ConvertError(f"resize must be 1 or more, got {resize}")
    if not 1 <= quality <= 100:
        raise ConvertError(f"quality must be between 1 and 100, got {quality}")
    if workers < 1:
        raise ConvertError(f"workers must be 1 or more, got {workers}")
    if node_count < 1:
        raise ConvertError(f"node_count must be 1 or more, got {node_count}")
    if not 0 <= node_index < node_count:
        raise ConvertError(
            f"node_index must be between 0 and node_count - 1 ({node_count - 1}), got {node_index}"
        )


# ---------------------------------------------------------------------------------------------------------
# The shell: writing shards, the journal, the manifest.


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_atomic(path: Path, data: dict) -> None:
    write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())


class DigestingWriter:
    """A write-only file object that hashes and counts what passes through it (tarfile needs write and tell)."""

    def __init__(self, f):
        self.f, self.sha256, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.f.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)

    def tell(self) -> int:
        return self.size


def journal_path(out: Path, name: str) -> Path:
    return out / JOURNAL / f"{name}.json"


def write_shard(
    src: Path,
    out: Path,
    shard: ShardPlan,
    labels: dict[str, int],
    encoding: Encoding,
    tick: Callable[[], None],
) -> dict:
    """Write one shard through a temporary file, journal it, rename it into place; return its record.

    `tick` is called once per input, written or rejected.
    """
    rejected: list[dict] = []
    count = 0
    handles: dict = {}
    fd, partial = tempfile.mkstemp(dir=out, prefix=f".{shard.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            writer = DigestingWriter(f)
            with tarfile.open(fileobj=writer, mode="w", format=tarfile.GNU_FORMAT) as tar:
                for source in shard.sources:
                    jpeg, reason = None, source.problem
                    if reason is None:
                        try:
                            jpeg, reason = prepare_image(read_input(src, source, handles), encoding)
                        except OSError as exc:
                            reason = f"unreadable: {exc.strerror or exc}"
                    if jpeg is None:
                        rejected.append({"path": source.path, "split": source.split, "reason": reason})
                    else:
                        label = str(labels[source.wnid]).encode("ascii")
                        tar.addfile(tar_member(f"{source.key}.jpg", len(jpeg)), io.BytesIO(jpeg))
                        tar.addfile(tar_member(f"{source.key}.cls", len(label)), io.BytesIO(label))
                        count += 1
                    tick()
            f.flush()
            os.fsync(f.fileno())
        entry = {"name": shard.name, "split": shard.split, "count": count, "bytes": writer.size,
                 "sha256": writer.sha256.hexdigest()}
        record = {"name": shard.name, "fingerprint": shard.fingerprint, "entry": entry, "rejected": rejected}
        write_json_atomic(journal_path(out, shard.name), record)
        os.replace(partial, out / shard.name)
    except OSError as exc:
        Path(partial).unlink(missing_ok=True)
        raise ConvertError(f"cannot write {out / shard.name}: {exc.strerror or exc}") from None
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    finally:
        for f in handles.values():
            f.close()
    return record


def verify(out: Path, record: dict) -> bool:
    """Is the shard on disk the one its record describes (size and sha256)?"""
    path, entry = out / record["name"], record["entry"]
    try:
        return path.stat().st_size == entry["bytes"] and sha256_of(path) == entry["sha256"]
    except OSError:
        return False


def load_records(out: Path, mine: list[ShardPlan], digest: str, manifest_names: Sequence[str]) -> dict[str, dict]:
    """Records of finished shards: a finished manifest of the same plan, then the journal (newer) on top."""
    by_name = {s.name: s for s in mine}
    records: dict[str, dict] = {}
    for name in manifest_names:
        try:
            data = json.loads((out / name).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("plan_sha256") != digest:
            continue
        try:
            rejected = {(r["split"], r["path"]): r for r in data["rejected"]}
            for entry in data["shards"]:
                shard = by_name.get(entry["name"])
                if shard is not None:
                    found = [rejected[(s.split, s.path)] for s in shard.sources if (s.split, s.path) in rejected]
                    records[shard.name] = {"name": shard.name, "fingerprint": shard.fingerprint, "entry": entry,
                                           "rejected": found}
        except (KeyError, TypeError):  # not a manifest this code wrote: convert those shards again
            continue
    for shard in mine:
        try:
            record = json.loads(journal_path(out, shard.name).read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("fingerprint") == shard.fingerprint:
            records[shard.name] = record
    return records


def remove_stale(out: Path, shards: list[ShardPlan], mine: list[ShardPlan], manifest_name: str,
                 first_node: bool) -> None:
    """Partial files of this node's shards, records and manifest (left by a killed run); on the first node,
    also shards and journal records of names this plan does not have (left by a run with other options)."""
    partials = [*out.glob(f".{manifest_name}.*.partial")]
    for shard in mine:
        partials += [*out.glob(f".{shard.name}.*.partial"), *(out / JOURNAL).glob(f".{shard.name}.*.partial")]
    for partial in partials:
        partial.unlink(missing_ok=True)
    if first_node:
        planned = {s.name for s in shards}
        for split in SPLITS:
            for path in out.glob(f"{split}-[0-9][0-9][0-9][0-9][0-9][0-9].tar"):
                if path.name not in planned:
                    path.unlink(missing_ok=True)
        for path in (out / JOURNAL).glob("*.json"):
            if path.name.removesuffix(".json") not in planned:
                path.unlink(missing_ok=True)


@contextmanager
def strict_decoding() -> Iterator[None]:
    """Make Pillow fail on truncated files and take large images quietly, for the duration."""
    saved = ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS
    ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS = False, MAX_PIXELS
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            yield
    finally:
        ImageFile.LOAD_TRUNCATED_IMAGES, Image.MAX_IMAGE_PIXELS = saved


# ---------------------------------------------------------------------------------------------------------
# Worker processes: each writes or verifies whole shards, and reports progress through a queue.

_progress: multiprocessing.Queue | None = None


def die_with_parent(parent: int) -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies, so a kill -9 of the run leaves no
    worker writing behind it."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def init_worker(progress: multiprocessing.Queue, parent: int) -> None:
    global _progress
    _progress = progress
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; the workers die with it
    die_with_parent(parent)


def worker_write(src: Path, out: Path, shard: ShardPlan, labels: dict[str, int], encoding: Encoding) -> dict:
    pending = 0

    def tick() -> None:
        nonlocal pending
        pending += 1
        if pending == PROGRESS_BATCH:
            _progress.put(pending)
            pending = 0

    with strict_decoding():
        record = write_shard(src, out, shard, labels, encoding, tick)
    if pending:
        _progress.put(pending)
    return record


@contextmanager
def worker_pool(workers: int) -> Iterator[tuple[futures.ProcessPoolExecutor, multiprocessing.Queue]]:
    ctx = multiprocessing.get_context("spawn")  # no fork: the parent may run threads (a progress bar)
    progress = ctx.Queue()
    pool = futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker,
                                       initargs=(progress, os.getpid()))
    try:
        yield pool, progress
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    else:
        pool.shutdown()
    finally:
        progress.close()


def run_parallel(progress, jobs: list[futures.Future], expected_ticks: int, on_sample) -> list:
    """Results of `jobs` in order, calling `on_sample` once per progress tick the workers report."""
    received = 0

    def drain(block: bool) -> None:
        nonlocal received
        while received < expected_ticks:
            try:
                n = progress.get(timeout=5) if block else progress.get_nowait()
            except queue.Empty:
                return
            received += n
            for _ in range(n):
                on_sample()

    pending = set(jobs)
    while pending:
        done, pending = futures.wait(pending, timeout=0.2, return_when=futures.FIRST_COMPLETED)
        drain(block=False)
        for job in done:
            job.result()  # a worker's exception stops the run here
    drain(block=True)  # the last reports may trail the results
    return [job.result() for job in jobs]


# ---------------------------------------------------------------------------------------------------------
# The run.


def convert(
    src: Path,
    out: Path,
    *,
    shard_size: int = 1000,
    seed: int = 0,
    resize: int | None = None,
    quality: int = DEFAULT_QUALITY,
    workers: int = 1,
    node_index: int = 0,
    node_count: int = 1,
    on_start: Callable[[int, int], None] | None = None,
    on_sample: Callable[[], None] | None = None,
) -> dict:
    """Convert this node's share of SRC into shards under OUT; return the manifest it wrote.

    `on_start(inputs, kept)` is called once the plan is made and finished shards are verified: the inputs
    left to convert and the shards kept from an earlier run. `on_sample` is then called once per input this
    run converts, written or rejected.
    """
    check_options(shard_size, resize, quality, workers, node_index, node_count)
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise ConvertError(f"SRC {src} does not exist")
    on_sample = on_sample or (lambda: None)
    on_start = on_start or (lambda inputs, kept: None)
    encoding = Encoding(resize, quality)

    listing = discover(src)
    labels = class_index(listing.classes)
    shards = plan(listing.sources, shard_size, seed, labels, encoding)
    digest = plan_digest(shards)
    mine = [shards[i] for i in shards_for_node(len(shards), node_index, node_count)]
    manifest_name = MANIFEST if node_count == 1 else node_manifest_name(node_index, node_count)
    try:
        (out / JOURNAL).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConvertError(f"cannot create {out / JOURNAL}: {exc.strerror or exc}") from None
    remove_stale(out, shards, mine, manifest_name, first_node=node_index == 0)
    records = load_records(out, mine, digest, [manifest_name, MANIFEST])

    try:
        done = convert_shards(src, out, mine, records, labels, encoding, workers, on_start, on_sample)
    except BrokenProcessPool:
        raise ConvertError("a worker process died (out of memory?); run the same command again to resume") from None
    options = {"shard_size": shard_size, "seed": seed, "resize": resize, "quality": quality,
               "source": str(src), "layout": listing.inputs}
    manifest = build_manifest(listing.classes, list(listing.sources), [done[s.name]["entry"] for s in mine],
                              [r for s in mine for r in done[s.name]["rejected"]], options, digest)
    if node_count > 1:
        manifest["node"] = {"index": node_index, "count": node_count, "planned": [s.name for s in shards]}
    write_json_atomic(out / manifest_name, manifest)
    for shard in mine:
        journal_path(out, shard.name).unlink(missing_ok=True)
    if node_count == 1:  # with several nodes another may still write into it: the merge removes it
        with contextlib.suppress(OSError):
            (out / JOURNAL).rmdir()
    return manifest


def convert_shards(src: Path, out: Path, mine: list[ShardPlan], records: dict[str, dict], labels: dict[str, int],
                   encoding: Encoding, workers: int, on_start: Callable[[int, int], None],
                   on_sample: Callable[[], None]) -> dict[str, dict]:
    """Keep the shards whose records verify, write the others; return every shard's record by name."""
    with contextlib.ExitStack() as stack:
        pool = progress = None
        if workers > 1 and mine:
            pool, progress = stack.enter_context(worker_pool(min(workers, len(mine))))
        candidates = [records[s.name] for s in mine if s.name in records]
        if pool is None:
            checks = [verify(out, r) for r in candidates]
        else:
            checks = list(pool.map(verify, [out] * len(candidates), candidates))
        kept = {r["name"]: r for r, ok in zip(candidates, checks, strict=True) if ok}
        todo = [s for s in mine if s.name not in kept]
        inputs = sum(len(s.sources) for s in todo)
        on_start(inputs, len(kept))
        if pool is None:
            with strict_decoding():
                written = [write_shard(src, out, s, labels, encoding, on_sample) for s in todo]
        else:
            jobs = [pool.submit(worker_write, src, out, s, labels, encoding) for s in todo]
            written = run_parallel(progress, jobs, inputs, on_sample)
    return {**kept, **{r["name"]: r for r in written}}


def merge_manifests(out: Path, node_count: int) -> dict:
    """Combine the node manifests of an N-node conversion into `manifest.json`; return it.

    Fails if a node manifest is missing, if the nodes disagree on classes, options or plan, or if a planned
    shard is missing. With one node there is nothing to merge and the existing manifest is returned.
    """
    out = Path(out)
    if node_count < 1:
        raise ConvertError(f"node_count must be 1 or more, got {node_count}")
    if node_count == 1:
        return load_manifest(out)
    for partial in out.glob(f".{MANIFEST}.*.partial"):  # left by a merge that was killed
        partial.unlink(missing_ok=True)
    parts = []
    for i in range(node_count):
        path = out / node_manifest_name(i, node_count)
        if not path.is_file():
            raise ConvertError(f"{path} not found: node {i} of {node_count} has not finished converting")
        try:
            parts.append(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            raise ConvertError(f"{path} is unreadable: {exc}") from None
    first = parts[0]

    def agreed(part: dict) -> tuple:
        return (part["classes"], list(part["splits"]), part["options"], part.get("plan_sha256"),
                part["node"]["planned"])

    if any(agreed(part) != agreed(first) for part in parts[1:]):
        raise ConvertError(
            f"node manifests under {out} disagree on classes, options or shard plan; "
            "convert again on every node"
        )
    shards = [shard for part in parts for shard in part["shards"]]
    missing = sorted(set(first["node"]["planned"]) - {s["name"] for s in shards})
    if missing:
        raise ConvertError(f"shards missing from the node manifests under {out}: {', '.join(missing)}")
    manifest = build_manifest(
        first["classes"],
        list(first["splits"]),
        shards,
        [r for part in parts for r in part["rejected"]],
        first["options"],
        first["plan_sha256"],
    )
    write_json_atomic(out / MANIFEST, manifest)
    with contextlib.suppress(OSError):  # every node has finished; only an empty journal goes
        (out / JOURNAL).rmdir()
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
    resize: int | None = None
    quality: int = DEFAULT_QUALITY
    layout: dict[str, str] = {}


class _Manifest(BaseModel):
    format: Literal["webdataset"]
    version: Literal[1]
    classes: list[str]
    splits: dict[str, _Split]
    shards: list[_Shard]
    rejected: list[_Rejected]
    options: _Options
    plan_sha256: str | None = None


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
