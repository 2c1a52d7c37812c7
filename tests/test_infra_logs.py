"""What stays after `launch down` (issue 37 item 6): every log group the stacks' functions (and Image Builder) write is
a resource of the stack, with a retention, deleted with it. The Custom::VpcRestrictDefaultSG provider that cdk.json's
"@aws-cdk/aws-ec2:restrictDefaultSecurityGroup" brings wrote to /aws/lambda/<its name>, with no retention, kept
forever after the stack was gone. What a stack keeps on purpose is the image stack's build-log bucket alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_cdk")

from aws_cdk.assertions import Template  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CDK_JSON: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]
DAYS = 30  # infra.loggroups.FUNCTION_LOG_RETENTION, a month


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    """The cluster stack with every function it can have: the guard, the idle check, CDK's own provider."""
    from infra.app import build

    _, stack = build({**CDK_JSON, "storage": "fsx", "idle_minutes": "60"})
    return Template.from_stack(stack).to_json()["Resources"]


@pytest.fixture(scope="module")
def image() -> dict[str, Any]:
    from ami.app import build

    _, stack = build({})
    return Template.from_stack(stack).to_json()["Resources"]


def of_type(resources: dict[str, Any], kind: str) -> dict[str, Any]:
    return {k: v for k, v in resources.items() if v["Type"] == kind}


def test_every_function_of_the_cluster_stack_logs_to_a_log_group_of_its_own_stack(cluster):
    functions = of_type(cluster, "AWS::Lambda::Function")
    assert len(functions) == 3, list(functions)  # the guard, the idle check, the VPC's default-group provider
    assert any(k.startswith("CustomVpcRestrictDefaultSGCustomResourceProvider") for k in functions)
    assert "CustomVpcRestrictDefaultSGCustomResourceProviderLogGroup" in cluster  # pinned, as the other log groups
    for name, function in functions.items():
        ref = function["Properties"].get("LoggingConfig", {}).get("LogGroup", {}).get("Ref")
        assert ref is not None, f"{name} logs to /aws/lambda/<name>, which no stack deletes"
        group = cluster[ref]
        assert group["Type"] == "AWS::Logs::LogGroup"
        assert group["Properties"]["RetentionInDays"] == DAYS, name
        assert group["DeletionPolicy"] == "Delete" and group["UpdateReplacePolicy"] == "Delete", name


def test_cdks_provider_may_write_to_the_log_group_it_is_given(cluster):
    (handler,) = (v for k, v in of_type(cluster, "AWS::Lambda::Function").items() if k.startswith("CustomVpc"))
    role = cluster[handler["Properties"]["Role"]["Fn::GetAtt"][0]]
    assert "service-role/AWSLambdaBasicExecutionRole" in json.dumps(role["Properties"]["ManagedPolicyArns"])


@pytest.mark.parametrize("stack", ["cluster", "image"])
def test_every_log_group_of_either_stack_expires_and_goes_with_it(stack: str, request: pytest.FixtureRequest):
    groups = of_type(request.getfixturevalue(stack), "AWS::Logs::LogGroup")
    assert groups
    for name, group in groups.items():
        assert group["Properties"].get("RetentionInDays"), f"{name} never expires"
        assert group["DeletionPolicy"] == "Delete", name


def test_image_builder_writes_its_build_and_pipeline_logs_to_the_stacks_log_groups(image):
    groups = of_type(image, "AWS::Logs::LogGroup")
    (build,) = of_type(image, "AWS::ImageBuilder::Image").values()
    (pipeline,) = of_type(image, "AWS::ImageBuilder::ImagePipeline").values()
    image_logs = build["Properties"]["LoggingConfiguration"]["LogGroupName"]["Ref"]
    assert pipeline["Properties"]["LoggingConfiguration"]["ImageLogGroupName"] == {"Ref": image_logs}
    pipeline_logs = pipeline["Properties"]["LoggingConfiguration"]["PipelineLogGroupName"]["Ref"]
    assert {image_logs, pipeline_logs} == set(groups)
    # under /aws/imagebuilder/, where EC2InstanceProfileForImageBuilder lets the build instance write
    assert {g["Properties"]["LogGroupName"] for g in groups.values()} == {
        "/aws/imagebuilder/scaletrain-image/image", "/aws/imagebuilder/scaletrain-image/pipeline"}


@pytest.mark.parametrize(("stack", "kept"), [("cluster", set()), ("image", {"AWS::S3::Bucket"})])
def test_what_a_stack_keeps_when_it_is_deleted_is_what_the_readme_lists(stack: str, kept: set[str],
                                                                        request: pytest.FixtureRequest):
    resources = request.getfixturevalue(stack)
    retained = {v["Type"] for v in resources.values() if v.get("DeletionPolicy") in ("Retain", "RetainExceptOnCreate",
                                                                                     "Snapshot")}
    assert retained == kept
    readme = (ROOT / "README.md").read_text()
    section = readme.split("**What stays after `launch down`.**", 1)[1].split("\n\n", 1)[0]
    for words in ("build-log bucket", "AMI", "snapshot", "$0.05 per GB-month", "$0.023 per GB-month"):
        assert words in section, words
