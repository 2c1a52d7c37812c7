"""`launch train --data s3://...` on a stack whose nodes may not read that bucket (issue 25, item 3): the README's
example staged s3://my-bucket/shards on a stack deployed without -c data_bucket, so the node role could read no
bucket; the launcher brought the cluster to ready, then said "no manifest.json under s3://..." and hid the CLI's
AccessDenied. Now: refused in one line before anything starts, naming the bucket the stack allows; and when a copy on
a node fails, the AWS CLI's own line is shown."""

from __future__ import annotations

import pytest
from test_aws_moto import (
    deploy,
    env,  # noqa: F401  (the moto fixture)
    stack_exists,
)

from launcher import cli
from launcher.cluster.aws import api as aws
from launcher.errors import LaunchError
from launcher.plans import staging

# What the AWS CLI (v1 and v2) prints when `aws s3 cp s3://BUCKET/KEY -` is refused or finds nothing: HeadObject
# first, which has no body, so the status code and its reason phrase.
FORBIDDEN = "fatal error: An error occurred (403) when calling the HeadObject operation: Forbidden"
NOT_FOUND = "fatal error: An error occurred (404) when calling the HeadObject operation: Not Found"


def test_an_s3_source_outside_the_stacks_data_bucket_is_refused_naming_the_bucket_allowed():
    with pytest.raises(LaunchError) as e:
        staging.check_source("s3://my-bucket/shards", None, "stack 'c1'")
    assert str(e.value) == ("--data s3://my-bucket/shards: stack 'c1' was deployed without -c data_bucket, so its "
                            "nodes may read no S3 bucket; deploy it with -c data_bucket=my-bucket (`npx cdk deploy "
                            "-c data_bucket=my-bucket ...`), or give shards on the nodes' storage")
    with pytest.raises(LaunchError, match=r"may only read s3://imagenet-shards \(its -c data_bucket=imagenet-shards"
                                          r"\); put the shards there, or deploy with -c data_bucket=my-bucket$"):
        staging.check_source("s3://my-bucket/shards", "imagenet-shards", "stack 'c1'")
    # The bucket it allows, and anything not in S3, pass.
    staging.check_source("s3://imagenet-shards/v1", "imagenet-shards")
    staging.check_source("/fsx/shards", None)
    with pytest.raises(LaunchError, match="expected s3://BUCKET/PREFIX"):
        staging.check_source("s3:///x", "b")


def test_a_refused_manifest_read_shows_the_aws_clis_line_not_no_manifest():
    refused = staging.s3_read_failure("s3://imagenet-shards/v1/", "node0", staging.cli_error(FORBIDDEN + "\n"))
    assert refused.startswith("reading s3://imagenet-shards/v1/manifest.json on node0 failed: " + FORBIDDEN)
    assert "no manifest.json" not in refused and "\n" not in refused
    missing = staging.s3_read_failure("s3://imagenet-shards/v1", "node0", NOT_FOUND)
    assert missing.startswith("no manifest.json under s3://imagenet-shards/v1 (read from node0)")
    assert missing.endswith(f"(the AWS CLI: {NOT_FOUND})")
    assert staging.cli_error("", "") == "" and staging.cli_error("warning: x\nlast\n") == "last"


def test_train_refuses_a_bucket_the_nodes_may_not_read_before_anything_starts(env, monkeypatch, capsys):  # noqa: F811
    """The README's example as a new user runs it: a stack deployed without -c data_bucket, --teardown. Nothing is
    waited for, no key installed over SSM, and the stack is not deleted for a typo in --data."""
    deploy(workers=2)  # DataBucket "none"
    touched = []
    monkeypatch.setattr(aws, "ssm_online", lambda sess, ids: touched.append(ids) or set())
    monkeypatch.setattr(aws.ConsoleReader, "__call__", lambda self, iid: touched.append(iid) or [])
    rc = cli.main(["train", "--cluster", "c1", "--nodes", "2", "--data", "s3://my-bucket/shards", "--teardown",
                   "--ready-timeout", "0"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1, err
    assert err[0].startswith("error: --data s3://my-bucket/shards: stack 'c1' was deployed without -c data_bucket")
    assert "-c data_bucket=my-bucket" in err[0]
    assert touched == [] and stack_exists()


def test_the_readmes_aws_example_deploys_the_bucket_it_then_stages_from():
    import re
    import shlex
    from pathlib import Path

    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = readme.split("## On AWS", 1)[1].split("```bash", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    up = next(line for line in block.splitlines() if line.startswith("launch up "))
    train = next(line for line in block.splitlines() if line.startswith("launch train ") and "--data" in line)
    context = dict(w.split("=", 1) for w in shlex.split(up.split("#")[0]) if "=" in w)
    data = re.search(r"--data (\S+)", train).group(1)
    staging.check_source(data, context.get("data_bucket"), "the README's stack")
