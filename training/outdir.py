"""Whose OUT it is: a conversion writes into OUT only what OUT's records say is this conversion (issue 33).

A conversion is its SRC (the real path) and the options that decide its shards (--shard-size, --seed, --resize,
--quality). OUT names the conversion it holds in `manifest.json` and the node manifests once finished, and in
`.journal/conversion.json` from before the first shard is written until the manifest is; shards no record names
(another converter's, or one whose records were deleted) belong to nobody this run may resume. A run of another
conversion is refused in one line, with nothing touched, unless it asked to replace it (`--replace`): then the other
conversion's manifests go first, and its shards as training.shardwriter.remove_stale removes any shard this plan
does not have.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

from training.inputfiles import MAX_MANIFEST_BYTES, read_limited
from training.sample import write_atomic
from training.shards import JOURNAL, MANIFEST, ConvertError
from training.sources import SPLITS

CONVERSION = "conversion.json"  # in the journal: the conversion a run in progress (or killed) belongs to
IDENTITY = {"shard_size": "--shard-size", "seed": "--seed", "resize": "--resize", "quality": "--quality"}


class ArgumentError(ConvertError):
    """SRC or --out is not one this run can take (`launch data convert` exits 2, as for a bad option)."""


def identity(options: dict) -> dict:
    """What makes two runs the same conversion: SRC's real path and the options that decide the shards."""
    source = options.get("source")
    return {"source": os.path.realpath(source) if isinstance(source, str) else None,
            **{key: options.get(key) for key in IDENTITY}}


def differences(theirs: dict, mine: dict) -> str:
    """'its SRC is /a, this run's /b; its --seed is 1, this run's 0'."""
    a, b = identity(theirs), identity(mine)
    named = {"source": "SRC", **IDENTITY}
    return "; ".join(f"its {named[k]} is {a[k]}, this run's {b[k]}" for k in named if a[k] != b[k])


def records(out: Path, manifests_only: bool) -> list[tuple[str, dict | None]]:
    """(file, its options, or None when it is not a record this converter wrote) for every record of a conversion
    under OUT."""
    names = [MANIFEST, *sorted(p.name for p in out.glob("manifest.node-*-of-*.json"))]
    if not manifests_only:
        names.append(f"{JOURNAL}/{CONVERSION}")
    found = []
    for name in names:
        if not os.path.lexists(out / name):
            continue
        try:
            data = json.loads(read_limited(out / name, name, MAX_MANIFEST_BYTES))
        except ValueError:  # not JSON, or not a regular file (read_limited's one line)
            data = None
        options = data.get("options") if isinstance(data, dict) and name != f"{JOURNAL}/{CONVERSION}" else data
        found.append((name, options if isinstance(options, dict) and "source" in options else None))
    return found


def unnamed(out: Path) -> list[str]:
    """Shards and journal records under OUT (what a conversion writes), by name."""
    shards = sorted(p.name for split in SPLITS for p in out.glob(f"{split}-[0-9][0-9][0-9][0-9][0-9][0-9].tar"))
    return shards + sorted(f"{JOURNAL}/{p.name}" for p in (out / JOURNAL).glob("*.tar.json"))


def claim(out: Path, options: dict, replace: bool, manifests_only: bool = False) -> None:
    """Make OUT this conversion's, or ArgumentError (one line, nothing touched) when it holds another's and not
    `replace`. Unless `manifests_only` (the merge, which writes no shard), the journal then names this conversion."""
    mine = identity(options)
    files = unnamed(out) if out.is_dir() and not manifests_only else []  # before the records: a node starting
    found = records(out, manifests_only) if out.is_dir() else []          # beside this one names its shards first
    other = [(name, theirs) for name, theirs in found if theirs is None or identity(theirs) != mine]
    if not found and files:
        other = [(files[0], None)]
        if not replace:
            raise ArgumentError(f"--out {out} holds {files[0]}{' and more' if len(files) > 1 else ''}, which no "
                                f"manifest names as a conversion of SRC {options['source']}; convert into another "
                                f"directory, or add --replace to delete them")
    if other and not replace:
        name, theirs = other[0]
        why = (f"a conversion that is not this one ({differences(theirs, options)})" if theirs is not None
               else "a file that is not a manifest this converter wrote")
        raise ArgumentError(f"--out {out} holds {why} in {name}; convert into another directory, or add --replace "
                            f"to delete that conversion")
    if not manifests_only:
        try:
            (out / JOURNAL).mkdir(parents=True, exist_ok=True)
            for partial in (out / JOURNAL).glob(f".{CONVERSION}.*.partial"):  # left by a run killed writing it
                partial.unlink(missing_ok=True)
            write_atomic(out / JOURNAL / CONVERSION, (json.dumps(options, indent=2) + "\n").encode())
        except OSError as exc:
            raise ConvertError(f"cannot create {out / JOURNAL}: {exc.strerror or exc}") from None
    for name, _ in other:  # replace: the other conversion's manifests first, so no manifest names a shard it lost
        if name.startswith("manifest"):
            (out / name).unlink(missing_ok=True)


def release(out: Path) -> None:
    """The journal, once the manifest names the conversion: its record, then the folder if nothing else is left."""
    (out / JOURNAL / CONVERSION).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (out / JOURNAL).rmdir()
