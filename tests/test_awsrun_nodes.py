"""The node-side steps of `launch train` on AWS (launcher.execute.awsrun), run against real sshd processes.

The cluster is a 2-node local cluster dressed as an AWS one: an AwsInfo whose shared storage is a directory
every local node sees (on one machine they share the filesystem, as AWS nodes share the FSx or BeeGFS mount),
and the node-side access files written by the same code discovery uses (aws.write_node_access_files), from the
nodes' real host keys. S3 is moto's server on loopback, read by the real AWS CLI (v1) on the nodes, which, like an
AWS node, has no AWS configuration: no region but the one the launcher passes.
What is not run here: prepare_storage's BeeGFS/FSx phases (root, kernel modules, packages) and FSx's lazy
import (``lfs hsm_restore``); storage 'none' is.
"""

from __future__ import annotations

import json
import shlex
import socket
import sys
from pathlib import Path

import pytest
from clusterutil import alive, cluster_state, launch, tiny_shards

from launcher.cluster import AwsInfo, Cluster
from launcher.cluster.aws import api as aws
from launcher.errors import LaunchError
from launcher.execute import awsrun, remote, run
from launcher.plans import job as plan

pytestmark = pytest.mark.cluster

BUCKET = "scaletrain-data"
REGION = "eu-west-1"  # the stack's; the nodes' AWS CLI has no default region of its own


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("awsnodes")
    home = root / "home"
    # --loopback: the nodes' AWS CLI must reach moto's S3 server on this machine's 127.0.0.1.
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True)
    local = Cluster.model_validate(cluster_state(home))
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SCALETRAIN_HOME", str(home))  # never the user's ~/.scaletrain
            d = Path(local.ssh_config).parent
            # Where AWS nodes keep their copy (/home/ubuntu/.scaletrain/cluster); here one directory for all.
            info = AwsInfo(stack=local.name, region=REGION, data_bucket=BUCKET,
                           storage={"type": "beegfs", "mount_point": str(root / "beegfs")},
                           node_ssh_config=str(root / "node-home" / ".scaletrain" / "cluster" / "ssh_config"))
            (root / "beegfs" / "scaletrain").mkdir(parents=True)
            c = local.model_copy(update={"backend": "aws", "aws": info})
            # The host keys each node printed on its console at first boot, on AWS.
            keys = {n.name: [" ".join((d / "nodes" / n.name / "ssh_host_ed25519_key.pub").read_text().split()[:2])]
                    for n in c.nodes}
            aws.write_node_access_files(c, keys)
            # What aws.authorize_keys does over SSM: the nodes' own key may log in (one authorized_keys here).
            with open(d / "authorized_keys", "a") as f:
                f.write((d / "node_ed25519.pub").read_text())
            tiny_shards(home, root)
            yield root, home, c
    finally:
        launch(home, "local", "down", check=True)
        assert not [pid for pid in local.processes.values() if alive(pid)], "an sshd outlived `local down`"


@pytest.fixture(scope="module")
def installed(env):
    root, home, c = env
    awsrun.install_node_access(c)
    return c


def test_install_node_access_lets_the_first_node_reach_the_others_as_mpirun_does(env, installed):
    _, _, c = env
    target = Path(c.aws.node_ssh_config).parent
    d = Path(c.ssh_config).parent
    names = ["id_ed25519", "ssh_config", "known_hosts"]
    for node in c.nodes:
        code, out = remote.check(c, node, "stat -c '%a %n' " + " ".join(shlex.quote(f"{target}/{n}") for n in names))
        assert code == 0, out
        assert [line.split(" ", 1)[0] for line in out.splitlines()] == ["600"] * 3
        code, out = remote.check(c, node, f"stat -c %a {shlex.quote(str(target))}")
        assert out.strip() == "700"
    assert (target / "id_ed25519").read_text() == (d / "node_ed25519").read_text()
    assert (target / "known_hosts").read_text() == (d / "node_known_hosts").read_text()
    # node0 reaches node1 with only the installed files: its key, its config, its pinned host keys.
    cmd = f"ssh -F {shlex.quote(c.mpi_ssh_config)} node1 'echo $SCALETRAIN_NODE'"
    code, out = remote.check(c, c.node("node0"), cmd)
    assert (code, out.strip()) == (0, "node1")
    # Pinning is real: with another node's host key under node1's name the same command is refused.
    swapped = (target / "known_hosts").read_text().splitlines()
    (target / "known_hosts").write_text(f"{swapped[1].split(' ', 1)[0]} {swapped[0].split(' ', 1)[1]}\n")
    try:
        code, _ = remote.check(c, c.node("node0"), cmd)
        assert code != 0
    finally:
        awsrun.install_node_access(c)


def test_raw_imagenet_is_converted_on_every_node_once_and_trains(env, installed, capsys):
    root, home, c = env
    raw = root / "raw"  # made by tiny_shards: `launch data sample`, ILSVRC layout
    shards = awsrun.stage_data(c, c.workers, str(raw), shard_size=12)
    out = Path(shards)
    assert out.parent == root / "beegfs" / "scaletrain" / "data" and out.name.startswith("shards-raw-")
    manifest = json.loads((out / "manifest.json").read_text())
    assert {k: v["samples"] for k, v in manifest["splits"].items()} == {"train": 96, "val": 24}
    printed = capsys.readouterr()
    assert "converting" in printed.err and "[node0]" in printed.out and "[node1]" in printed.out
    # Both nodes wrote their share: node i of 2 wrote shards i, i+2, ...
    for i in range(2):
        part = json.loads((out / f"manifest.node-{i}-of-2.json").read_text())
        assert part["shards"] and all(s["name"] in {m["name"] for m in manifest["shards"]} for s in part["shards"])

    # A second run finds the shards and converts nothing.
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert awsrun.stage_data(c, c.workers, str(raw), shard_size=12) == shards
    printed = capsys.readouterr()
    assert "converted from" in printed.err and "[node" not in printed.out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before

    # Interrupted before the merge (no manifest.json) and a shard lost: the same call resumes, keeping the rest.
    (out / "manifest.json").unlink()
    lost = manifest["shards"][0]["name"]
    (out / lost).unlink()
    assert awsrun.stage_data(c, c.workers, str(raw), shard_size=12) == shards
    printed = capsys.readouterr()
    assert "resuming" in printed.out and (out / lost).is_file()
    assert json.loads((out / "manifest.json").read_text())["shards"] == manifest["shards"]

    # launch train's run step uses them, its mpirun reaching node1 through the installed node access files.
    spec = plan.TrainSpec(data=shards, output=str(root / "beegfs" / "scaletrain" / "runs" / "r1"), model="resnet18",
                          image_size=32, epochs=1, batch_per_gpu=8, warmup_epochs=0.5, workers=1)
    result = run.train(c, c.workers, spec, make_data=False)
    assert result.exit_code == 0, "\n".join(result.lines[-30:])
    assert result.train_images == 96 and f"ssh -F {c.mpi_ssh_config}" in capsys.readouterr().out
    assert result.summary and result.summary["ranks"] == 2

    # Before a teardown deletes the cluster's storage, the run's record and newest checkpoint come back here.
    from launcher.cli import trainreport

    trainreport.fetch_record(c, c.workers[0], spec.output, newest_checkpoint=True)
    fetched = home / "runs" / c.name / "r1"
    assert f"to {fetched}" in capsys.readouterr().out
    assert json.loads((fetched / "summary.json").read_text()) == result.summary
    newest = "checkpoint-epoch000.pt"
    assert (fetched / newest).read_bytes() == (Path(spec.output) / newest).read_bytes()
    assert json.loads((fetched / "checkpoints.json").read_text())["checkpoints"][0]["epoch"] == 0


def test_shards_in_place_are_used_as_they_are(env):
    root, _, c = env
    assert awsrun.stage_data(c, c.workers, str(root / "shards")) == str(root / "shards")
    assert not list((root / "beegfs" / "scaletrain" / "data").glob("shards-shards-*"))


def test_without_shared_storage_raw_imagenet_is_refused_in_one_line(env):
    root, _, c = env
    alone = c.model_copy(update={"aws": c.aws.model_copy(update={"storage": {"type": "none"}})})
    awsrun.prepare_storage(alone)  # storage 'none': nothing to set up
    with pytest.raises(LaunchError) as e:
        awsrun.stage_data(alone, alone.workers, str(root / "raw"))
    assert "launch data convert" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(LaunchError, match="no such directory on node0"):
        awsrun.stage_data(c, c.workers, str(root / "nowhere"))


def test_a_failing_node_script_is_one_line_naming_the_node(env):
    root, _, c = env
    with pytest.raises(LaunchError) as e:
        awsrun._on_nodes(c, {"node0": "true", "node1": "echo broken >&2; exit 3"}, "staging the data", sudo=False)
    assert str(e.value) == "staging the data failed on node1 (exit 3: broken)"  # the script's own error line
    empty = root / "not-imagenet"
    empty.mkdir()
    (empty / "notes.txt").write_text("no images here\n")
    with pytest.raises(LaunchError) as e:
        awsrun.stage_data(c, c.workers, str(empty))
    assert "conversion failed on node0 (exit 1), node1 (exit 1)" in str(e.value) and "\n" not in str(e.value)


@pytest.fixture(scope="module")
def s3(env):
    """A moto S3 server on loopback holding the tiny shards under s3://BUCKET/imagenet/v1, and an AWS CLI
    for the nodes, given to the launcher by its path as the image's is, that talks to it (dummy credentials; nothing
    reaches AWS), sees no AWS configuration and no region (as on a node), and logs who ran it with what."""
    import boto3
    from moto.server import ThreadedMotoServer

    root, _, _ = env
    aws_bin = Path(sys.executable).parent / "aws"
    assert aws_bin.is_file(), "the AWS CLI v1 comes with the dev extra (pip install -e '.[dev]')"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client("s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id="testing",
                              aws_secret_access_key="testing")
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        for f in (root / "shards").iterdir():
            if f.is_file():
                client.upload_file(str(f), BUCKET, f"imagenet/v1/{f.name}")
        log = root / "aws-cli.log"
        wrapper = root / "aws-local"
        wrapper.write_text("\n".join([
            "#!/bin/sh",
            f'echo "$SCALETRAIN_NODE $*" >> {shlex.quote(str(log))}',
            f"exec env -u AWS_DEFAULT_REGION -u AWS_REGION AWS_ENDPOINT_URL={endpoint} AWS_ACCESS_KEY_ID=testing "
            f"AWS_SECRET_ACCESS_KEY=testing AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null "
            f'AWS_EC2_METADATA_DISABLED=true {shlex.quote(str(aws_bin))} "$@"', ""]))
        wrapper.chmod(0o755)
        yield str(wrapper), log
    finally:
        server.stop()


def test_shards_in_s3_are_copied_by_every_node_with_the_aws_cli(env, s3):
    root, _, c = env
    aws_cli, log = s3
    dest = awsrun.stage_data(c, c.workers, f"s3://{BUCKET}/imagenet/v1/", aws_cli=aws_cli)
    assert dest == str(root / "beegfs" / "scaletrain" / "data" / BUCKET / "imagenet" / "v1")
    source = {f.name: f.read_bytes() for f in (root / "shards").iterdir() if f.is_file()}
    assert {f.name: f.read_bytes() for f in Path(dest).iterdir()} == source
    # Every call (the manifest read and each node's copy) went to the stack's region, explicitly: the nodes have no
    # AWS configuration, and their S3 gateway endpoint serves the stack's region only.
    calls = [line.split() for line in log.read_text().splitlines()]
    assert calls and all(words[1:4] == ["--region", REGION, "s3"] for words in calls), calls
    # Shared storage: node i copied shards i, i+2, ...; node0 also the manifest.
    copies = [words for words in calls if words[4:6] == ["cp", "--recursive"]]  # not the manifest read
    assert sorted(words[0] for words in copies) == ["node0", "node1"]  # one CLI process per node
    by_node = {words[0]: sorted(words[i + 1] for i, w in enumerate(words) if w == "--include") for words in copies}
    shards = sorted(s["name"] for s in json.loads(source["manifest.json"])["shards"])
    assert by_node["node0"] == sorted(["manifest.json", *shards[0::2]])
    assert by_node["node1"] == sorted(shards[1::2])


def test_an_s3_prefix_without_manifest_is_one_line_naming_the_options(env, s3):
    _, _, c = env
    aws_cli, _ = s3
    with pytest.raises(LaunchError) as e:
        awsrun.stage_data(c, c.workers, f"s3://{BUCKET}/raw-imagenet", aws_cli=aws_cli)
    assert str(e.value).startswith(f"no manifest.json under s3://{BUCKET}/raw-imagenet (read from node0)")
    assert "data_bucket" in str(e.value) and "\n" not in str(e.value)


def _as_node_role(wrapper: str, root: Path, name: str, policy: dict | None) -> str:
    """An AWS CLI for the nodes that signs as an IAM user with only ``policy`` (None: no policy at all), as a node
    role without a grant would; moto's server then checks every request against it."""
    import boto3

    text = Path(wrapper).read_text()
    endpoint = text.split("AWS_ENDPOINT_URL=", 1)[1].split()[0]
    iam = boto3.client("iam", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                       aws_secret_access_key="testing")
    iam.create_user(UserName=name)
    if policy is not None:
        iam.put_user_policy(UserName=name, PolicyName="nodes", PolicyDocument=json.dumps(policy))
    key = iam.create_access_key(UserName=name)["AccessKey"]
    signed = root / f"aws-{name}"
    signed.write_text(text.replace("AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing",
                                   f"AWS_ACCESS_KEY_ID={key['AccessKeyId']} "
                                   f"AWS_SECRET_ACCESS_KEY={key['SecretAccessKey']}"))
    signed.chmod(0o755)
    return str(signed)


def test_a_refused_s3_read_or_copy_says_the_aws_clis_own_error(env, s3, monkeypatch):
    """A node role that may not read the data (issue 25, item 3): the launcher said "no manifest.json under s3://..."
    and hid the CLI's AccessDenied. The real AWS CLI against moto's server with IAM checked."""
    from moto import settings

    root, _, c = env
    aws_cli, _ = s3
    source = f"s3://{BUCKET}/imagenet/v1/"
    nothing = _as_node_role(aws_cli, root, "no-grant", None)
    manifest_only = _as_node_role(aws_cli, root, "manifest-only", {"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": "s3:ListBucket", "Resource": f"arn:aws:s3:::{BUCKET}"},
        {"Effect": "Allow", "Action": "s3:GetObject", "Resource": f"arn:aws:s3:::{BUCKET}/imagenet/v1/manifest.json"}]})
    monkeypatch.setattr(settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # moto's server now checks IAM
    with pytest.raises(LaunchError) as e:
        awsrun.stage_data(c, c.workers, source, aws_cli=nothing)
    line = str(e.value)
    assert line.startswith(f"reading {source}manifest.json on node0 failed: ") and "\n" not in line
    assert "An error occurred (403) when calling the HeadObject operation: Forbidden" in line, line
    assert "no manifest.json" not in line
    with pytest.raises(LaunchError) as e:
        awsrun.stage_data(c, c.workers, source, aws_cli=manifest_only)
    line = str(e.value)
    assert line.startswith("staging the data failed on node0 (exit 1: ") and "\n" not in line, line
    assert "An error occurred (AccessDenied) when calling the GetObject operation" in line, line


def test_a_fresh_node_gets_its_working_directory_on_first_use(env):
    # Discovery records ~/scaletrain as every AWS node's working directory; nothing on a fresh node creates it.
    root, _, c = env
    fresh = c.model_copy(update={"nodes": [n.model_copy(update={"workdir": str(root / "fresh" / n.name / "scaletrain")})
                                           for n in c.nodes]})
    node = fresh.node("node1")
    assert not Path(node.workdir).exists()
    code, out = remote.check(fresh, node, "pwd")
    assert (code, out.strip()) == (0, node.workdir)
