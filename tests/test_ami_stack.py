"""The image stack against the cluster stack: the image ami/ builds is the one a cluster resolves by default, with
the kernel modules its GPUs need, and a root volume every cluster launch template accepts."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_cdk")

from aws_cdk import App  # noqa: E402
from aws_cdk.assertions import Template  # noqa: E402

from ami import paths, render  # noqa: E402
from ami.app import build, spec_from_context  # noqa: E402
from ami.stack import KEEP_IMAGES, ROOT_VOLUME_GIB, TAG_IMAGE_STACK, TAG_KERNEL_MODULES  # noqa: E402
from infra import catalog  # noqa: E402
from infra.spec import ClusterSpec  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTION = "AWS::ImageBuilder::DistributionConfiguration"
CDK_ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}


def _image(tmp_path_factory: pytest.TempPathFactory, **context: str) -> tuple[Any, dict[str, Any]]:
    _, stack = build(context, outdir=str(tmp_path_factory.mktemp("cdk.out")))
    return stack, Template.from_stack(stack).to_json()


@pytest.fixture(scope="module")
def open_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    return _image(tmp_path_factory)


@pytest.fixture(scope="module")
def proprietary_image(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, dict[str, Any]]:
    return _image(tmp_path_factory, nvidia_kernel_modules="proprietary", region="us-west-2")


def _distribution(template: dict[str, Any]) -> dict[str, Any]:
    (distribution,) = [r for r in template["Resources"].values() if r["Type"] == DISTRIBUTION]
    (entry,) = distribution["Properties"]["Distributions"]
    return entry


def test_every_build_publishes_its_ami_id_where_clusters_resolve_it(open_image) -> None:
    """Without this the default cluster image would be a stock AMI with no trainer venv, Horovod or BeeGFS."""
    stack, template = open_image
    entry = _distribution(template)
    assert entry["SsmParameterConfigurations"] == [
        {"ParameterName": paths.IMAGE_ID_PARAMETER, "DataType": "aws:ec2:image"}
    ]
    # The same distribution serves the deploy's image and every pipeline rebuild.
    resources = template["Resources"]
    (distribution_id,) = [k for k, r in resources.items() if r["Type"] == DISTRIBUTION]
    for kind in ("AWS::ImageBuilder::Image", "AWS::ImageBuilder::ImagePipeline"):
        (resource,) = [r for r in resources.values() if r["Type"] == kind]
        assert resource["Properties"]["DistributionConfigurationArn"] == {"Fn::GetAtt": [distribution_id, "Arn"]}
    assert template["Outputs"]["ImageParameter"]["Value"] == paths.IMAGE_ID_PARAMETER
    assert stack.stack_name == "scaletrain-image"
    assert entry["AmiDistributionConfiguration"]["AmiTags"][TAG_KERNEL_MODULES] == "open"


def test_the_proprietary_build_is_its_own_stack_and_parameter(proprietary_image) -> None:
    stack, template = proprietary_image
    assert stack.stack_name == "scaletrain-image-proprietary"  # building it does not replace the open image
    assert _distribution(template)["SsmParameterConfigurations"] == [
        {"ParameterName": paths.IMAGE_ID_PARAMETER_PROPRIETARY, "DataType": "aws:ec2:image"}
    ]
    assert _distribution(template)["AmiDistributionConfiguration"]["AmiTags"][TAG_KERNEL_MODULES] == "proprietary"


@pytest.mark.parametrize("name", [t.name for t in catalog.gpu_types()])
def test_a_cluster_resolves_the_build_its_gpus_need_and_the_command_builds_it(name: str) -> None:
    """The parameter a cluster resolves is the one that the command its error names publishes to, in its region."""
    context = {"cluster_name": "c", "instance_type": name, "nodes": "1", "region": "eu-west-1"}
    cluster = ClusterSpec.from_context(context)
    words = shlex.split(cluster.image_build_command)
    assert words[:5] == ["npx", "cdk", "deploy", "--app", ".venv/bin/python ami/app.py"]
    context = dict(arg.split("=", 1) for flag, arg in zip(words, words[1:], strict=False) if flag == "-c")
    image = spec_from_context(App(context=context))
    assert image.region == cluster.region
    assert image.image_parameter == cluster.image_parameter
    assert image.nvidia_kernel_modules == cluster.nvidia_kernel_modules


def test_the_image_root_volume_is_what_clusters_get_by_default(open_image) -> None:
    _, template = open_image
    (recipe,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::ImageBuilder::ImageRecipe"]
    (root,) = recipe["Properties"]["BlockDeviceMappings"]
    assert root["Ebs"]["VolumeSize"] == ROOT_VOLUME_GIB == 200


def _run_app(context: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CDK_ENV, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": "/nonexistent-not-written"}
    return subprocess.run([sys.executable, "ami/app.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_proprietary_build_on_a_base_with_its_own_driver_is_refused() -> None:
    """The driver component is left out on a base with a driver: the image would carry the open modules while being
    published where V100 clusters look."""
    assert all(not c.needs_driver_install for c in render.components_for(render.load_versions(), "dlami"))
    result = _run_app({"base": "dlami", "nvidia_kernel_modules": "proprietary"})
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: nvidia_kernel_modules='proprietary': base='dlami' brings its own driver")


# --- Issue 25: the image publishes its id, reads one object, and prunes old images ----------------------------------

IAM_POLICY = "AWS::IAM::Policy"


def _resource(template: dict[str, Any], kind: str) -> dict[str, Any]:
    (resource,) = [r for r in template["Resources"].values() if r["Type"] == kind]
    return resource


def _statements(template: dict[str, Any], role_id: str) -> list[dict[str, Any]]:
    return [s for r in template["Resources"].values() if r["Type"] == IAM_POLICY
            and {"Ref": role_id} in r["Properties"]["Roles"] for s in r["Properties"]["PolicyDocument"]["Statement"]]


def _role_id(template: dict[str, Any], arn: Any) -> str:
    assert set(arn) == {"Fn::GetAtt"} and arn["Fn::GetAtt"][1] == "Arn", arn
    return arn["Fn::GetAtt"][0]


def _parameter_arn(parameter: str, region: str) -> dict[str, Any]:
    return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":ssm:{region}:", {"Ref": "AWS::AccountId"},
                              f":parameter{parameter}"]]}


@pytest.mark.parametrize(("image", "parameter", "region"), [
    ("open_image", paths.IMAGE_ID_PARAMETER, "us-east-1"),
    ("proprietary_image", paths.IMAGE_ID_PARAMETER_PROPRIETARY, "us-west-2"),
])  # fmt: skip
def test_the_image_and_the_pipeline_publish_with_an_execution_role_allowed_to_write_the_parameter(
        request, image, parameter, region) -> None:
    """Image Builder's service-linked role may put parameters under /imagebuilder/ only; the distribution writes
    /scaletrain/image/ami-id. "Prerequisites for SSM output parameters": an execution role with ssm:PutParameter on
    the parameter, and ec2:DescribeImages for the aws:ec2:image data type."""
    _, template = request.getfixturevalue(image)
    image_resource = _resource(template, "AWS::ImageBuilder::Image")["Properties"]
    pipeline = _resource(template, "AWS::ImageBuilder::ImagePipeline")["Properties"]
    assert "ExecutionRole" in image_resource and "ExecutionRole" in pipeline
    assert image_resource["ExecutionRole"] == pipeline["ExecutionRole"]
    role_id = _role_id(template, image_resource["ExecutionRole"])
    role = template["Resources"][role_id]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "imagebuilder.amazonaws.com"}
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    assert json.dumps(role["ManagedPolicyArns"]).endswith(':iam::aws:policy/EC2ImageBuilderExecutionPolicy"]]}]')
    policy_id = next(k for k, r in template["Resources"].items() if r["Type"] == IAM_POLICY
                     and {"Ref": role_id} in r["Properties"]["Roles"])
    # The build (an hour) starts only once the role may write the parameter.
    assert policy_id in _resource(template, "AWS::ImageBuilder::Image")["DependsOn"]
    statements = {s["Action"]: s["Resource"] for s in _statements(template, role_id)}
    assert statements == {"ssm:PutParameter": _parameter_arn(parameter, region), "ec2:DescribeImages": "*"}
    # Nothing else in the stack may put parameters.
    puts = [s for r in template["Resources"].values() if r["Type"] == IAM_POLICY
            for s in r["Properties"]["PolicyDocument"]["Statement"] if "ssm:PutParameter" in json.dumps(s["Action"])]
    assert len(puts) == 1


def test_the_build_instance_reads_only_its_source_object(open_image) -> None:
    """The build runs downloaded code: it may read the one source archive it installs, not the CDK assets bucket."""
    stack, template = open_image
    role_id = next(k for k, r in template["Resources"].items()
                   if r["Type"] == "AWS::IAM::Role" and "ec2.amazonaws.com" in json.dumps(r["Properties"]))
    statements = _statements(template, role_id)
    assets = [s for s in statements if "cdk-" in json.dumps(s["Resource"]) and "-assets-" in json.dumps(s["Resource"])]
    (read,) = assets
    assert read["Action"] == "s3:GetObject"
    source = next(c for c in stack.node.children if c.node.id == "Source")
    resource = json.dumps(read["Resource"])
    assert resource.endswith(f'"/{source.s3_object_key}"]]}}') and "*" not in resource
    assert not [s for s in statements if "s3:List" in json.dumps(s["Action"]) or "s3:GetBucket" in json.dumps(s)]
    # The suppression text says what the grants are.
    role = template["Resources"][role_id]
    nag = json.dumps(role.get("Metadata", {}).get("cdk_nag", {}))
    assert "GetObject*" not in nag and "List*" not in nag


def test_a_lifecycle_policy_keeps_the_newest_three_images_and_deletes_older_amis_and_snapshots(open_image) -> None:
    """Deleting an Image Builder image keeps its AMI, and each AMI keeps a 200 GiB snapshot that is billed."""
    stack, template = open_image
    policy = _resource(template, "AWS::ImageBuilder::LifecyclePolicy")["Properties"]
    assert policy["ResourceType"] == "AMI_IMAGE" and policy["Status"] == "ENABLED"
    assert policy["PolicyDetails"] == [{
        "Action": {"Type": "DELETE", "IncludeResources": {"Amis": True, "Snapshots": True}},
        "Filter": {"Type": "COUNT", "Value": KEEP_IMAGES}}]
    assert KEEP_IMAGES == 3
    # It selects this stack's images by a tag the image and every pipeline build carry.
    assert policy["ResourceSelection"] == {"TagMap": {TAG_IMAGE_STACK: stack.stack_name}}
    assert _resource(template, "AWS::ImageBuilder::Image")["Properties"]["Tags"] == {TAG_IMAGE_STACK: stack.stack_name}
    assert _resource(template, "AWS::ImageBuilder::ImagePipeline")["Properties"]["ImageTags"] == {
        TAG_IMAGE_STACK: stack.stack_name}
    role = template["Resources"][_role_id(template, policy["ExecutionRole"])]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"][0]["Principal"] == {"Service": "imagebuilder.amazonaws.com"}
    assert json.dumps(role["ManagedPolicyArns"]).endswith(
        ':iam::aws:policy/service-role/EC2ImageBuilderLifecycleExecutionPolicy"]]}]')


@pytest.mark.parametrize(("keep", "ok"), [("0", False), ("1", True), ("1000", True), ("1001", False)])
def test_keep_images_is_bounded_by_the_count_filter(keep: str, ok: bool) -> None:
    """The count filter's value is 1 to 1000 (LifecyclePolicyDetailFilter)."""
    if ok:
        spec = spec_from_context(App(context={"keep_images": keep}))
        assert spec.keep_images == int(keep)
        return
    result = _run_app({"keep_images": keep})
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"error: keep_images='{keep}': input should be")
