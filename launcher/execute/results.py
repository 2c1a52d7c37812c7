"""What comes back from a run directory on the first node: a pure plan over its listing, and the fetch.

On AWS the run directory lives on the cluster's storage (BeeGFS on RAM, FSx), which `--teardown` deletes with the
stack. So before teardown, and after a failed run too, the run's record comes to the launcher's machine:
metrics.jsonl, summary.json, the hostfile, TensorBoard events, an index of the checkpoints (name, epoch, bytes),
and the newest checkpoint when asked for (with `--teardown` it would be lost otherwise).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from launcher.cluster import Cluster, Node
from launcher.errors import LaunchError
from launcher.execute import remote

__all__ = ["LISTING", "RECORD", "RemoteFile", "checkpoint_index", "fetch", "fetch_plan", "local_copy",
           "resumes_after",
           "parse_listing"]

# Small files of a run: metrics once it has begun, restarts.json when it had any (launch train --max-restarts).
RECORD = ("metrics.jsonl", "summary.json", "hostfile", "restarts.json")
TENSORBOARD = "tensorboard/"
# The trainer's checkpoint names (training/checkpoint.py NAME): checkpoint-epochNNN.pt at an epoch's end,
# checkpoint-epochNNN-stepSSSSSSSS.pt inside epoch NNN after SSSSSSSS steps of the run (--checkpoint-every).
CHECKPOINT = re.compile(r"^checkpoint-epoch(\d+)(?:-step(\d+))?\.pt$")
# Every file at most two levels down (the run directory and tensorboard/), with its size; GNU find on the nodes.
LISTING = "find . -maxdepth 2 -type f -printf '%P\\t%s\\n'"


@dataclass(frozen=True)
class RemoteFile:
    path: str   # relative to the run directory
    size: int


def parse_listing(text: str) -> list[RemoteFile]:
    """LISTING's output; lines that are not `path<TAB>size` (a stray message) are skipped."""
    files = []
    for line in text.splitlines():
        path, sep, size = line.rpartition("\t")
        if sep and path and size.isdigit():
            files.append(RemoteFile(path, int(size)))
    return sorted(files, key=lambda f: f.path)


def checkpoint_index(files: list[RemoteFile]) -> list[dict]:
    """The run's checkpoints, oldest first (by epoch, then steps; an epoch's end after its mid-epoch ones): what
    `--resume` would start from is the last. "step": the run's steps a mid-epoch one holds; None at an epoch's end."""
    found = [(int(m.group(1)), None if m.group(2) is None else int(m.group(2)), f)
             for f in files if (m := CHECKPOINT.match(f.path))]
    found.sort(key=lambda x: (x[0], float("inf") if x[1] is None else x[1]))
    return [{"name": f.path, "epoch": epoch, "step": step, "bytes": f.size} for epoch, step, f in found]


def resumes_after(index: list[dict]) -> int | None:
    """The last epoch the newest checkpoint holds whole (what --resume starts after, in epochs), or None: a
    mid-epoch checkpoint of epoch N holds epochs up to N - 1 whole."""
    if not index:
        return None
    newest = index[-1]
    whole = newest["epoch"] if newest.get("step") is None else newest["epoch"] - 1
    return whole if whole >= 0 else None


def fetch_plan(files: list[RemoteFile], *, newest_checkpoint: bool) -> list[RemoteFile]:
    """The files to copy back: the record, TensorBoard events, and the newest checkpoint when asked for.
    Temporary files (a checkpoint being written, `.summary.json.tmp`) never are."""
    by_path = {f.path: f for f in files}
    chosen = [by_path[p] for p in RECORD if p in by_path]
    chosen += [f for f in files if f.path.startswith(TENSORBOARD) and not Path(f.path).name.startswith(".")]
    index = checkpoint_index(files)
    if newest_checkpoint and index:
        chosen.append(by_path[index[-1]["name"]])
    return chosen


def local_copy(state_root: Path, cluster: str, output: str) -> Path:
    """Where a cluster run's record lands on the launcher's machine: one directory per cluster and run."""
    return state_root / "runs" / cluster / Path(output.rstrip("/")).name


def fetch(cluster: Cluster, node: Node, output: str, dest: Path, *, newest_checkpoint: bool,
          timeout_s: float | None = None) -> list[RemoteFile]:
    """Copy the run's record from ``output`` on ``node`` into ``dest`` (each file written to a temporary name,
    then renamed), and write ``checkpoints.json`` there. Returns what was copied. ``timeout_s`` bounds reaching
    the node and listing the directory (after a hung node, the first node may be the one that hung)."""
    code, text = remote.check(cluster, node, f"cd {shlex.quote(output)} && {LISTING}", timeout_s=timeout_s)
    if code != 0:
        raise LaunchError(f"cannot list the run directory {output} on {node.name} (exit {code})")
    files = parse_listing(text)
    chosen = fetch_plan(files, newest_checkpoint=newest_checkpoint)
    dest.mkdir(parents=True, exist_ok=True)
    remote.get_files(cluster, node, [(f"{output}/{f.path}", dest / f.path) for f in chosen])
    tmp = dest / ".checkpoints.json.tmp"
    tmp.write_text(json.dumps({"run_directory": output, "node": node.name, "checkpoints": checkpoint_index(files)},
                              indent=1) + "\n")
    os.replace(tmp, dest / "checkpoints.json")
    return chosen
