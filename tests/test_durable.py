"""Durable checkpoints (training/durable.py): the pure decisions, then the trainer against moto's S3 server on
loopback, driven through the real AWS CLI (v1, from the dev extra) as the nodes drive the image's, with no AWS
configuration and the region given on every call."""

from __future__ import annotations

import json
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from clusterutil import ROOT

from training import durable
from training.train import parse_args

REGION = "eu-west-1"
BUCKET = "ckpt-bucket"


# ---- pure ----

def test_target_keys_and_bad_uris():
    t = durable.parse_target("s3://my-bucket/runs/r1/")
    assert (t.bucket, t.prefix) == ("my-bucket", "runs/r1")
    assert t.key("checkpoint-epoch001.pt") == "runs/r1/checkpoint-epoch001.pt"
    assert durable.parse_target("s3://my-bucket").key("x") == "x"
    for bad in ("my-bucket/runs", "s3://", "s3://My_Bucket/x", "/fsx/runs"):
        with pytest.raises(durable.DurableError, match="must be s3://BUCKET/PREFIX"):
            durable.parse_target(bad)


def test_options_need_a_region_and_an_absolute_cli(capsys):
    assert durable.check_options("", "", "") is None
    assert "--aws-region" in durable.check_options("s3://b-1/p", "", "/usr/local/bin/aws")
    assert "--aws-cli" in durable.check_options("s3://b-1/p", REGION, "aws")
    with pytest.raises(SystemExit):
        parse_args(["--synthetic", "--output", "o", "--checkpoint-to", "s3://b-1/p", "--aws-cli", "/x/aws"])
    assert capsys.readouterr().err.strip().startswith("error: --checkpoint-to needs --aws-region")


def test_only_checkpoints_with_a_marker_are_candidates_newest_first():
    t = durable.parse_target("s3://b-1/run")
    listing = {"run/checkpoint-epoch000.pt": 10, "run/checkpoint-epoch000.pt.complete": 1,
               "run/checkpoint-epoch002.pt": 30, "run/checkpoint-epoch002.pt.complete": 1,
               "run/checkpoint-epoch003.pt": 5,                                     # no marker: half-copied
               "run/other/checkpoint-epoch009.pt": 9, "run/other/checkpoint-epoch009.pt.complete": 1,
               "run/checkpoint-epoch007.pt.complete": 1}                            # marker without object
    assert durable.complete_candidates(t, listing) == ["checkpoint-epoch002.pt", "checkpoint-epoch000.pt"]


def test_marker_round_trip_and_mismatches():
    text = durable.marker_text("checkpoint-epoch002.pt", 30, "ab" * 32)
    m = durable.parse_marker(text)
    assert durable.marker_matches(m, "checkpoint-epoch002.pt", 30, "ab" * 32)
    assert not durable.marker_matches(m, "checkpoint-epoch002.pt", 29)               # object replaced or torn
    assert not durable.marker_matches(m, "checkpoint-epoch002.pt", 30, "cd" * 32)    # same size, other bytes
    assert not durable.marker_matches(m, "checkpoint-epoch001.pt", 30)
    assert durable.parse_marker("{\"size\": 3") is None and durable.parse_marker("[]") is None


def test_restore_only_what_the_run_directory_lacks():
    assert durable.should_restore(None, "checkpoint-epoch000.pt")
    assert durable.should_restore(1, "checkpoint-epoch002.pt")
    assert not durable.should_restore(2, "checkpoint-epoch002.pt")


def test_upload_removes_the_old_marker_first_and_writes_the_new_one_last():
    t = durable.parse_target("s3://b-1/run")
    rm, put, mark = durable.upload_commands(t, Path("/fsx/r/checkpoint-epoch004.pt"), "/usr/local/bin/aws", REGION)
    assert all(c[:3] == ["/usr/local/bin/aws", "--region", REGION] for c in (rm, put, mark))
    assert rm[3:5] == ["s3", "rm"] and rm[-1] == "s3://b-1/run/checkpoint-epoch004.pt.complete"
    assert put[-2:] == ["/fsx/r/checkpoint-epoch004.pt", "s3://b-1/run/checkpoint-epoch004.pt"]
    assert mark[-2:] == ["-", "s3://b-1/run/checkpoint-epoch004.pt.complete"]


def test_the_write_probe_puts_reads_back_and_deletes_one_key_under_the_prefix_as_the_uploads_do():
    t = durable.parse_target("s3://b-1/runs/r1")
    name = durable.probe_name("ip-10-0-1-5.ec2.internal", 4242)
    assert name == ".scaletrain-probe-ip-10-0-1-5.ec2.internal-4242"
    assert durable.probe_name("a b/c", 7) == ".scaletrain-probe-a-b-c-7"   # one key segment, whatever the host
    url = "s3://b-1/runs/r1/.scaletrain-probe-ip-10-0-1-5.ec2.internal-4242"
    aws = ["/usr/local/bin/aws", "--region", REGION]
    put, get, rm = durable.probe_commands(t, name, "/usr/local/bin/aws", REGION)
    assert put == [*aws, "s3", "cp", "--only-show-errors", "-", url]     # from stdin, as the marker goes up
    assert get == [*aws, "s3", "cp", "--only-show-errors", url, "-"]     # to stdout, as a restore reads a marker
    assert rm == [*aws, "s3", "rm", "--only-show-errors", url]           # as an upload removes the old marker
    up_rm, _, up_mark = durable.upload_commands(t, Path("/r/checkpoint-epoch000.pt"), "/usr/local/bin/aws", REGION)
    assert (put[:-1], rm[:-1]) == (up_mark[:-1], up_rm[:-1])
    # A probe left behind (the process killed between put and rm) is never taken for a checkpoint.
    assert durable.complete_candidates(t, {f"runs/r1/{name}": 1, f"runs/r1/{name}.complete": 1}) == []


def test_a_failed_probe_is_one_line_naming_the_destination_the_reason_and_the_fix():
    line = durable.probe_failure("s3://b-1/runs/r1", REGION, "s3 cp failed: upload failed: - to s3://b-1/runs/r1/"
                                 ".scaletrain-probe-h-1 An error occurred (AccessDenied) when calling the PutObject "
                                 "operation: Access Denied")
    assert "\n" not in line
    assert line.startswith("--checkpoint-to s3://b-1/runs/r1 (region eu-west-1): ")
    assert "(AccessDenied)" in line
    assert line.endswith("the node role may write only under the stack's -c checkpoint_bucket=/checkpoint_prefix=; "
                         "deploy with them or choose a destination under them (a bucket in eu-west-1)")


def test_the_end_of_run_line_counts_failed_uploads_and_names_the_newest_durable_checkpoint():
    assert durable.upload_summary("s3://b-1/r", ["checkpoint-epoch003.pt"], 4, "checkpoint-epoch002.pt") == (
        "warning: 1 of 4 checkpoint uploads to s3://b-1/r failed (checkpoint-epoch003.pt); the newest checkpoint "
        "durable in S3 is s3://b-1/r/checkpoint-epoch002.pt")
    assert durable.upload_summary("s3://b-1/r", ["checkpoint-epoch000.pt"], 1, None).endswith(
        "the newest checkpoint durable in S3 is none")
    assert durable.upload_summary("s3://b-1/r", [], 4, "checkpoint-epoch003.pt") is None


# ---- the launcher: `launch train --checkpoint-to` reaches the trainer with the region and the CLI ----

def test_the_launchers_trainer_line_carries_the_store_and_the_trainer_parses_it():
    from infra.catalog import get
    from launcher.cluster import AwsInfo
    from launcher.plans import job, offline

    c = offline.hypothetical_cluster(get("p4d.24xlarge"), 2).model_copy(
        update={"aws": AwsInfo(stack="st", region=REGION, node_ssh_config="/x")})
    region, aws_cli = job.checkpoint_store(c, None)
    assert (region, aws_cli) == (REGION, "/usr/local/bin/aws")  # the stack's region, the image's CLI
    spec = job.TrainSpec(data="/fsx/d", output="/fsx/r", checkpoint_to=f"s3://{BUCKET}/r1", aws_region=region,
                         aws_cli=aws_cli, resume=True)
    argv = job.trainer_argv(c.python, spec)
    cfg = parse_args(argv[argv.index("training.train") + 1:])
    assert (cfg.checkpoint_to, cfg.aws_region, cfg.aws_cli, cfg.resume) == (f"s3://{BUCKET}/r1", REGION,
                                                                             "/usr/local/bin/aws", True)
    assert "--checkpoint-to" not in job.trainer_argv(c.python, spec.model_copy(update={"checkpoint_to": None}))


def test_launch_train_refuses_a_bad_checkpoint_uri_in_one_line(tmp_path):
    env = {**os.environ, "SCALETRAIN_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "launcher", "train", "--checkpoint-to", "my-bucket/ckpt"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.strip() == "error: --checkpoint-to must be s3://BUCKET/PREFIX (a bucket name: 3-63 lowercase " \
        "letters, digits, '.' or '-'), got 'my-bucket/ckpt' (see `launch train --help`)", proc.stderr
    assert proc.returncode == 2  # a usage error, as click's own


# ---- against moto's S3 server, with the real AWS CLI ----

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """moto's S3 on loopback with one bucket, a boto3 client to inspect it, and an AWS CLI wrapper that points the
    real CLI at it with dummy credentials, no AWS configuration and no default region (as on a node), logging each
    call's arguments."""
    import boto3
    from moto.server import ThreadedMotoServer

    aws_bin = Path(sys.executable).parent / "aws"
    assert aws_bin.is_file(), "the AWS CLI v1 comes with the dev extra (pip install -e '.[dev]')"
    root = tmp_path_factory.mktemp("s3")
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        log = root / "aws-cli.log"
        wrapper = root / "aws-local"
        wrapper.write_text("\n".join([
            "#!/bin/sh",
            f'echo "$*" >> {shlex.quote(str(log))}',
            f"exec env -u AWS_DEFAULT_REGION -u AWS_REGION AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID=testing "
            f"AWS_SECRET_ACCESS_KEY=testing AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null "
            f'AWS_EC2_METADATA_DISABLED=true {shlex.quote(str(aws_bin))} "$@"', ""]))
        wrapper.chmod(0o755)
        yield client, str(wrapper), log
    finally:
        server.stop()


TINY = ["--synthetic", "--engine", "ddp", "--model", "resnet18", "--image-size", "32", "--batch-per-gpu", "4",
        "--steps-per-epoch", "2", "--num-classes", "4", "--workers", "0", "--threads", "1", "--no-tensorboard"]


def trainer(run: Path, *args: str) -> subprocess.CompletedProcess:
    """One rank, DDP over gloo, as tests/test_gpu.py drives it."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    proc = subprocess.run([sys.executable, "-m", "training.train", "--output", str(run), *TINY, *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def keys(client, prefix: str) -> dict[str, bytes]:
    found = client.list_objects_v2(Bucket=BUCKET, Prefix=prefix).get("Contents", [])
    return {o["Key"]: client.get_object(Bucket=BUCKET, Key=o["Key"])["Body"].read() for o in found}


def test_checkpoints_are_copied_with_markers_and_a_lost_run_directory_resumes_from_s3(s3, tmp_path):
    client, aws_cli, log = s3
    run = tmp_path / "run"
    durable_args = ["--checkpoint-to", f"s3://{BUCKET}/runs/r1", "--aws-region", REGION, "--aws-cli", aws_cli]
    first = trainer(run, "--epochs", "2", *durable_args)
    assert "checkpoint checkpoint-epoch001.pt copied to s3://" in first.stdout, first.stdout

    # Each checkpoint is in S3 byte for byte, with a marker naming its size and SHA-256.
    stored = keys(client, "runs/r1/")
    local = {p.name: p.read_bytes() for p in run.glob("checkpoint-epoch*.pt")}
    newest = "checkpoint-epoch001.pt"
    assert stored[f"runs/r1/{newest}"] == local[newest]
    size, sha = durable.digest(run / newest)
    assert json.loads(stored[f"runs/r1/{newest}.complete"]) == {"checkpoint": newest, "size": size, "sha256": sha}
    # Every CLI call named the region: the nodes have no AWS configuration.
    calls = [line.split() for line in log.read_text().splitlines()]
    assert calls and all(c[:2] == ["--region", REGION] for c in calls), calls

    # A newer checkpoint whose copy never finished (no marker), and one whose marker describes other bytes.
    client.put_object(Bucket=BUCKET, Key="runs/r1/checkpoint-epoch003.pt", Body=local[newest][:1000])
    client.put_object(Bucket=BUCKET, Key="runs/r1/checkpoint-epoch002.pt", Body=b"x" * size)
    client.put_object(Bucket=BUCKET, Key="runs/r1/checkpoint-epoch002.pt.complete",
                      Body=durable.marker_text("checkpoint-epoch002.pt", size, sha).encode())

    # Shared storage lost the checkpoints: --resume restores the newest complete one and continues from it.
    for p in run.glob("checkpoint-epoch*.pt"):
        p.unlink()
    resumed = trainer(run, "--epochs", "3", "--resume", *durable_args)
    assert f"--resume: restored {newest} from s3://{BUCKET}/runs/r1/{newest}" in resumed.stdout, resumed.stdout
    assert "resuming from checkpoint-epoch001.pt: epoch 2" in resumed.stdout, resumed.stdout
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(("checkpoint", ".checkpoint"))) == \
        ["checkpoint-epoch001.pt", "checkpoint-epoch002.pt"]   # no temporary download left behind
    # The resumed run's own epoch 2 replaced the stray object and re-marked it.
    stored = keys(client, "runs/r1/")
    assert stored["runs/r1/checkpoint-epoch002.pt"] == (run / "checkpoint-epoch002.pt").read_bytes()
    size2, sha2 = durable.digest(run / "checkpoint-epoch002.pt")
    assert json.loads(stored["runs/r1/checkpoint-epoch002.pt.complete"])["sha256"] == sha2


def test_resume_with_an_unreachable_bucket_is_one_line(s3, tmp_path):
    _, aws_cli, _ = s3
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0",
           "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    proc = subprocess.run([sys.executable, "-m", "training.train", "--output", str(tmp_path / "r"), *TINY,
                           "--epochs", "1", "--resume", "--checkpoint-to", "s3://no-such-bucket/x",
                           "--aws-region", REGION, "--aws-cli", aws_cli],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no-such-bucket" in errors[0] and "Traceback" not in proc.stderr, proc.stderr


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank), "WORLD_SIZE": str(world),
            "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}


def two_ranks(run: Path, *args: str) -> tuple[list[subprocess.Popen], list[tuple[str, str]], str]:
    """The trainer as two ranks on this machine (gloo over loopback): the processes, their (stdout, stderr), and a
    report of both for assertion messages."""
    port = _free_port()
    argv = [sys.executable, "-m", "training.train", "--output", str(run), *TINY, *args]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=rank_env(r, 2, port)) for r in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    report = "\n".join(f"rank {r} rc {p.returncode}\n{o[-2000:]}\n{e[-2000:]}" for r, (p, (o, e)) in
                       enumerate(zip(procs, outs, strict=True)))
    return procs, outs, report


def test_a_destination_the_nodes_cannot_write_stops_every_rank_before_the_first_step(s3, tmp_path):
    """A bucket that does not exist (as a wrong bucket, a wrong region or a prefix outside the role's grant would
    be refused): rank 0's probe fails, and both ranks stop before training, with one line and no checkpoint."""
    _, aws_cli, _ = s3
    run, dest = tmp_path / "run", "s3://no-such-bucket/runs/r1"
    procs, outs, report = two_ranks(run, "--epochs", "2", "--checkpoint-to", dest, "--aws-region", REGION,
                                    "--aws-cli", aws_cli)
    assert all(p.returncode != 0 for p in procs), report
    errors = [line for _, err in outs for line in err.splitlines() if line.strip()]
    assert len(errors) == 1, report
    line = errors[0]
    assert line.startswith(f"error: --checkpoint-to {dest} (region {REGION}): "), report
    assert "NoSuchBucket" in line and "checkpoint_bucket=/checkpoint_prefix=" in line, report
    assert not any(" step " in out for out, _ in outs), report          # no rank trained a step
    assert not list(run.glob("*checkpoint-epoch*")), report


def probe_calls(log: Path, prefix: str) -> list[list[str]]:
    return [line.split() for line in log.read_text().splitlines() if f"/{prefix}/.scaletrain-probe-" in line]


def test_an_allowed_destination_is_probed_before_training_and_keeps_no_probe_object(s3, tmp_path):
    client, aws_cli, log = s3
    run = trainer(tmp_path / "run", "--epochs", "1", "--checkpoint-to", f"s3://{BUCKET}/runs/probed",
                  "--aws-region", REGION, "--aws-cli", aws_cli)
    calls = probe_calls(log, "runs/probed")
    assert [c[2:4] for c in calls] == [["s3", "cp"], ["s3", "cp"], ["s3", "rm"]], calls   # put, read back, delete
    assert all(c[:2] == ["--region", REGION] for c in calls), calls
    assert calls[0][-2] == "-" and calls[1][-1] == "-", calls
    lines = log.read_text().splitlines()
    assert lines.index(" ".join(calls[-1])) < next(i for i, line in enumerate(lines)
                                                   if "runs/probed/checkpoint-epoch000.pt" in line)
    assert sorted(keys(client, "runs/probed/")) == ["runs/probed/checkpoint-epoch000.pt",
                                                    "runs/probed/checkpoint-epoch000.pt.complete"], run.stdout


def refusing_cli(path: Path, aws_cli: str, call: str, refusal: str) -> Path:
    """The CLI wrapper ``aws_cli``, except that a call whose arguments contain ``call`` is refused as S3 refuses one
    (an IAM policy without the action): ``refusal`` on stderr and a non-zero exit, as the CLI ends on an error."""
    path.write_text("\n".join([
        "#!/bin/sh",
        f'case "$*" in *{shlex.quote(call)}*)',
        f"  echo {shlex.quote(refusal)} >&2; exit 1;;",
        "esac",
        f'exec {shlex.quote(aws_cli)} "$@"', ""]))
    path.chmod(0o755)
    return path


def test_an_upload_that_fails_after_the_probe_is_summed_up_at_the_end(s3, tmp_path):
    """The probe passed, then the copy of epoch 1 was refused: the run keeps its warning and ends with one line
    counting the failures and naming the newest checkpoint that is durable in S3."""
    _, aws_cli, _ = s3
    flaky = refusing_cli(tmp_path / "aws-flaky", aws_cli, "checkpoint-epoch001.pt s3://",
                         "upload failed: checkpoint-epoch001.pt An error occurred (AccessDenied) when calling the "
                         "PutObject operation: Access Denied")
    dest = f"s3://{BUCKET}/runs/flaky"
    run = trainer(tmp_path / "run", "--epochs", "2", "--checkpoint-to", dest, "--aws-region", REGION,
                  "--aws-cli", str(flaky))
    assert "warning: checkpoint checkpoint-epoch001.pt not copied to S3: " in run.stdout, run.stdout
    assert f"warning: 1 of 2 checkpoint uploads to {dest} failed (checkpoint-epoch001.pt); the newest checkpoint " \
        f"durable in S3 is {dest}/checkpoint-epoch000.pt" in run.stdout.splitlines(), run.stdout


def test_a_resume_whose_listing_is_refused_stops_every_rank_before_the_first_step(s3, tmp_path):
    """The probe passes (the bucket exists and the role may put, get and delete), but the role lacks s3:ListBucket,
    so rank 0's restore cannot list the prefix: AccessDenied on ListObjectsV2. Both ranks stop before training, with
    one line naming the listing that failed, instead of starting from scratch over a run S3 may still hold."""
    client, aws_cli, log = s3
    nolist = refusing_cli(tmp_path / "aws-nolist", aws_cli, "s3api list-objects-v2",
                          "An error occurred (AccessDenied) when calling the ListObjectsV2 operation: Access Denied")
    run, dest = tmp_path / "run", f"s3://{BUCKET}/runs/nolist"
    procs, outs, report = two_ranks(run, "--epochs", "2", "--resume", "--checkpoint-to", dest, "--aws-region",
                                    REGION, "--aws-cli", str(nolist))
    assert all(p.returncode != 0 for p in procs), report
    # The probe ran to the end (put, read back, delete): the failure is the restore's, not the probe's.
    assert [c[2:4] for c in probe_calls(log, "runs/nolist")] == [["s3", "cp"], ["s3", "cp"], ["s3", "rm"]], report
    # Rank 0's verdict, said once for both ranks (as every verdict all ranks reach), and nothing else on stderr.
    errors = [line for _, err in outs for line in err.splitlines() if line.strip()]
    assert errors == [f"error: --checkpoint-to {dest}: s3api list-objects-v2 failed: An error occurred "
                      "(AccessDenied) when calling the ListObjectsV2 operation: Access Denied"], report
    assert not any("Traceback" in err for _, err in outs), report
    assert not any(" step " in out for out, _ in outs), report          # no rank trained a step
    assert not (run / "metrics.jsonl").exists(), report
    assert not list(run.glob("*checkpoint-epoch*")), report
    assert keys(client, "runs/nolist/") == {}, report                  # nothing uploaded, no probe left behind
