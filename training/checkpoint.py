"""The trainer's run directory on rank 0: proving it writable, writing a checkpoint whole or not at all, and finding
and checking the checkpoint a --resume continues from.

A checkpoint is what training/train.py saves at the end of each epoch: {"model", "optimizer", "scaler", "epoch",
"step", "rng", "config"}, written to a hidden temporary file, flushed to the disk and renamed over its name, so a
crash or Ctrl-C leaves the previous one or the new one, never half of one (rename(2) replaces its target atomically,
https://man7.org/linux/man-pages/man2/rename.2.html; fsync(2) first, so the name never points at data still in the
page cache, https://man7.org/linux/man-pages/man2/fsync.2.html).
"""

from __future__ import annotations

import os
import random
import uuid
from pathlib import Path

import numpy as np
import torch

KEYS = ("model", "optimizer", "scaler", "epoch", "step", "rng", "config")


class CheckpointError(ValueError):
    """A checkpoint that cannot continue this run; the message is one line naming it and what to do."""


def save_atomic(obj, path: Path) -> None:
    """torch.save `obj` to `path` whole: a temporary file beside it, fsync'ed, then renamed over `path`. Whatever
    stops the save (an error, Ctrl-C) removes the temporary file and leaves `path` as it was."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def output_problem(out: Path) -> str | None:
    """Make the run directory and prove this process can create, write and remove a file in it, as the run will; the
    problem in one line, or None. Run on rank 0 before the first step (a read-only directory or file system, a
    directory of another user: os.access answers yes to root whatever the mode, a write does not lie)."""
    probe = out / f".write-probe-{uuid.uuid4().hex}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        return f"--output {out}: cannot write there ({e.strerror or e}); name a directory this user can write"
    return None


def newest_checkpoint(out: Path, model: str) -> tuple[Path, dict] | None:
    """The newest checkpoint-epochNNN.pt in `out` and its content, or None when there is none. A newest one that does
    not load, or is not this trainer's, or was made by another model, is an error: resuming from an older one, or
    from scratch, would quietly throw its epochs away."""
    paths = sorted(out.glob("checkpoint-epoch*.pt"), reverse=True)
    if not paths:
        return None
    path = paths[0]
    fix = f"move it out of {out} to resume from the one before, or use another --output"
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch.load raises what unpickling or unzipping the bytes raised: any type
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise CheckpointError(f"checkpoint {path.name} cannot be read ({reason}); {fix}") from None
    missing = [k for k in KEYS if k not in state] if isinstance(state, dict) else list(KEYS)
    if missing or not isinstance(state.get("config"), dict) or not isinstance(state.get("model"), dict):
        lacks = ", ".join(missing) or "config"
        raise CheckpointError(f"checkpoint {path.name} is not one this trainer wrote (no {lacks}); {fix}")
    if state["config"].get("model") != model:
        raise CheckpointError(f"checkpoint {path.name} was made by {state['config'].get('model')}, not {model}; "
                              f"use another --output or the same --model")
    return path, state


def fit_problem(name: str, weights: dict, net: torch.nn.Module, num_classes: int) -> str | None:
    """Why `weights` (a checkpoint's "model") do not fit `net`: a tensor missing, extra, or of another shape (another
    class count changes the last layer's); None when they fit."""
    mine = net.state_dict()
    for key, tensor in mine.items():
        theirs = weights.get(key)
        if not isinstance(theirs, torch.Tensor):
            return f"checkpoint {name} has no {key}; it was made by another version of the model"
        if theirs.shape != tensor.shape:
            shape = lambda t: "x".join(map(str, t.shape)) or "scalar"  # noqa: E731
            classes = f" ({num_classes} classes)" if key.startswith("fc.") else ""
            return (f"checkpoint {name} holds {key} of shape {shape(theirs)}, this run's model has {shape(tensor)}"
                    f"{classes}: it was made for other data; use another --output")
    extra = sorted(set(weights) - set(mine))
    if extra:
        return f"checkpoint {name} holds {extra[0]}, which this run's model has not; use another --output"
    return None


def restore(path: Path, state: dict, net: torch.nn.Module, optimizer, scaler: torch.amp.GradScaler,
            num_classes: int) -> int:
    """Load a checkpoint newest_checkpoint returned into the model, optimizer, scaler and random streams; the epoch
    to start at. CheckpointError (one line) when it does not fit this run."""
    if problem := fit_problem(path.name, state["model"], net, num_classes):
        raise CheckpointError(problem)
    try:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        epoch = int(state["epoch"]) + 1
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError) as e:
        # Another --decay-bn-bias changes the optimizer's parameter groups: "loaded state dict has a different
        # number of parameter groups" (torch.optim.Optimizer.load_state_dict).
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise CheckpointError(f"checkpoint {path.name} does not fit this run ({reason}); resume with the options it "
                              f"was made with, or use another --output") from None
    if epoch < 1:
        raise CheckpointError(f"checkpoint {path.name} says epoch {state['epoch']}; use another --output")
    return epoch
