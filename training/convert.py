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

OUT is one conversion's: a run resumes only what OUT's manifests (or the journal's `conversion.json`, written before
the first shard) say is a conversion of the same SRC with the same options, and refuses any other, including shards
that no manifest names, in one line, touching nothing; `replace` deletes the other conversion instead (issue 33).

Parallel: `workers` processes write whole shards. Several nodes share the work: every node computes the same
plan, and node i of N writes the shards whose index (counting train shards, then val shards) is i modulo N,
plus `manifest.node-<i>-of-<N>.json`; `merge_manifests` then writes `manifest.json`. A single node writes
`manifest.json` itself.

Where each part lives: the decisions (plan, encoding, fingerprints, the manifest's format) in training.shards; the
writing, verifying and the worker processes in training.shardwriter; the run and the merge here.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path

from training import inputfiles
from training.inputfiles import file_kind, follow
from training.outdir import ArgumentError, claim, release
from training.shards import (
    DEFAULT_QUALITY,
    MANIFEST,
    ConvertError,
    Encoding,
    ShardPlan,
    build_manifest,
    check_options,
    class_index,
    empty_entry,
    load_manifest,
    node_manifest_name,
    plan,
    plan_digest,
    shards_for_node,
)
from training.shardwriter import (
    journal_path,
    load_records,
    remove_stale,
    run_parallel,
    strict_decoding,
    verify,
    worker_pool,
    worker_write,
    write_json_atomic,
    write_shard,
)
from training.sources import TRAIN_TAR, VAL_TAR, discover, reading_folders

# What other code imports from here: the run, the merge, and (training.loader) the manifest reader.
__all__ = ["ArgumentError", "ConvertError", "convert", "load_manifest", "merge_manifests"]


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
    replace: bool = False,
    on_start: Callable[[int, int], None] | None = None,
    on_sample: Callable[[], None] | None = None,
) -> dict:
    """Convert this node's share of SRC into shards under OUT; return the manifest it wrote.

    `on_start(inputs, kept)` is called once the plan is made and finished shards are verified: the inputs
    left to convert and the shards kept from an earlier run. `on_sample` is then called once per input this
    run converts, written or rejected. OUT holding another conversion is an ArgumentError unless `replace`.
    """
    check_options(shard_size, resize, quality, workers, node_index, node_count, seed)
    src, out = Path(src), Path(out)
    check_paths(src, out)
    on_sample = on_sample or (lambda: None)
    on_start = on_start or (lambda inputs, kept: None)
    encoding = Encoding(resize, quality)

    listing = discover(src)
    labels = class_index(listing.classes)
    shards = plan(listing.sources, shard_size, seed, labels, encoding)
    digest = plan_digest(shards)
    mine = [shards[i] for i in shards_for_node(len(shards), node_index, node_count)]
    manifest_name = MANIFEST if node_count == 1 else node_manifest_name(node_index, node_count)
    options = {"shard_size": shard_size, "seed": seed, "resize": resize, "quality": quality,
               "source": os.path.abspath(src), "layout": listing.inputs, "max_input_bytes": inputfiles.MAX_INPUT_BYTES}
    claim(out, options, replace)
    remove_stale(out, shards, mine, manifest_name, first_node=node_index == 0)
    records = load_records(out, mine, digest, [manifest_name, MANIFEST])

    try:
        done = convert_shards(src, out, mine, records, labels, encoding, workers, on_start, on_sample)
    except BrokenProcessPool:
        raise ConvertError("a worker process died (out of memory?); run the same command again to resume") from None
    manifest = build_manifest(listing.classes, list(listing.sources), [done[s.name]["entry"] for s in mine],
                              [r for s in mine for r in done[s.name]["rejected"]], options, digest)
    trained = train_classes(mine, done)
    if node_count > 1:
        manifest["node"] = {"index": node_index, "count": node_count, "planned": [s.name for s in shards],
                            "train_classes": sorted(trained)}
    else:
        manifest["classes_without_train_images"] = without_train_images(manifest, trained)
    try:
        write_json_atomic(out / manifest_name, manifest)
    except OSError as exc:
        raise ConvertError(f"cannot write {out / manifest_name}: {exc.strerror or exc}") from None
    for shard in mine:
        journal_path(out, shard.name).unlink(missing_ok=True)
    if node_count == 1:  # with several nodes another may still write into it: the merge removes it
        release(out)
    return manifest


def train_classes(mine: list[ShardPlan], done: dict[str, dict]) -> set[str]:
    """The classes with at least one training sample in these shards: planned inputs less the rejected ones."""
    trained: set[str] = set()
    for shard in mine:
        if shard.split == "train":
            rejected = {r["path"] for r in done[shard.name]["rejected"]}
            trained |= {s.wnid for s in shard.sources if s.path not in rejected}
    return trained


def without_train_images(manifest: dict, trained: set[str]) -> list[str]:
    """Classes of the class list with no training sample (a class named only by the validation labels, or one
    whose every image was rejected): said in the manifest and by the CLI, never silent. None without a train split."""
    return sorted(set(manifest["classes"]) - trained) if "train" in manifest["splits"] else []


def check_paths(src: Path, out: Path) -> None:
    """ArgumentError (one line) when SRC is not a directory, OUT is a file, either is a broken or looping symbolic
    link, or OUT lies where the listing reads images (SRC's train/ or val/: the next run would take the shards
    folder for a class and its tars for images)."""
    for name, path in (("SRC", src), ("--out", out)):
        if path.is_symlink() and (problem := follow(path)[1]) is not None:  # exists() says False for both
            raise ArgumentError(f"{name} {path}: {problem}")
    if src.is_file():
        hint = f"; pass the directory that holds it: {src.parent}" if src.name in (TRAIN_TAR, VAL_TAR) else ""
        raise ArgumentError(f"SRC {src} is a file; SRC is the directory that holds train/ and val/ or {TRAIN_TAR} and "
                           f"{VAL_TAR}{hint}")
    if not src.exists():
        raise ArgumentError(f"SRC {src} does not exist")
    if not src.is_dir():  # a device (/dev/null), a FIFO or a socket: it exists, so say what it is
        raise ArgumentError(f"SRC {src} is not a directory ({file_kind(src.stat().st_mode)}); SRC is the directory "
                            f"that holds train/ and val/ or {TRAIN_TAR} and {VAL_TAR}")
    if out.exists() and not out.is_dir():
        what = "a file" if out.is_file() else file_kind(out.stat().st_mode)  # /dev/null is no file to write over
        raise ArgumentError(f"--out {out} is {what}, not a directory")
    where = Path(os.path.realpath(out))  # Path.resolve raises RuntimeError on a loop of links in a parent
    for read in reading_folders(src):
        if where == Path(os.path.realpath(read)) or Path(os.path.realpath(read)) in where.parents:
            raise ArgumentError(f"--out {out} is inside {read}, where the images are read from; write the shards "
                               f"outside SRC's train/ and val/ (e.g. beside them)")


def convert_shards(src: Path, out: Path, mine: list[ShardPlan], records: dict[str, dict], labels: dict[str, int],
                   encoding: Encoding, workers: int, on_start: Callable[[int, int], None],
                   on_sample: Callable[[], None]) -> dict[str, dict]:
    """Keep the shards whose records verify, write the others; return every shard's record by name."""
    with contextlib.ExitStack() as stack:
        pool = None
        if workers > 1 and mine:
            pool = stack.enter_context(worker_pool(min(workers, len(mine))))
        candidates = [records[s.name] for s in mine if s.name in records]
        if pool is None:
            checks = [verify(out, r) for r in candidates]
        else:
            checks = [job.result() for job in [pool.submit(verify, out, r) for r in candidates]]
        kept = {r["name"]: r for r, ok in zip(candidates, checks, strict=True) if ok}
        todo = [s for s in mine if s.name not in kept]
        inputs = sum(len(s.sources) for s in todo)
        on_start(inputs, len(kept))
        if pool is None:
            with strict_decoding():
                written = [write_shard(src, out, s, labels, encoding, on_sample) for s in todo]
        else:
            jobs = [pool.submit(worker_write, src, out, s, labels, encoding) for s in todo]
            written = run_parallel(pool.progress, jobs, inputs, on_sample)
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
            # bounded, never a FIFO (issue 33)
            parts.append(json.loads(inputfiles.read_limited(path, path.name, inputfiles.MAX_MANIFEST_BYTES)))
        except ValueError as exc:
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
    shards += [empty_entry(name) for part in parts for name in part.get("empty_shards", [])]
    missing = sorted(set(first["node"]["planned"]) - {s["name"] for s in shards})
    if missing:
        raise ConvertError(f"shards missing from the node manifests under {out}: {', '.join(missing)}")
    claim(out, first["options"], replace=False, manifests_only=True)  # a manifest.json of another conversion stays
    manifest = build_manifest(
        first["classes"],
        list(first["splits"]),
        shards,
        [r for part in parts for r in part["rejected"]],
        first["options"],
        first["plan_sha256"],
    )
    if all("train_classes" in part["node"] for part in parts):  # node manifests from before issue 33 lack them
        trained = {wnid for part in parts for wnid in part["node"]["train_classes"]}
        manifest["classes_without_train_images"] = without_train_images(manifest, trained)
    write_json_atomic(out / MANIFEST, manifest)
    release(out)  # every node has finished; only an empty journal goes
    return manifest
