"""Both CDK apps refuse a context key they do not read (issue 33 item 4): `npx cdk synth -c node=8
-c instance_typ=p5.48xlarge` synthesized, and would have deployed, the default 2 x p4d.24xlarge. The CDK's own keys
(cdk.json's feature flags, the CLI's "aws:cdk:..." settings, lookups' cache, acknowledged notices) and, for the
image app, cdk.json's cluster defaults as cdk.json gives them, are not the user's and pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from infra.spec import CONTEXT_KEYS, READ_KEYS, is_cdk_key, unknown_context_keys, unknown_key_line
from launcher.plans import preflight

ROOT = Path(__file__).resolve().parent.parent
CDK_JSON: dict[str, Any] = json.loads((ROOT / "cdk.json").read_text())["context"]
CDK_ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "20", "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1"}
# What the CDK CLI 2.1148.1 adds to CDK_CONTEXT_JSON beside cdk.json's context and the -c pairs (printed by an app
# that dumped it), and what `cdk acknowledge` and a context lookup would add.
CLI_OWN = {"aws:cdk:enable-path-metadata": True, "aws:cdk:enable-asset-metadata": True,
           "aws:cdk:version-reporting": True, "aws:cdk:bundling-stacks": ["**"],
           "@aws-cdk/core:failSynthOnValidationErrors": False, "acknowledged-issue-numbers": [32775],
           "availability-zones:account=123456789012:region=us-east-1": ["us-east-1a"]}


# --- the pure check ------------------------------------------------------------------------------------------------

def test_a_misspelt_key_is_unknown_and_every_key_the_app_reads_is_known():
    context = {**CDK_JSON, **CLI_OWN, "node": "8", "instance_typ": "p5.48xlarge"}
    assert unknown_context_keys(context, READ_KEYS) == ["node", "instance_typ"]
    assert unknown_context_keys({k: "x" for k in READ_KEYS}, READ_KEYS) == []


@pytest.mark.parametrize(("key", "cdks"), [
    ("@aws-cdk/aws-ec2:restrictDefaultSecurityGroup", True), ("aws:cdk:version-reporting", True),
    ("availability-zones:account=1:region=us-east-1", True), ("acknowledged-issue-numbers", True),
    ("acknowledged-issue-number", False), ("aws-cdk", False), ("nodes", False), ("node", False),
])  # fmt: skip
def test_the_cdks_own_keys_are_told_from_the_users(key: str, cdks: bool):
    assert is_cdk_key(key) is cdks
    assert unknown_context_keys({key: "1"}, READ_KEYS) == ([] if cdks or key in READ_KEYS else [key])


def test_a_project_default_passes_only_with_the_value_cdk_json_gives_it():
    project = {"nodes": 2, "spot": False, "cluster_name": "scaletrain"}
    known = ("base",)
    assert unknown_context_keys(project, known, project=project) == []
    # -c values arrive as strings: the same value given again is still cdk.json's
    assert unknown_context_keys({"nodes": "2", "spot": "false", "cluster_name": "scaletrain"}, known,
                                project=project) == []
    assert unknown_context_keys({"nodes": "8", "spot": "true"}, known, project=project) == ["nodes", "spot"]
    assert unknown_context_keys({"ttl_hours": 24}, known, project=project) == ["ttl_hours"]  # not in the project


def test_the_line_names_the_key_its_value_and_what_is_allowed():
    assert unknown_key_line("node", "8", ("nodes", "region")) == "node='8': unknown context key; allowed: nodes, region"


def test_preflight_refuses_what_the_app_refuses_and_passes_the_cdks_own():
    with pytest.raises(ValueError, match="^-c node=8: unknown context key 'node'; allowed: cluster_name"):
        preflight.context_from_args(["node=8"], CDK_JSON)
    context = preflight.context_from_args(["aws:cdk:version-reporting=false", "acknowledged-issue-numbers=1",
                                           "@aws-cdk/core:newStyleStackSynthesis=true", "nodes=8"], CDK_JSON)
    assert context["nodes"] == "8"


def test_cdk_json_holds_nothing_the_cluster_app_refuses():
    assert unknown_context_keys(CDK_JSON, READ_KEYS) == []


# --- the apps, as the CDK CLI runs them ---------------------------------------------------------------------------

def _run(app: str, context: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **CDK_ENV, "CDK_CONTEXT_JSON": json.dumps(context), "CDK_OUTDIR": "/nonexistent-not-written"}
    return subprocess.run([sys.executable, app], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("app", "extra", "line"), [
    ("infra/app.py", {"node": "8"}, f"error: node='8': unknown context key; allowed: {', '.join(CONTEXT_KEYS)}"),
    ("infra/app.py", {"instance_typ": "p5.48xlarge"}, "error: instance_typ='p5.48xlarge': unknown context key; "),
    ("ami/app.py", {"build_instance_type": "g5.xlarge"},
     "error: build_instance_type='g5.xlarge': unknown context key; allowed: stack_name, region, base, "
     "build_instance_types,"),
    ("ami/app.py", {"nodes": "8"}, "error: nodes='8': unknown context key; allowed: stack_name,"),
])  # fmt: skip
def test_each_app_exits_1_with_one_line_for_a_key_it_does_not_read(app: str, extra: dict, line: str):
    result = _run(app, {**CDK_JSON, **CLI_OWN, **extra})
    assert result.returncode == 1, result.stderr[-2000:]
    (got,) = result.stderr.strip().splitlines()
    assert got.startswith(line), got
    assert result.stdout == ""


CDK_CLI = ROOT / "node_modules" / ".bin" / "cdk"


@pytest.mark.skipif(not CDK_CLI.exists() or not shutil.which("node"), reason="CDK CLI not installed")
def test_cdk_cli_synth_with_a_misspelt_key_is_one_line_and_non_zero(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env |= {**CDK_ENV, "HOME": str(tmp_path), "AWS_EC2_METADATA_DISABLED": "true", "CI": "1"}
    argv = [str(CDK_CLI), "synth", "-q", "-o", str(tmp_path / "cdk.out"), "-c", "node=8",
            "-c", "instance_typ=p5.48xlarge"]  # fmt: skip
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: node='8': unknown context key; allowed: {', '.join(CONTEXT_KEYS)}"]
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "cdk.out" / "scaletrain.template.json").exists()
