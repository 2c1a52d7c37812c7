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
import multiprocessing.connection
import os
import queue
import signal
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from PIL import Image, ImageFile

from training import jpegresize
from training.inputfiles import MAX_MANIFEST_BYTES, read_limited
from training.sample import file_mode, write_atomic
from training.shards import (
    JOURNAL,
    MAX_PIXELS,
    ConvertError,
    Encoding,
    ShardPlan,
    empty_entry,
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
        os.fchmod(fd, file_mode())  # mkstemp's 0600 would stay the shard's mode after the rename
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
        if count == 0:  # every input rejected: no shard (an empty tar would be listed, read and staged for nothing)
            Path(partial).unlink(missing_ok=True)
            record = {"name": shard.name, "fingerprint": shard.fingerprint, "entry": empty_entry(shard.name),
                      "rejected": rejected}
            write_json_atomic(journal_path(out, shard.name), record)
            (out / shard.name).unlink(missing_ok=True)  # one an earlier run wrote under this name
            return record
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
    if not entry["count"]:  # a shard of rejected inputs only: finished when no file is there
        return not path.exists() and not path.is_symlink()
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
            data = json.loads(read_limited(out / name, name, MAX_MANIFEST_BYTES))  # bounded, never a FIFO (issue 33)
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict) or data.get("plan_sha256") != digest:
            continue
        try:
            rejected = {(r["split"], r["path"]): r for r in data["rejected"]}
            for entry in [*data["shards"], *(empty_entry(name) for name in data.get("empty_shards", []))]:
                shard = by_name.get(entry["name"])
                if shard is not None:
                    found = [rejected[(s.split, s.path)] for s in shard.sources if (s.split, s.path) in rejected]
                    records[shard.name] = {"name": shard.name, "fingerprint": shard.fingerprint, "entry": entry,
                                           "rejected": found}
        except (KeyError, TypeError):  # not a manifest this code wrote: convert those shards again
            continue
    for shard in mine:
        try:
            record = json.loads(read_limited(journal_path(out, shard.name), shard.name))
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
        for path in (out / JOURNAL).glob("*.tar.json"):  # a shard's record; conversion.json is training.outdir's
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
    # Ctrl-C is the parent's to handle: it stops the workers. SIGINT reached this process blocked (sigint_held), so
    # one sent during start-up is still pending; ignoring it discards it (POSIX, sigaction: "Setting a signal action
    # to SIG_IGN for a signal that is pending shall cause the pending signal to be discarded";
    # https://pubs.opengroup.org/onlinepubs/9699919799/functions/sigaction.html).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    die_with_parent(parent)


@contextmanager
def sigint_held() -> Iterator[None]:
    """A Ctrl-C that comes while a worker process starts takes effect once it has started, in this process only.

    A terminal's Ctrl-C goes to every process of the foreground process group, the workers too, and a worker that
    is still importing when it arrives dies of KeyboardInterrupt ("Fatal Python error: init_import_site") before
    its initializer could ignore SIGINT. A child inherits its parent's signal mask through fork and keeps it through
    execve (signal(7): https://man7.org/linux/man-pages/man7/signal.7.html), so one started while this thread blocks
    SIGINT starts with it blocked, until init_worker ignores it. CPython starts its resource tracker the same way
    (Lib/multiprocessing/resource_tracker.py, ensure_running). The mask alone does not keep a KeyboardInterrupt out
    of the start itself: another thread of this process (numpy's, torch's) may take the signal, and Python raises
    it in the main thread wherever it is, e.g. before the new worker was sent what to run (it then dies with an
    EOFError traceback). So for the duration Python's handler only notes the signal; it is raised here after.
    """
    noted: list[int] = []
    main = threading.current_thread() is threading.main_thread()  # only the main thread may set a handler
    handler = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum)) if main else None
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # a signal held back is noted now
        if main:
            signal.signal(signal.SIGINT, handler)
        if noted:
            signal.raise_signal(signal.SIGINT)  # as if it came now: KeyboardInterrupt under Python's handler


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


STOP_GRACE_S = 2.0  # after SIGTERM, how long a worker may take to die before it gets SIGKILL


class WorkerPool:
    """Worker processes that write or verify whole shards (ProcessPoolExecutor, spawned), started with SIGINT held
    back and stopped at once on Ctrl-C or any error."""

    def __init__(self, workers: int):
        ctx = multiprocessing.get_context("spawn")  # no fork: the parent may run threads (a progress bar)
        self.progress = ctx.Queue()
        self.pool = futures.ProcessPoolExecutor(workers, mp_context=ctx, initializer=init_worker,
                                                initargs=(self.progress, os.getpid()))

    def submit(self, fn: Callable, *args) -> futures.Future:
        with sigint_held():  # a worker process may start here (spawned workers start on demand)
            return self.pool.submit(fn, *args)

    def stop(self) -> None:
        """Cancel what has not started and end the workers now, without waiting for the shards they are writing
        (shutdown alone waits for those: Ctrl-C near the end waited for every shard). A killed worker leaves at
        most a temporary file, which the next run removes. Python 3.14's terminate_workers() does the same."""
        processes = list((self.pool._processes or {}).values())  # noqa: SLF001 - no public handle before 3.14
        manager = self.pool._executor_manager_thread  # noqa: SLF001 - shutdown() drops it; joined below
        self.pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in still_running(processes, STOP_GRACE_S):
            process.kill()
        # The pool's manager thread closes its wake-up pipe once it sees the workers gone. On Python 3.11 the
        # interpreter's exit hook writes to that pipe unlocked and, when the two cross, prints a traceback after
        # "error: interrupted" (OSError: Bad file descriptor, in concurrent.futures.process._python_exit); waiting
        # for the thread here leaves the pipe closed, and the hook then skips it.
        if manager is not None:
            manager.join(STOP_GRACE_S)


def still_running(processes: list, timeout: float) -> list:
    """The processes that have not ended within `timeout` seconds (a process's sentinel is ready when it ends)."""
    deadline, left = time.monotonic() + timeout, list(processes)
    while left and (remaining := deadline - time.monotonic()) > 0:
        ready = multiprocessing.connection.wait([p.sentinel for p in left], timeout=remaining)
        left = [p for p in left if p.sentinel not in ready]
    return left


@contextmanager
def worker_pool(workers: int) -> Iterator[WorkerPool]:
    pool = WorkerPool(workers)
    try:
        yield pool
    except BaseException:
        pool.stop()
        raise
    else:
        pool.pool.shutdown()
    finally:
        pool.progress.close()


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
