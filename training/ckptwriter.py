"""Rank 0's checkpoint writes, off the training loop: the step waits only for a copy of the state to host memory
(on a GPU, only for the copies to be queued into pinned memory: to_host);
one background thread writes that copy (training.checkpoint.save_atomic: temporary file, fsync, rename), then
deletes the mid-epoch checkpoints a newer one made stale, then hands the file to the S3 uploader, if any.

One write is in flight at most: the next checkpoint waits for the previous one first, so host memory holds at most
two copies of the state (the one being written, the one being made). PyTorch's own asynchronous checkpointing works
the same way, "first a copy of the state dict to CPU, then the write on a separate thread", and warns that the
copy must finish before the next optimizer step changes the tensors (torch.distributed.checkpoint.async_save,
https://docs.pytorch.org/docs/stable/distributed.checkpoint.html; the "Asynchronous Saving with Distributed
Checkpoint (DCP)" recipe, https://docs.pytorch.org/tutorials/recipes/distributed_async_checkpoint_recipe.html).
The copy here is a clone of every tensor, so the training loop may change its own at once.

A run's end, an error and Ctrl-C all go through `finish_writes`: the write in flight is finished (it was already
written to a hidden temporary name; save_atomic renames only a whole, fsync'ed file), never left half-done under a
checkpoint's name, because the trainer's exit (training.distributed.leave, os._exit) kills threads where they are.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path

import torch

from training.checkpoint import save_atomic, stale_mid_epoch

_LIVE: weakref.WeakSet[CheckpointWriter] = weakref.WeakSet()


def to_host(obj, reuse=None, copies: list | None = None):
    """A copy of `obj` (a state: dicts, lists, tuples of tensors and plain values) that shares no tensor memory with
    it: every tensor copied into CPU memory (on CPU, a clone; `to("cpu")` alone would return the same tensor).
    `reuse`: an earlier copy no longer in use; a tensor of the same shape and type there is copied into, not
    allocated again (fresh memory is paid for in page faults, which took most of a ResNet-50 copy here; PyTorch's
    asynchronous checkpointing keeps its staging buffers for the same reason: "cache_staged_state_dict",
    https://docs.pytorch.org/docs/stable/distributed.checkpoint.html).

    A GPU tensor goes into page-locked (pinned) host memory by an asynchronous copy: only from pinned memory does
    a device-to-host copy run at the bus's speed and return before it is done ("CUDA Semantics", "Use pinned memory
    buffers": https://docs.pytorch.org/docs/stable/notes/cuda.html#use-pinned-memory-buffers; the CUDA C++
    Programming Guide, "Page-Locked Host Memory"). Each such copy's device is added to `copies`; the copy may be
    read only after `copied()` of that list says the GPU has finished it (CheckpointWriter's thread waits there,
    not the training loop). The loop may go on at once: its next kernels run after the copies in stream order.
    Without `copies`, to_host waits for its copies itself before it returns."""
    queued: list = [] if copies is None else copies
    host = _to_host(obj, reuse, queued)
    if copies is None:
        for device in queued:
            torch.cuda.current_stream(device).synchronize()
    return host


def _to_host(obj, reuse, copies: list):
    if isinstance(obj, torch.Tensor):
        cuda = obj.device.type == "cuda"
        if (isinstance(reuse, torch.Tensor) and reuse.shape == obj.shape and reuse.dtype == obj.dtype
                and reuse.device.type == "cpu" and reuse.is_contiguous() and reuse.data_ptr() != obj.data_ptr()
                and (not cuda or reuse.is_pinned())):
            host = reuse
        elif cuda:
            host = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=True)
        else:
            return obj.detach().to("cpu", copy=True)
        host.copy_(obj.detach(), non_blocking=cuda)
        if cuda and obj.device not in copies:
            copies.append(obj.device)
        return host
    if isinstance(obj, dict):
        spare = reuse if isinstance(reuse, dict) else {}
        return {k: _to_host(v, spare.get(k), copies) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        spare = reuse if isinstance(reuse, list | tuple) and len(reuse) == len(obj) else [None] * len(obj)
        copied = [_to_host(v, r, copies) for v, r in zip(obj, spare, strict=True)]
        return copied if isinstance(obj, list) else tuple(copied)
    return copy.deepcopy(obj)


def copied(devices: list) -> list:
    """Events on each device's current stream, recorded after the copies to_host queued there: `synchronize()` on
    each is the copies' end."""
    return [torch.cuda.current_stream(d).record_event() for d in devices]


class CheckpointWriter:
    """`save(state, path)` returns once `state` is copied to host memory (the seconds the caller waited: the write
    before it, then the copy); the file appears whole at `path` later. `after(path)`: called in the writer's thread
    once the file is whole (the S3 uploader's submit). `wait` and `close` raise a write's error in the caller."""

    def __init__(self, out: Path, after: Callable[[Path], None] | None = None):
        self.out, self.after = out, after
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._spare = None  # the last write's host copy, copied into next time
        self.writes, self.stall_s = 0, 0.0
        _LIVE.add(self)

    def save(self, state: dict, path: Path) -> float:
        start = time.perf_counter()
        self.wait()
        devices: list = []
        host = self._spare = to_host(state, self._spare, devices)
        self._thread = threading.Thread(target=self._write, args=(host, path, copied(devices)),
                                        name="checkpoint-write", daemon=True)
        self._thread.start()
        waited = time.perf_counter() - start
        self.writes, self.stall_s = self.writes + 1, self.stall_s + waited
        return waited

    def _write(self, state: dict, path: Path, copies: list) -> None:
        try:
            for done in copies:  # the GPU's copies into host memory finished (to_host)
                done.synchronize()
            save_atomic(state, path)
            for name in stale_mid_epoch([p.name for p in self.out.glob("checkpoint-epoch*.pt")]):
                (self.out / name).unlink(missing_ok=True)
            if self.after is not None:
                self.after(path)
        except BaseException as e:  # noqa: BLE001 - handed to the training loop by wait()
            self._error = e

    def wait(self) -> None:
        """Block until the write in flight (if any) is whole; raise its error, if it had one."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    close = wait


def finish_writes() -> None:
    """Finish every write still in flight, ignoring their errors: the way out of a run that is ending anyway."""
    for writer in list(_LIVE):
        with contextlib.suppress(BaseException):  # the run's own error is the one to report
            writer.wait()
