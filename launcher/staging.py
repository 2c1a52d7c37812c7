"""Data staging as a pure plan: where the shards come from and what each node runs to put them in place.

- ``s3://bucket/prefix`` holding shards and ``manifest.json``: each node copies every N-th shard (so N nodes pull
  from S3 in parallel) into the shared directory; without shared storage every node copies all of them.
  With FSx importing that bucket the shards are already visible under the mount (loaded lazily); each node
  then only reads its share once (``lfs hsm_restore``) so the first epoch does not wait on S3.
- a directory on the nodes that holds ``manifest.json``: used as it is.
- anything else on the nodes (ImageNet as downloaded): converted on every node against shared storage
  (launcher.dataprep: ``--node-index I --node-count N``, then ``--merge``).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

from launcher.errors import LaunchError

__all__ = ["Staging", "decide", "s3_copy_scripts", "shard_share"]


@dataclass(frozen=True)
class Staging:
    kind: Literal["s3-copy", "fsx-import", "ready", "convert"]
    source: str                 # as the user gave it
    dest: str                   # shards directory as the nodes see it


def decide(data: str, *, storage: dict, data_bucket: str | None, shared_root: str) -> Staging:
    """What to do with ``--data`` on a cluster with this storage (the StorageMount output)."""
    if data.startswith("s3://"):
        bucket, _, prefix = data[5:].partition("/")
        prefix = prefix.strip("/")
        if not bucket:
            raise LaunchError(f"--data {data}: expected s3://BUCKET/PREFIX")
        if data_bucket and bucket != data_bucket:
            raise LaunchError(f"--data {data}: the nodes may only read s3://{data_bucket} (the stack's data_bucket)")
        if storage.get("type") == "fsx" and storage.get("data_repository", "").rstrip("/") == f"s3://{bucket}":
            return Staging("fsx-import", data, f"{storage['mount_point']}/{prefix}".rstrip("/"))
        return Staging("s3-copy", data, f"{shared_root}/data/{bucket}/{prefix}".rstrip("/"))
    return Staging("ready", data, data)


def shard_share(shards: list[str], index: int, count: int) -> list[str]:
    """Node ``index`` of ``count`` takes shards index, index+count, ... (the converter's split, too)."""
    return sorted(shards)[index::count]


def s3_copy_scripts(staging: Staging, shards: list[str], nodes: list[str], *, shared: bool) -> dict[str, str]:
    """Per node, the script that puts its share of the shards (all of them without shared storage) in place.

    ``shards`` are file names from the manifest. The first node also copies ``manifest.json``. Copies are
    ``aws s3 cp`` per file with ``--only-show-errors``; an interrupted staging is rerun as a whole (S3 copies
    are idempotent).
    """
    q = shlex.quote
    src = staging.source.rstrip("/")
    scripts = {}
    for i, node in enumerate(nodes):
        share = shard_share(shards, i, len(nodes)) if shared else sorted(shards)
        if staging.kind == "fsx-import":
            body = [f"cd {q(staging.dest)}"] + ([f"lfs hsm_restore {' '.join(q(s) for s in share)}"] if share else [])
        else:
            mine = share + (["manifest.json"] if i == 0 or not shared else [])
            body = [f"install -d {q(staging.dest)}"] + [
                f"aws s3 cp --only-show-errors {q(src + '/' + name)} {q(staging.dest + '/' + name)}" for name in mine]
        scripts[node] = "\n".join(["set -eu", *body]) + "\n"
    return scripts
