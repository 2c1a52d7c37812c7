"""The trainer's run directory on rank 0: proving it writable, writing a checkpoint whole or not at all, and finding
and checking the checkpoint a --resume continues from.

A checkpoint is what training/train.py saves at the end of each epoch (and every --checkpoint-every steps, inside
one): {"model", "optimizer", "scaler", "epoch", "step", "rng", "config"}, written to a hidden temporary file,
flushed to the disk and renamed over its name, so a
crash or Ctrl-C leaves the previous one or the new one, never half of one (rename(2) replaces its target atomically,
https://man7.org/linux/man-pages/man2/rename.2.html; fsync(2) first, so the name never points at data still in the
page cache, https://man7.org/linux/man-pages/man2/fsync.2.html).
"""

from __future__ import annotations

import os
import random
import re
import uuid
from pathlib import Path

import numpy as np
import torch

KEYS = ("model", "optimizer", "scaler", "epoch", "step", "rng", "config")
# End of epoch N: checkpoint-epochNNN.pt; after S steps of the run, inside epoch N (--checkpoint-every):
# checkpoint-epochNNN-stepSSSSSSSS.pt. training/durable.py and launcher/execute/results.py read the same names.
NAME = re.compile(r"^checkpoint-epoch(\d+)(?:-step(\d+))?\.pt$")
KEEP_MID_EPOCH = 2  # mid-epoch checkpoints kept: the newest two (one may still be copying to S3)


def checkpoint_name(epoch: int, steps_done: int | None = None) -> str:
    """An end-of-epoch checkpoint's name, or (steps_done: steps the run has trained) a mid-epoch one's."""
    return f"checkpoint-epoch{epoch:03d}" + ("" if steps_done is None else f"-step{steps_done:08d}") + ".pt"


def name_order(name: str) -> tuple[int, float] | None:
    """How new a checkpoint name is (larger is newer: the epoch, then its steps, the epoch's end after all of
    them); None for a name that is not a checkpoint's."""
    m = NAME.match(name)
    return None if m is None else (int(m.group(1)), float("inf") if m.group(2) is None else int(m.group(2)))


def stale_mid_epoch(names: list[str], keep: int = KEEP_MID_EPOCH) -> list[str]:
    """Mid-epoch checkpoints to delete: all but the newest `keep`, and every one older than the newest end-of-epoch
    checkpoint (which holds all they hold)."""
    ordered = sorted((n for n in names if name_order(n) is not None), key=name_order)
    mids = [n for n in ordered if NAME.match(n).group(2) is not None]
    ends = [n for n in ordered if NAME.match(n).group(2) is None]
    newest_end = name_order(ends[-1]) if ends else None
    return [n for i, n in enumerate(mids)
            if i < len(mids) - keep or (newest_end is not None and name_order(n) < newest_end)]


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
    """The newest checkpoint in `out` (name_order: the most steps trained) and its content, or None when there is
    none. A newest one that does not load, or is not this trainer's, or was made by another model, is an error:
    resuming from an older one, or from scratch, would quietly throw its epochs away."""
    paths = sorted((p for p in out.glob("checkpoint-epoch*.pt") if name_order(p.name)),
                   key=lambda p: name_order(p.name), reverse=True)
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


def resume_point(state: dict) -> tuple[int, int]:
    """(epoch, steps of it already trained) a checkpoint continues at: the next epoch's start after an end-of-epoch
    one (and every checkpoint written before --checkpoint-every), the middle of its own epoch after a mid-epoch one."""
    at = state.get("resume_at")
    return (int(at[0]), int(at[1])) if at else (int(state["epoch"]) + 1, 0)


def restore(path: Path, state: dict, net: torch.nn.Module, optimizer, scaler: torch.amp.GradScaler,
            num_classes: int, steps: int) -> tuple[int, int]:
    """Load a checkpoint newest_checkpoint returned into the model, optimizer, scaler and random streams; the
    (epoch, steps of it already trained) to start at (resume_point). CheckpointError (one line) when it does not
    fit this run (`steps`: this run's steps per epoch, which a mid-epoch checkpoint must have been made with)."""
    if problem := fit_problem(path.name, state["model"], net, num_classes):
        raise CheckpointError(problem)
    made_with = state.get("steps_per_epoch")
    if state.get("resume_at") and state["resume_at"][1] and made_with != steps:
        raise CheckpointError(f"checkpoint {path.name} was made mid-epoch with {made_with} steps per epoch, this run "
                              f"has {steps}; resume with the same data, --batch-per-gpu and ranks, or use another "
                              f"--output")
    try:
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        torch.set_rng_state(state["rng"]["torch"])
        random.setstate(state["rng"]["python"])
        np.random.set_state(state["rng"]["numpy"])
        epoch, done = resume_point(state)
    except (ValueError, KeyError, TypeError, RuntimeError, IndexError) as e:
        # Another --decay-bn-bias changes the optimizer's parameter groups: "loaded state dict has a different
        # number of parameter groups" (torch.optim.Optimizer.load_state_dict).
        reason = " ".join(str(e).split())[:160] or type(e).__name__
        raise CheckpointError(f"checkpoint {path.name} does not fit this run ({reason}); resume with the options it "
                              f"was made with, or use another --output") from None
    if epoch < 1 and not done:
        raise CheckpointError(f"checkpoint {path.name} says epoch {state['epoch']}; use another --output")
    return epoch, done


def mid_epoch_due(step: int, steps: int, every: int) -> bool:
    """After global step index `step` (0-based) of an epoch of `steps`: is a mid-epoch checkpoint due? Every
    `every` steps of the run (0: none), except at an epoch's last step, where the end-of-epoch one is written."""
    return every > 0 and (step + 1) % every == 0 and (step + 1) % steps != 0


def checkpoint_state(net: torch.nn.Module, optimizer, scaler, cfg: dict, epoch: int, step: int, steps: int) -> dict:
    """What a checkpoint holds after global step index `step` of `epoch` (`steps` per epoch): the state, and where a
    --resume continues (resume_at: the next epoch's start after its last step, else this epoch's next step)."""
    done = step + 1 - epoch * steps
    return {"model": net.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
            "epoch": epoch, "step": step, "steps_per_epoch": steps,
            "resume_at": [epoch + 1, 0] if done == steps else [epoch, done],
            "rng": {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()},
            "config": cfg}


def trim_metrics(path: Path, steps_done: int) -> int:
    """Drop the metrics.jsonl rows a resumed run will write again (those of steps after `steps_done`, the steps its
    checkpoint holds), rewriting the file atomically; how many were dropped. A torn last line (a kill mid-write)
    goes too."""
    import json

    try:
        lines = path.read_text().splitlines()
    except FileNotFoundError:
        return 0
    kept = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] <= steps_done:
            kept.append(line)
    if len(kept) == len(lines):
        return 0
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(f"{line}\n" for line in kept))
    os.replace(tmp, path)
    return len(lines) - len(kept)
