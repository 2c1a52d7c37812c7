"""A checkpoint bucket encrypted with a customer-managed KMS key (issue 25, item 11): S3 asks the key for a data key
on every PutObject and to decrypt on every GetObject, as the caller; the node role had no kms: action, so every
checkpoint copy to such a bucket was AccessDenied however the bucket grant read. `-c checkpoint_kms_key=ARN` grants
exactly kms:GenerateDataKey and kms:Decrypt on that key, through S3 only."""

from __future__ import annotations

import json

import pytest
from cfnlint.api import ManualArgs, lint
from test_infra import Synth, _actions, _nag_findings, _role_statements

from infra.spec import ClusterSpec, SpecError

KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"


@pytest.fixture(scope="module")
def with_key() -> Synth:
    return Synth(nodes="2", checkpoint_bucket="my-ckpts", checkpoint_kms_key=KEY)


@pytest.fixture(scope="module")
def without_key() -> Synth:
    return Synth(nodes="2", checkpoint_bucket="my-ckpts")


def _kms(synth: Synth) -> list[dict]:
    return [s for s in _role_statements(synth) if any(a.startswith("kms:") for a in _actions(s))]


def test_the_node_role_may_use_the_checkpoint_key_through_s3_only(with_key: Synth) -> None:
    [grant] = _kms(with_key)
    assert _actions(grant) == {"kms:GenerateDataKey", "kms:Decrypt"} and grant["Effect"] == "Allow"
    assert grant["Resource"] == KEY
    assert grant["Condition"] == {"StringEquals": {"kms:ViaService": "s3.us-east-1.amazonaws.com"}}
    matches = lint(json.dumps(with_key.json), config=ManualArgs(regions=[with_key.stack.region]))
    assert [m for m in matches if m.rule.id.startswith("E")] == []
    assert _nag_findings(with_key.stack) == []


def test_without_the_key_the_node_role_uses_no_kms_key(without_key: Synth) -> None:
    assert _kms(without_key) == []


@pytest.mark.parametrize(("context", "fragment"), [
    ({"checkpoint_kms_key": KEY}, "allowed only with checkpoint_bucket"),
    ({"checkpoint_bucket": "my-ckpts", "checkpoint_kms_key": "arn:aws:kms:us-east-1:123456789012:alias/ckpts"},
     "allowed: a KMS key ARN"),
    ({"checkpoint_bucket": "my-ckpts", "checkpoint_kms_key": "1234abcd-12ab-34cd-56ef-1234567890ab"},
     "allowed: a KMS key ARN"),
])
def test_a_key_that_would_grant_nothing_is_one_line(context: dict, fragment: str) -> None:
    with pytest.raises(SpecError) as e:
        ClusterSpec.from_context({"cluster_name": "c", "instance_type": "p4d.24xlarge", "nodes": "2", **context})
    assert fragment in str(e.value) and "\n" not in str(e.value)
    multi_region = "arn:aws:kms:eu-west-1:123456789012:key/mrk-1234abcd12ab34cd56ef1234567890ab"
    assert ClusterSpec.from_context({"cluster_name": "c", "instance_type": "p4d.24xlarge", "nodes": "2",
                                     "checkpoint_bucket": "b-ckpts", "checkpoint_kms_key": multi_region})
