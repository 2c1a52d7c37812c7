"""The training image: components rendered from ami/versions.json, shellcheck, and the Image Builder stack."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from imagesandbox import sandbox

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ami/ is a CDK app beside the package, not part of the installed distribution
    sys.path.insert(0, str(ROOT))

from ami import paths, render  # noqa: E402
from launcher.plans import efa  # noqa: E402

pytest.importorskip("aws_cdk")

from aws_cdk.assertions import Annotations, Match, Template  # noqa: E402
from cfnlint.api import ManualArgs, lint  # noqa: E402

from infra import catalog  # noqa: E402

SCRIPTS = sorted((ROOT / "ami" / "components").glob("*.sh"))
VERSIONS = render.load_versions()
CDK_ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}


def rendered(component: render.Component, **kwargs) -> tuple[str, dict]:
    text = render.render_component(VERSIONS, component, source_url="s3://bucket/source.zip", **kwargs)
    return text, yaml.safe_load(text)


# --- Components from the versions file ------------------------------------------------------------------------------


@pytest.mark.parametrize("component", render.COMPONENTS, ids=lambda c: c.key)
def test_component_document_runs_its_script_with_the_pinned_versions(component: render.Component) -> None:
    text, doc = rendered(component)
    assert len(text) <= render.COMPONENT_DATA_LIMIT
    assert doc["schemaVersion"] == 1.0 and doc["name"] == component.name
    assert [p["name"] for p in doc["phases"]] == list(component.phases)
    first = doc["phases"][0]["steps"]
    written = next(s for s in first if s["action"] == "CreateFile")["inputs"][0]
    assert written["content"] == (ROOT / "ami" / "components" / component.script).read_text()
    env = render.component_env(VERSIONS, component)
    for phase in doc["phases"]:
        command = phase["steps"][-1]["inputs"]["commands"][0]
        assert phase["steps"][-1]["action"] == "ExecuteBash"
        for key, value in env.items():
            assert f"export {key}=" in command
            if "\n" not in value:
                assert value in command
        assert command.rstrip().endswith(f"/opt/scaletrain/ami/{component.script}" +
                                         (f" {phase['name']}" if phase["name"] != "test" else ""))


def test_each_script_gets_exactly_the_versions_it_reads() -> None:
    nccl = render.component_env(VERSIONS, next(c for c in render.COMPONENTS if c.key == "nccl"))
    assert nccl == {"NCCL_VERSION": VERSIONS.nccl, "NCCL_CUDA_TAG": VERSIONS.nccl_cuda_tag,
                    "NCCL_TESTS_VERSION": VERSIONS.nccl_tests, "SCALETRAIN_NCCL_TESTS_ROOT": paths.NCCL_TESTS_ROOT,
                    "SCALETRAIN_MPI_PREFIX": paths.MPI_PREFIX, "SCALETRAIN_CUDA_HOME": paths.CUDA_HOME}
    horovod = next(c for c in render.COMPONENTS if c.key == "horovod")
    assert "export HOROVOD_VERSION=0.28.1" in rendered(horovod)[0]
    base_text = rendered(render.COMPONENTS[0], base="dlami")[0]
    for line in (f"NVIDIA_DRIVER_VERSION={VERSIONS.nvidia_driver}", f"AWS_OFI_NCCL_VERSION={VERSIONS.aws_ofi_nccl}",
                 f"LIBFABRIC_VERSION={VERSIONS.libfabric}", "SCALETRAIN_BASE_HAS_DRIVER=true"):
        assert line in base_text


def test_a_changed_pin_changes_the_component_and_its_version(tmp_path: Path) -> None:
    data = json.loads(render.VERSIONS_FILE.read_text()) | {"nccl": "2.27.3"}
    (tmp_path / "versions.json").write_text(json.dumps(data))
    newer = render.load_versions(tmp_path / "versions.json")
    nccl = next(c for c in render.COMPONENTS if c.key == "nccl")
    old_text, new_text = (render.render_component(v, nccl) for v in (VERSIONS, newer))
    assert "export NCCL_VERSION=2.27.3" in new_text and "2.27.3" not in old_text
    assert render.semantic_version("1.0", old_text) != render.semantic_version("1.0", new_text)
    assert render.semantic_version("1.0", old_text) == render.semantic_version("1.0", old_text)


def test_bad_versions_file(tmp_path: Path) -> None:
    (tmp_path / "v.json").write_text(json.dumps(json.loads(render.VERSIONS_FILE.read_text()) | {"cuda": "12.8"}))
    with pytest.raises(ValueError, match="cuda"):
        render.load_versions(tmp_path / "v.json")


def test_the_driver_component_is_left_out_on_a_base_with_a_driver() -> None:
    assert "nvidia" in [c.key for c in render.components_for(VERSIONS, "ubuntu")]
    assert "nvidia" not in [c.key for c in render.components_for(VERSIONS, "dlami")]
    assert "nvidia" in [c.key for c in render.components_for(VERSIONS, "ami-0123456789abcdef0")]
    with pytest.raises(ValueError, match="choose one of ubuntu, dlami"):
        render.components_for(VERSIONS, "centos")


def test_ami_tags_choose_the_efa_environment() -> None:
    tags = render.ami_tags(VERSIONS, "ubuntu")
    assert tags["scaletrain:nccl"] == VERSIONS.nccl and tags["scaletrain:horovod"] == "0.28.1"
    assert render.ami_tags(VERSIONS, "dlami")["scaletrain:nvidia-driver"] == "from-base"
    assert tags["scaletrain:nvidia-fabricmanager"] == "570.172.08-1" and tags["scaletrain:aws-cli"] == VERSIONS.aws_cli
    env = efa.fabric_env(catalog.get("p4d.24xlarge"), render.software_versions(tags))
    # aws-ofi-nccl >= 1.7 with libfabric >= 1.18 needs neither FI_PROVIDER nor FI_EFA_USE_DEVICE_RDMA.
    assert env == {"FI_EFA_USE_HUGE_PAGE": "0"}
    assert "FI_EFA_USE_DEVICE_RDMA" in efa.fabric_env(catalog.get("p4d.24xlarge"), render.software_versions({}))


def test_readme_tables_are_the_versions_file_and_the_component_list() -> None:
    readme = (ROOT / "ami" / "README.md").read_text()
    assert render.versions_table(VERSIONS) in readme
    assert render.components_table() in readme
    assert "`aws-cli.sh`" in render.components_table() and "`fabricmanager.sh`" in render.components_table()


def test_fabric_manager_is_pinned_at_the_drivers_version(tmp_path: Path) -> None:
    assert VERSIONS.nvidia_fabricmanager == f"{VERSIONS.nvidia_driver}-1"
    data = json.loads(render.VERSIONS_FILE.read_text()) | {"nvidia_fabricmanager": "570.133.20-1"}
    (tmp_path / "v.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not the driver's version 570.172.08"):
        render.load_versions(tmp_path / "v.json")


def test_fabric_manager_and_the_aws_cli_run_on_every_base() -> None:
    for base in ("ubuntu", "dlami", "ami-0123456789abcdef0"):
        keys = [c.key for c in render.components_for(VERSIONS, base)]
        assert "fabricmanager" in keys and "aws-cli" in keys, base
        if "nvidia" in keys:  # Fabric Manager follows the driver the recipe installs
            assert keys.index("nvidia") < keys.index("fabricmanager")
    fm = next(c for c in render.COMPONENTS if c.key == "fabricmanager")
    assert render.component_env(VERSIONS, fm, base="dlami") == {
        "NVIDIA_DRIVER_VERSION": VERSIONS.nvidia_driver, "NVIDIA_FABRICMANAGER_VERSION": "570.172.08-1",
        "SCALETRAIN_BASE_HAS_DRIVER": "true"}
    assert render.component_env(VERSIONS, next(c for c in render.COMPONENTS if c.key == "aws-cli")) == {
        "AWS_CLI_VERSION": VERSIONS.aws_cli, "SCALETRAIN_AWS_CLI": paths.AWS_CLI}


def test_scripts_read_the_image_paths_from_ami_paths() -> None:
    """Every path ami/paths.py names reaches the scripts as a variable; none is written into a script."""
    env = render.image_env(VERSIONS)
    assert paths.shell_env().items() <= env.items()
    assert env["SCALETRAIN_BIN_PATH"].split(":") == list(paths.BIN_PATH)
    scaletrain = render.component_env(VERSIONS, next(c for c in render.COMPONENTS if c.key == "scaletrain"))
    assert scaletrain["SCALETRAIN_VENV"] == paths.VENV == "/opt/scaletrain/venv"
    assert scaletrain["SCALETRAIN_PROFILE"] == paths.PROFILE_FILE
    hard_coded = re.compile("|".join(re.escape(p) + r"(?![\w-])" for p in (
        paths.ROOT, paths.MPI_PREFIX, paths.EFA_PREFIX, paths.OFI_NCCL_PREFIX, paths.CUDA_HOME, paths.NCCL_TESTS_ROOT,
        paths.AWS_CLI, paths.IMAGE_ENV_FILE, paths.PROFILE_FILE)))
    found = [f"{script.name}:{n}: {line.strip()}" for script in SCRIPTS
             for n, line in enumerate(script.read_text().splitlines(), 1)
             if not line.lstrip().startswith("#") and hard_coded.search(line)]
    assert found == []


# --- The scripts ----------------------------------------------------------------------------------------------------


def test_scripts_are_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    if shellcheck is None:
        if os.environ.get("CI"):
            pytest.fail("shellcheck is missing; `make apt` installs it")
        pytest.skip("shellcheck is not installed (make apt installs it)")
    assert len(SCRIPTS) == len(render.COMPONENTS)
    result = subprocess.run([shellcheck, "--severity=style", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_a_script_without_its_versions_fails_loudly(script: Path, tmp_path: Path) -> None:
    needed = render.script_variables(script.read_text())
    assert needed, f"{script.name} reads no pinned variable"
    env = {"PATH": os.environ["PATH"]}
    result = subprocess.run([*sandbox(tmp_path), "bash", str(script), "validate"], capture_output=True, text=True,
                            env=env, timeout=30)  # sandboxed, as every image script the tests run (imagesandbox.py)
    assert result.returncode != 0 and needed[0] in result.stderr


# --- The stack ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def synth(tmp_path_factory):
    from ami.app import build

    _, stack = build({}, outdir=str(tmp_path_factory.mktemp("cdk.out")))
    return stack, Template.from_stack(stack)


def test_stack_builds_the_image_on_the_chosen_base(synth) -> None:
    stack, template = synth
    template.resource_count_is("AWS::ImageBuilder::Component", len(render.COMPONENTS))
    template.resource_count_is("AWS::ImageBuilder::Image", 1)
    template.has_resource_properties("AWS::ImageBuilder::ImageRecipe", {
        "ParentImage": f"ssm:{VERSIONS.bases['ubuntu'].ssm_parameter}",
        "Components": Match.array_with([{"ComponentArn": {"Fn::GetAtt": ["Componentnccl", "Arn"]}}])})
    template.has_resource_properties("AWS::ImageBuilder::DistributionConfiguration", {
        "Distributions": [Match.object_like({"AmiDistributionConfiguration": Match.object_like(
            {"AmiTags": render.ami_tags(VERSIONS, "ubuntu")})})]})
    template.has_resource_properties("AWS::ImageBuilder::InfrastructureConfiguration", {
        "InstanceTypes": ["g5.xlarge", "g6.xlarge", "g4dn.xlarge"],  # Image Builder takes one with capacity
        "InstanceMetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 2}})
    template.has_resource_properties("AWS::ImageBuilder::Image", {
        "ImageTestsConfiguration": {"ImageTestsEnabled": True, "TimeoutMinutes": 120}})
    template.has_output("ImageId", {"Value": {"Fn::GetAtt": ["Image", "ImageId"]}})
    role = next(r for r in template.to_json()["Resources"].values() if r["Type"] == "AWS::IAM::Role")
    assert "EC2InstanceProfileForImageBuilder" in json.dumps(role["Properties"]["ManagedPolicyArns"])


def test_cfn_lint_reports_no_errors(synth) -> None:
    stack, template = synth
    matches = lint(json.dumps(template.to_json()), config=ManualArgs(regions=[stack.region]))
    errors = [m for m in matches if m.rule.id.startswith("E")]
    assert errors == [], "\n".join(f"{m.rule.id} {'/'.join(map(str, m.path))}: {m.message[:200]}" for m in errors)


def test_cdk_nag_has_no_unsuppressed_findings(synth) -> None:
    annotations = Annotations.from_stack(synth[0])
    findings = annotations.find_error("*", Match.string_like_regexp("AwsSolutions-.*")) + annotations.find_warning(
        "*", Match.string_like_regexp("CdkNagValidationFailure.*"))
    assert findings == [], [f"{f.id}: {f.entry.data}" for f in findings]


@pytest.mark.parametrize(("context", "line"), [
    ({"base": "centos"}, "error: base='centos': choose one of ubuntu, dlami, or an AMI id (ami-...)"),
    ({"nvidia_kernel_modules": "closed"}, "error: nvidia_kernel_modules='closed': string should match pattern"),
    ({"build_instance_types": "g5.xlarge,p3.2xlarge"}, "error: build_instance_types='g5.xlarge,p3.2xlarge': the types "
     "draw on different on-demand vCPU quotas (G and VT, P); allowed: types of one class"),
    ({"build_instance_types": "g5.xlarge,"}, "error: build_instance_types='g5.xlarge,': '' is not an instance type"),
])  # fmt: skip
def test_app_exits_1_with_one_error_line(context: dict, line: str) -> None:
    env = {**os.environ, **CDK_ENV, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": "/nonexistent-not-written"}
    result = subprocess.run([sys.executable, "ami/app.py"], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(line), result.stderr
