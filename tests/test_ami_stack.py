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
from ami.stack import ROOT_VOLUME_GIB, TAG_KERNEL_MODULES  # noqa: E402
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
