"""--checkpoint-to a bucket encrypted with a customer-managed KMS key, on a stack deployed without
-c checkpoint_kms_key (issue 25, item 11): the probe's one line says why (the node role may not use the key) and the
context key that fixes it, instead of sending the user to the bucket and prefix grant they already have."""

from __future__ import annotations

from training import durable

URI = "s3://my-ckpts/scaletrain-checkpoints/run1"
KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
ROLE = "arn:aws:sts::123456789012:assumed-role/c1-NodeIdentityRole-AbC/i-0123456789abcdef0"
# The AWS CLI's last line for `aws s3 cp - s3://...` refused by IAM on the key (S3 calls KMS as the caller).
PUT_DENIED = (f"upload failed: - to {URI}/.probe-node0-1 An error occurred (AccessDenied) when calling the PutObject "
              f"operation: User: {ROLE} is not authorized to perform: kms:GenerateDataKey on resource: {KEY} because "
              f"no identity-based policy allows the kms:GenerateDataKey action")
GET_DENIED = (f"An error occurred (AccessDenied) when calling the GetObject operation: User: {ROLE} is not authorized "
              f"to perform: kms:Decrypt on resource: {KEY} because no identity-based policy allows the kms:Decrypt "
              f"action")
BUCKET_DENIED = ("upload failed: - to s3://other/x An error occurred (AccessDenied) when calling the PutObject "
                 "operation: Access Denied")


def test_a_key_the_node_role_may_not_use_is_named_with_the_context_key_that_grants_it():
    for reason, action in ((PUT_DENIED, "GenerateDataKey"), (GET_DENIED, "Decrypt")):
        line = durable.probe_failure(URI, "us-east-1", f"cp - failed: {reason}")
        assert "\n" not in line and reason in line
        assert line.endswith(f"the bucket encrypts with a customer-managed KMS key and the node role may not use it "
                             f"(kms:{action}): deploy with -c checkpoint_kms_key={KEY}")
        assert "checkpoint_prefix" not in line


def test_a_bucket_denial_still_points_at_the_bucket_and_prefix_grant():
    line = durable.probe_failure(URI, "us-east-1", f"cp - failed: {BUCKET_DENIED}")
    assert "checkpoint_kms_key" not in line and "-c checkpoint_bucket=/checkpoint_prefix=" in line
