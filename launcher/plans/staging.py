"""Data staging as a pure plan: where the shards come from and what each node runs to put them in place.

- ``s3://bucket/prefix`` holding shards and ``manifest.json``: each node copies every N-th shard (so N nodes pull
  from S3 in parallel) into the shared directory; without shared storage every node copies all of them.
  With FSx importing that bucket the shards are already visible under the mount (loaded lazily); each node
  then only reads its share once (``lfs hsm_restore``) so the first epoch does not wait on S3.
- a directory on the nodes that holds ``manifest.json``: used as it is.
- anything else on the nodes (ImageNet as downloaded): converted on every node against shared storage
  (launcher.plans.dataprep: ``--node-index I --node-count N``, then ``--merge``) into ``shards_dir``; the merged
  ``manifest.json`` is written last, so its presence there means a finished conversion and a later run uses it.

For a directory the shell first runs ``probe_script(probe_paths(...))`` on the first node and hands what it
printed (``parse_probe``) to ``decide``: facts in, plan out.
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Literal

from launcher.errors import LaunchError

__all__ = ["Staging", "check_source", "cli_error", "decide", "no_s3_manifest", "parse_probe", "probe_paths",
           "probe_script", "s3_copy_scripts", "s3_manifest_command", "s3_read_failure", "shard_share", "shards_dir"]

Found = Literal["manifest", "dir", "missing"]


@dataclass(frozen=True)
class Staging:
    kind: Literal["s3-copy", "fsx-import", "ready", "convert"]
    source: str                 # as the user gave it (convert: the ImageNet directory the nodes read)
    dest: str                   # shards directory as the nodes see it


def _shared(storage: dict) -> bool:
    return storage.get("type", "none") != "none" and bool(storage.get("mount_point"))


def shards_dir(source: str, shared_root: str) -> str:
    """Where the shards of ImageNet at ``source`` go: named after it, plus a hash so two sources never collide."""
    path = source.rstrip("/") or "/"
    name = PurePosixPath(path).name or "root"
    return f"{shared_root}/data/shards-{name}-{hashlib.sha256(path.encode()).hexdigest()[:8]}"


def probe_paths(data: str, *, shared_root: str) -> list[str]:
    """The directories whose state decides a directory ``--data``: itself, and where its shards would go."""
    return [data.rstrip("/") or "/", shards_dir(data, shared_root)]


def probe_script(paths: list[str]) -> str:
    """Shell that prints ``manifest PATH``, ``dir PATH`` or ``missing PATH`` for each path."""
    return "; ".join(f"if [ -f {shlex.quote(p + '/manifest.json')} ]; then echo manifest {shlex.quote(p)}; "
                     f"elif [ -d {shlex.quote(p)} ]; then echo dir {shlex.quote(p)}; "
                     f"else echo missing {shlex.quote(p)}; fi" for p in paths)


def parse_probe(text: str) -> dict[str, Found]:
    found: dict[str, Found] = {}
    for line in text.splitlines():
        state, _, path = line.strip().partition(" ")
        if state in ("manifest", "dir", "missing") and path:
            found[path] = state  # type: ignore[assignment]
    return found


def decide(data: str, *, storage: dict, data_bucket: str | None, shared_root: str,
           found: Mapping[str, Found] | None = None, node: str = "the first node") -> Staging:
    """What to do with ``--data`` on a cluster with this storage (the StorageMount output).

    ``found``: for a directory, what ``probe_script(probe_paths(...))`` printed on ``node``, parsed.
    """
    if data.startswith("s3://"):
        check_source(data, data_bucket)
        bucket, _, prefix = data[5:].partition("/")
        prefix = prefix.strip("/")
        if storage.get("type") == "fsx" and storage.get("data_repository", "").rstrip("/") == f"s3://{bucket}":
            return Staging("fsx-import", data, f"{storage['mount_point']}/{prefix}".rstrip("/"))
        return Staging("s3-copy", data, f"{shared_root}/data/{bucket}/{prefix}".rstrip("/"))
    if not data.startswith("/"):
        raise LaunchError(f"--data {data}: give an absolute path as the nodes see it, or s3://BUCKET/PREFIX")
    src, dest = probe_paths(data, shared_root=shared_root)
    state = (found or {}).get(src, "missing")
    if state == "manifest":
        return Staging("ready", src, src)
    if state == "missing":
        raise LaunchError(f"--data {data}: no such directory on {node}; give shards (with manifest.json) or "
                          f"ImageNet as the nodes see it, or s3://BUCKET/PREFIX")
    if not _shared(storage):
        raise LaunchError(f"--data {data} has no manifest.json and this stack has no shared storage to convert it "
                          f"on; convert it with `launch data convert` and upload the shards to S3 (--data "
                          f"s3://BUCKET/PREFIX), or deploy with -c storage=fsx or beegfs")
    if (found or {}).get(dest) == "manifest":  # converted by an earlier run
        return Staging("ready", src, dest)
    return Staging("convert", src, dest)


def check_source(data: str, data_bucket: str | None, stack: str = "the stack") -> None:
    """An ``s3://`` ``--data`` the nodes may read, or a one-line LaunchError naming the bucket they may read.

    The node role reads one bucket, the stack's ``-c data_bucket`` (infra/compute.py, NodeIdentity), and nothing
    else: "By default, users and roles don't have permission to create or modify Amazon S3 resources" and an
    identity needs a policy that allows the action (https://docs.aws.amazon.com/AmazonS3/latest/userguide/
    security_iam_id-based-policy-examples.html). Any other bucket answers the nodes' ``aws s3`` with AccessDenied
    (403) once the cluster is up and the data about to be staged; said here, before anything starts, it costs
    nothing. (A bucket policy in another account could grant the role, but the role's own policy must allow it
    too.)
    """
    if not data.startswith("s3://"):
        return
    bucket = data[5:].partition("/")[0]
    if not bucket:
        raise LaunchError(f"--data {data}: expected s3://BUCKET/PREFIX")
    if data_bucket is None:
        raise LaunchError(f"--data {data}: {stack} was deployed without -c data_bucket, so its nodes may read no S3 "
                          f"bucket; deploy it with -c data_bucket={bucket} (`npx cdk deploy -c data_bucket={bucket} "
                          f"...`), or give shards on the nodes' storage")
    if bucket != data_bucket:
        raise LaunchError(f"--data {data}: the nodes of {stack} may only read s3://{data_bucket} (its -c "
                          f"data_bucket={data_bucket}); put the shards there, or deploy with -c data_bucket={bucket}")


def cli_error(stderr: str, stdout: str = "") -> str:
    """The AWS CLI's own reason, one line: the last line it printed on stderr (``fatal error: An error occurred
    (403) when calling the HeadObject operation: Forbidden``, ``download failed: ... AccessDenied ...``)."""
    lines = [line.strip() for line in (stderr or stdout).splitlines() if line.strip()]
    return lines[-1] if lines else ""


def s3_read_failure(source: str, node: str, error: str) -> str:
    """The one-line error when ``manifest.json`` under ``source`` could not be read on ``node``; ``error``: the CLI's
    line. A missing object is a 404 (HeadObject has no body, so the CLI prints "(404) ... Not Found"); anything else
    (403 Forbidden / AccessDenied, a wrong Region, no route to S3) is said as the CLI said it."""
    if "(404)" in error or "NoSuchKey" in error or "Not Found" in error:
        return no_s3_manifest(source, node) + (f" (the AWS CLI: {error})" if error else "")
    return (f"reading {source.rstrip('/')}/manifest.json on {node} failed: {error or 'no output'}; the node role may "
            f"read only the stack's -c data_bucket, in the stack's region")


def no_s3_manifest(source: str, node: str) -> str:
    """The one-line error for an S3 prefix without manifest.json."""
    return (f"no manifest.json under {source} (read from {node}); either put shards there (`launch data convert`, "
            f"then upload the shards and manifest.json), or link the bucket to FSx (deploy with -c storage=fsx "
            f"-c data_bucket=BUCKET) and pass ImageNet's path under the mount as --data to convert it there")


def shard_share(shards: list[str], index: int, count: int) -> list[str]:
    """Node ``index`` of ``count`` takes shards index, index+count, ... (the converter's split, too)."""
    return sorted(shards)[index::count]


def _s3(aws_cli: str, region: str) -> str:
    """``aws ... s3`` as the nodes run it: the image's AWS CLI by its absolute path (a non-login SSH shell has no
    PATH to it; ami/paths.py), and the stack's region given explicitly.

    The nodes have no AWS configuration (no ``~/.aws/config``, no ``AWS_DEFAULT_REGION``), and the region decides
    where the request goes: ``--region`` "specifies which AWS Region to send this command's AWS request to" and
    overrides every other setting (https://docs.aws.amazon.com/cli/latest/userguide/cli-configure-options.html,
    "--region"). It must be the stack's: the node subnet reaches S3 only through the VPC's gateway endpoint, and a
    gateway endpoint serves buckets in its own Region only (https://docs.aws.amazon.com/vpc/latest/privatelink/
    vpc-endpoints-s3.html, "Considerations").
    """
    if not region:
        raise LaunchError("no AWS region for the nodes' aws s3 commands; discover the cluster again "
                          "(`launch discover`)")
    return f"{shlex.quote(aws_cli)} --region {shlex.quote(region)} s3"


def s3_manifest_command(source: str, *, aws_cli: str, region: str) -> str:
    """What the first node runs to print ``manifest.json`` under an ``s3://`` prefix."""
    return f"{_s3(aws_cli, region)} cp --only-show-errors {shlex.quote(source.rstrip('/') + '/manifest.json')} -"


def s3_copy_scripts(staging: Staging, shards: list[str], nodes: list[str], *, shared: bool, aws_cli: str,
                    region: str) -> dict[str, str]:
    """Per node, the script that puts its share of the shards (all of them without shared storage) in place.

    ``shards`` are file names from the manifest. The first node also copies ``manifest.json``. Each node runs one
    ``aws s3 cp --recursive`` filtered to its files (the CLI copies them concurrently; one process per shard would
    spend about a second starting Python for each of ImageNet's ~1,300 shards); an interrupted staging is rerun
    as a whole (S3 copies are idempotent). ``aws_cli``: the AWS CLI's path on the nodes (ami.paths.AWS_CLI; tests
    point it at a local S3 endpoint); ``region``: the stack's (see ``_s3``).
    """
    q = shlex.quote
    src = staging.source.rstrip("/")
    s3 = _s3(aws_cli, region)
    scripts = {}
    for i, node in enumerate(nodes):
        share = shard_share(shards, i, len(nodes)) if shared else sorted(shards)
        if staging.kind == "fsx-import":
            body = [f"cd {q(staging.dest)}"] + ([f"lfs hsm_restore {' '.join(q(s) for s in share)}"] if share else [])
        else:
            mine = share + (["manifest.json"] if i == 0 or not shared else [])
            body = [f"install -d {q(staging.dest)}"]
            if mine:
                # Filters apply in order: exclude everything, then include this node's names (no glob characters
                # in shard names, so each matches itself only).
                body.append(f"{s3} cp --recursive --only-show-errors {q(src + '/')} {q(staging.dest + '/')} "
                            f"--exclude '*' " + " ".join(f"--include {q(name)}" for name in mine))
        scripts[node] = "\n".join(["set -eu", *body]) + "\n"
    return scripts
