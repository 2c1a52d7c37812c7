"""Writing and verifying shards on disk: one shard at a time through a temporary file and its journal record,
renamed into place when complete; the records a resumed run trusts; and the worker processes that write whole
shards in parallel and report progress through a queue. The decisions come from training.shards; training.convert
tells the whole story.
"""

from __future__ import annotations

import concurrent.futures as futures
import contextlib
import ctypes
import hashlib
import json
import multiprocessing
import os
import queue
import signal
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from PIL import Image, ImageFile

from training import jpegresize
from training.sample import write_atomic
from training.shards import (
    JOURNAL,
    MAX_PIXELS,
    ConvertError,
    Encoding,
    ShardPlan,
    prepare_image,
    tar_end,
    tar_header,
    tar_padding,
)
from training.sources import SPLITS, read_input

PROGRESS_BATCH = 16  # inputs a worker process handles between two progress reports


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
    """A write-only file object that hashes and counts what passes through it."""

    def __init__(self, f):
        self.f, self.sha256, self.size = f, hashlib.sha256(), 0

    def write(self, data: bytes) -> int:
        self.f.write(data)
        self.sha256.update(data)
        self.size += len(data)
        return len(data)


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
        # Resizing uses torch: one thread per writer, the writers being one process per core.
        threads = jpegresize.one_thread() if encoding.resize is not None else contextlib.nullcontext()
        with os.fdopen(fd, "wb") as f, threads:
            writer = DigestingWriter(f)
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
                    for member, data in ((f"{source.key}.jpg", jpeg), (f"{source.key}.cls", label)):
                        writer.write(tar_header(member, len(data)))
                        writer.write(data)
                        writer.write(tar_padding(len(data)))
                    count += 1
                tick()
            writer.write(tar_end(writer.size))
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
