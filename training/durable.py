"""Durable checkpoints: rank 0 copies each epoch's checkpoint to S3 in the background; `--resume` restores the
newest complete one from there when the run directory lost it.

S3 has no rename, so "complete" is said by a second, small object written only after the checkpoint's upload
succeeded: ``KEY.complete`` holding the checkpoint's name, size and SHA-256. A PUT creates an object only once the
whole body arrived ("Amazon S3 never adds partial objects; if you receive a success response, Amazon S3 added the
entire object": https://docs.aws.amazon.com/AmazonS3/latest/API/API_PutObject.html), but a checkpoint overwritten
by a rerun of the same epoch, or uploaded by a tool that did not finish, must not be taken for the one a marker
describes: the marker goes first (deleted), then the object, then the new marker; a reader takes a checkpoint only
when its marker exists and its size and SHA-256 match what it downloaded. The decisions (keys, marker content,
which checkpoint is newest and complete, whether to restore) are pure functions; the AWS CLI only executes them.

Before a step is trained, rank 0 proves the destination takes what the run will do there (``probe``): a small
object under the prefix is written, read back and deleted with the same CLI calls the uploads and a restore make,
so a bucket that does not exist, a prefix outside the node role's grant (infra/compute.py, ``_grant_checkpoints``)
or a bucket in another Region stops the run at its start, not after hours of training without a durable checkpoint.

The CLI runs with ``--region`` always: the nodes have no AWS configuration and reach S3 through the VPC's gateway
endpoint, which serves its own Region only (launcher/plans/staging.py, ``_s3``, cites the documents).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import re
import socket
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# The trainer's checkpoint names (training/checkpoint.py NAME; launcher/execute/results.py's CHECKPOINT reads the
# same): checkpoint-epochNNN.pt at an epoch's end, checkpoint-epochNNN-stepSSSSSSSS.pt inside it (--checkpoint-every).
CHECKPOINT = re.compile(r"^checkpoint-epoch(\d+)(?:-step(\d+))?\.pt$")


def order(name: str) -> tuple[int, float]:
    """How new a checkpoint name is: its epoch, then its steps (an epoch's end after every mid-epoch one)."""
    m = CHECKPOINT.match(name)
    assert m is not None, name
    return int(m.group(1)), float("inf") if m.group(2) is None else int(m.group(2))
MARKER_SUFFIX = ".complete"
PROBE_PREFIX = ".scaletrain-probe-"  # + host-pid: one key per trainer, never a CHECKPOINT name
TIMEOUT_S = 3600.0  # one CLI call; a checkpoint of ResNet-50 with its optimizer state is ~200 MB


class DurableError(RuntimeError):
    """A one-line problem with --checkpoint-to (its value, or S3 during a restore)."""


@dataclass(frozen=True)
class Target:
    bucket: str
    prefix: str  # without leading or trailing '/'; '' = the bucket's top

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def url(self, name: str) -> str:
        return f"s3://{self.bucket}/{self.key(name)}"

    @property
    def list_prefix(self) -> str:
        return f"{self.prefix}/" if self.prefix else ""


def parse_target(uri: str) -> Target:
    """``s3://BUCKET[/PREFIX]``; anything else is a one-line error naming what is allowed."""
    m = re.fullmatch(r"s3://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/.*)?", uri)
    if not m:
        raise DurableError(f"--checkpoint-to must be s3://BUCKET/PREFIX (a bucket name: 3-63 lowercase letters, "
                           f"digits, '.' or '-'), got '{uri}'")
    return Target(m.group(1), (m.group(2) or "").strip("/"))


def check_options(checkpoint_to: str, region: str, aws_cli: str) -> str | None:
    """The problem with the trainer's --checkpoint-to/--aws-region/--aws-cli, or None."""
    if not checkpoint_to:
        return None
    try:
        parse_target(checkpoint_to)
    except DurableError as e:
        return str(e)
    if not region:
        return "--checkpoint-to needs --aws-region (the bucket's; the nodes have no AWS configuration)"
    if not aws_cli.startswith("/"):
        return f"--checkpoint-to needs --aws-cli, the AWS CLI's absolute path (the image's: /usr/local/bin/aws), " \
               f"got '{aws_cli}'"
    return None


def marker_text(name: str, size: int, sha256: str) -> str:
    return json.dumps({"checkpoint": name, "size": size, "sha256": sha256}, sort_keys=True) + "\n"


def parse_marker(text: str) -> dict | None:
    """A marker's content, or None when it is not one (torn, foreign)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return None
    if not (isinstance(doc, dict) and isinstance(doc.get("size"), int) and isinstance(doc.get("sha256"), str)
            and isinstance(doc.get("checkpoint"), str)):
        return None
    return doc


def complete_candidates(target: Target, listing: dict[str, int]) -> list[str]:
    """Checkpoint names under ``target`` that have a marker, newest epoch first. ``listing``: key -> size of every
    object under the prefix. A checkpoint without its marker (an upload that did not finish, or was superseded
    and not yet re-marked) is never a candidate."""
    names = {}
    for key in listing:
        rest = key[len(target.list_prefix):] if key.startswith(target.list_prefix) else None
        if rest and CHECKPOINT.match(rest) and target.key(rest) + MARKER_SUFFIX in listing:
            names[rest] = order(rest)
    return sorted(names, key=lambda n: names[n], reverse=True)


def marker_matches(marker: dict | None, name: str, size: int, sha256: str | None = None) -> bool:
    """Does the marker describe this object (its listed size; its content, once downloaded)?"""
    return (marker is not None and marker["checkpoint"] == name and marker["size"] == size
            and (sha256 is None or marker["sha256"] == sha256))


def newest_local_epoch(out: Path) -> tuple[int, float] | None:
    """The newest local checkpoint's `order`, or None when there is none."""
    return max((order(p.name) for p in out.glob("checkpoint-epoch*.pt") if CHECKPOINT.match(p.name)), default=None)


def should_restore(local: tuple[int, float] | int | None, remote_name: str) -> bool:
    """Restore only what the run directory lacks: a remote checkpoint newer than every local one (`local`: the
    newest local one's `order`, or an epoch, meaning that epoch's end)."""
    if isinstance(local, int):
        local = (local, float("inf"))
    return local is None or order(remote_name) > local


def digest(path: Path) -> tuple[int, str]:
    """(size, SHA-256 hex) of a file, read in 8 MiB blocks (hashlib releases the GIL on each)."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(8 << 20):
            h.update(block)
            size += len(block)
    return size, h.hexdigest()


# ---- the AWS CLI commands (argv), pure ----

def _aws(aws_cli: str, region: str, *args: str) -> list[str]:
    return [aws_cli, "--region", region, *args]


def upload_commands(target: Target, path: Path, aws_cli: str, region: str) -> list[list[str]]:
    """Old marker out, checkpoint up, then (stdin) the new marker: the order that keeps a marker from ever
    describing an object other than the one beside it."""
    url = target.url(path.name)
    return [_aws(aws_cli, region, "s3", "rm", "--only-show-errors", url + MARKER_SUFFIX),
            _aws(aws_cli, region, "s3", "cp", "--only-show-errors", str(path), url),
            _aws(aws_cli, region, "s3", "cp", "--only-show-errors", "-", url + MARKER_SUFFIX)]


def probe_name(host: str, pid: int) -> str:
    """The probe's object name: unique to this host and process, one key segment whatever the host is called."""
    return f"{PROBE_PREFIX}{re.sub(r'[^A-Za-z0-9.-]+', '-', host)}-{pid}"


def probe_commands(target: Target, name: str, aws_cli: str, region: str) -> list[list[str]]:
    """Write (from stdin), read back (to stdout), delete: the calls an upload (``cp -`` of the marker, ``rm`` of
    the old one) and a restore (``cp URL -`` of a marker) make, with the same argv shape. The AWS CLI command
    reference, ``aws s3 cp``, "Example 11: Uploading a local file stream to S3" (``aws s3 cp - s3://bucket/key``
    reads standard input) and "Example 13: Downloading an S3 object as a local file stream" (``aws s3 cp
    s3://bucket/key -`` writes standard output), https://docs.aws.amazon.com/cli/latest/reference/s3/cp.html;
    ``aws s3 rm s3://bucket/key`` deletes one object, https://docs.aws.amazon.com/cli/latest/reference/s3/rm.html
    ("Example 1: Delete an S3 object"). Each is a PutObject, GetObject or DeleteObject, the three object
    actions the node role is granted under the prefix and nowhere else (infra/compute.py, ``_grant_checkpoints``,
    cites the Service Authorization Reference)."""
    url = target.url(name)
    return [_aws(aws_cli, region, "s3", "cp", "--only-show-errors", "-", url),
            _aws(aws_cli, region, "s3", "cp", "--only-show-errors", url, "-"),
            _aws(aws_cli, region, "s3", "rm", "--only-show-errors", url)]


# S3 refuses a PutObject into a bucket encrypted with a customer-managed KMS key unless the caller may
# kms:GenerateDataKey on it, and a GetObject unless it may kms:Decrypt
# (https://docs.aws.amazon.com/AmazonS3/latest/userguide/UsingKMSEncryption.html, "Permissions"); IAM's denial names
# the action and the key: "... is not authorized to perform: kms:GenerateDataKey on resource: arn:aws:kms:...:key/..."
# (https://docs.aws.amazon.com/IAM/latest/UserGuide/troubleshoot_access-denied.html).
_KMS_DENIED = re.compile(r"kms:(GenerateDataKey|Decrypt)\b(?:.*?on resource:\s*(arn:aws[a-z-]*:kms:[^\s\"']+))?")


def probe_failure(uri: str, region: str, reason: str) -> str:
    """The one line a failed probe ends the run with: where, the AWS CLI's own reason, what to do."""
    head = (f"--checkpoint-to {uri} (region {region}): rank 0 could not write, read back and delete a test object "
            f"there before training ({reason}); ")
    kms = _KMS_DENIED.search(reason)
    if kms:
        key = kms.group(2) or "<the bucket's KMS key ARN>"
        return (head + f"the bucket encrypts with a customer-managed KMS key and the node role may not use it "
                       f"(kms:{kms.group(1)}): deploy with -c checkpoint_kms_key={key}")
    return (head + f"the node role may write only under the stack's -c checkpoint_bucket=/checkpoint_prefix=; deploy "
                   f"with them or choose a destination under them (a bucket in {region})")


def upload_summary(uri: str, failed: list[str], attempted: int, newest_durable: str | None) -> str | None:
    """The end of a run whose copies did not all succeed: how many failed, and what a restore can still take."""
    if not failed:
        return None
    where = parse_target(uri).url(newest_durable) if newest_durable else "none"
    return (f"warning: {len(failed)} of {attempted} checkpoint uploads to {uri} failed ({', '.join(failed)}); "
            f"the newest checkpoint durable in S3 is {where}")


def list_command(target: Target, aws_cli: str, region: str) -> list[str]:
    # list-objects-v2 pages through every key itself (the CLI's automatic pagination).
    return _aws(aws_cli, region, "s3api", "list-objects-v2", "--bucket", target.bucket, "--prefix",
                target.list_prefix, "--output", "json")


def parse_listing(text: str) -> dict[str, int]:
    doc = json.loads(text) if text.strip() else {}
    return {o["Key"]: int(o["Size"]) for o in doc.get("Contents") or []}


# ---- the thin shell ----

def _run(argv: list[str], stdin: str | None = None) -> str:
    try:
        proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DurableError(f"{' '.join(argv[3:5])} failed: {e}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise DurableError(f"{' '.join(argv[3:5])} failed: {last}")
    return proc.stdout


def upload(target: Target, path: Path, aws_cli: str, region: str) -> None:
    size, sha = digest(path)
    rm, put, mark = upload_commands(target, path, aws_cli, region)
    _run(rm)
    _run(put)
    _run(mark, stdin=marker_text(path.name, size, sha))


def probe(uri: str, aws_cli: str, region: str) -> None:
    """Write, read back and delete one small object under the destination, or raise the one-line reason."""
    target = parse_target(uri)
    name = probe_name(socket.gethostname(), os.getpid())
    put, get, rm = probe_commands(target, name, aws_cli, region)
    body = f"scaletrain write probe {name}\n"
    try:
        _run(put, stdin=body)
        try:
            back = _run(get)
        except DurableError:
            with contextlib.suppress(DurableError):  # the read's reason is the one to report
                _run(rm)
            raise
        _run(rm)
        if back != body:
            raise DurableError(f"read back {len(back)} bytes from {target.url(name)}, not the {len(body)} written")
    except DurableError as e:
        raise DurableError(probe_failure(uri, region, str(e))) from None


def newest_durable(target: Target, aws_cli: str, region: str) -> str | None:
    """The newest checkpoint under ``target`` whose marker describes the object beside it (the one ``restore``
    would take, short of the download's SHA-256 check)."""
    listing = parse_listing(_run(list_command(target, aws_cli, region)))
    for name in complete_candidates(target, listing):
        marker = parse_marker(_run(_aws(aws_cli, region, "s3", "cp", "--only-show-errors",
                                        target.url(name) + MARKER_SUFFIX, "-")))
        if marker_matches(marker, name, listing[target.key(name)]):
            return name
    return None


def restore(out: Path, uri: str, aws_cli: str, region: str) -> str | None:
    """Bring the newest complete checkpoint from S3 into ``out`` when it is newer than every local one: downloaded
    under a temporary name, verified against its marker, then renamed. Returns what it did, for the log."""
    try:
        return _restore(out, parse_target(uri), aws_cli, region)
    except DurableError as e:
        raise DurableError(f"--checkpoint-to {uri}: {e}") from None


def _restore(out: Path, target: Target, aws_cli: str, region: str) -> str | None:
    listing = parse_listing(_run(list_command(target, aws_cli, region)))
    local = newest_local_epoch(out)
    for name in complete_candidates(target, listing):
        if not should_restore(local, name):
            return None
        marker = parse_marker(_run(_aws(aws_cli, region, "s3", "cp", "--only-show-errors",
                                        target.url(name) + MARKER_SUFFIX, "-")))
        if not marker_matches(marker, name, listing[target.key(name)]):
            continue
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".{name}.download"
        try:
            _run(_aws(aws_cli, region, "s3", "cp", "--only-show-errors", target.url(name), str(tmp)))
            if not marker_matches(marker, name, *digest(tmp)):
                continue
            os.replace(tmp, out / name)
        finally:
            tmp.unlink(missing_ok=True)
        return f"restored {name} from {target.url(name)} (verified: {marker['size']} bytes, sha256 " \
               f"{marker['sha256'][:12]}...)"
    return None


class Uploader:
    """Rank 0's background copier: ``submit`` returns at once; one thread uploads, newest first when it fell
    behind (an older checkpoint still queued is skipped: a restore takes the newest complete one). ``close`` waits
    for the last copy (the end of training), and returns the names it could not copy; ``summary`` then says, in one
    line, how many copies failed and which checkpoint is durable all the same."""

    def __init__(self, uri: str, aws_cli: str, region: str, log: Callable[..., None]):
        self.uri, self.target, self.aws_cli, self.region, self.log = uri, parse_target(uri), aws_cli, region, log
        self.failed: list[str] = []
        self.copied: list[str] = []
        self._queue: queue.Queue[Path | None] = queue.Queue()
        self._thread = threading.Thread(target=self._work, name="checkpoint-upload", daemon=True)
        self._thread.start()

    def submit(self, path: Path) -> None:
        self._queue.put(path)

    def _work(self) -> None:
        while True:
            batch = [self._queue.get()]
            while not self._queue.empty():
                batch.append(self._queue.get())
            paths = [p for p in batch if p is not None]
            if paths:
                path = paths[-1]
                try:
                    upload(self.target, path, self.aws_cli, self.region)
                    self.copied.append(path.name)
                    self.log(f"checkpoint {path.name} copied to {self.target.url(path.name)}", flush=True)
                except DurableError as e:
                    self.failed.append(path.name)
                    self.log(f"warning: checkpoint {path.name} not copied to S3: {e}", flush=True)
            if None in batch:
                return

    def close(self) -> list[str]:
        self._queue.put(None)
        self._thread.join()
        return self.failed

    def summary(self) -> str | None:
        """After ``close``: None when every copy made it, else the line for the end of the run. What is durable
        is asked of S3 (a resumed run's earlier epochs count); when that fails, this run's newest copy."""
        if not self.failed:
            return None
        try:
            newest = newest_durable(self.target, self.aws_cli, self.region)
        except DurableError:
            newest = max(self.copied, default=None)
        return upload_summary(self.uri, self.failed, len(self.failed) + len(self.copied), newest)
