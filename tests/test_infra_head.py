"""The stack's Slurm head node, the munge key and what every node runs at boot (issue #24, the AWS side).

Two synths: Spot workers with reducers (the head node stays on demand), and on-demand workers with a data bucket and
the user's own image. Then moto, with IAM enforced, shows what the head node's and the nodes' roles let their boot
scripts (and the head node's TTL duty) do on AWS: users holding exactly the roles' statements run the AWS CLI call the
boot script makes, taken from the rendered user data.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("aws_cdk")

from cfnlint.api import ManualArgs, lint  # noqa: E402
from test_infra import AMI, ROOT, Synth, _nag_findings  # noqa: E402
from test_slurm_plan import shell_argv, systemd_argv  # noqa: E402

from ami import paths, render  # noqa: E402
from infra import boot, catalog, policies, ttl  # noqa: E402
from infra.head import HEAD_INSTANCE_TYPE, MUNGE_KEY_LENGTH  # noqa: E402
from infra.stack import IMAGE_PARAMETER_ID  # noqa: E402
from launcher.local import account_server  # noqa: E402
from launcher.plans import slurm  # noqa: E402

REGION = "us-east-1"
SPOT_CLUSTER = "slurm-spot"


@pytest.fixture(scope="module")
def spot() -> Synth:
    return Synth(instance_type="p5.48xlarge", nodes="4", reducers="2", spot="true", az="us-east-1b",
                 cluster_name=SPOT_CLUSTER)


@pytest.fixture(scope="module")
def on_demand() -> Synth:
    return Synth(instance_type="p4d.24xlarge", nodes="8", ami=AMI, data_bucket="my-shards", cluster_name="slurm-od")


SHAPES = ["spot", "on_demand"]


def _synth(request: pytest.FixtureRequest, name: str) -> Synth:
    return request.getfixturevalue(name)


def text(value: Any, refs: dict[str, str] | None = None) -> str:
    """A template value as text; references as <LogicalId> / <LogicalId.Attribute>, or their value in ``refs``."""
    refs = refs or {}
    if isinstance(value, (str, int)):
        return str(value)
    if "Fn::Join" in value:
        separator, parts = value["Fn::Join"]
        return separator.join(text(part, refs) for part in parts)
    if "Ref" in value:
        return refs.get(value["Ref"], f"<{value['Ref']}>")
    if "Fn::GetAtt" in value:
        name = "{}.{}".format(*value["Fn::GetAtt"])
        return refs.get(name, f"<{name}>")
    if "Fn::Select" in value:
        index, listed = value["Fn::Select"]
        separator, source = listed["Fn::Split"]
        return f"<{text(source, refs)}|split {separator}|{index}>"
    raise AssertionError(f"unexpected template value {value!r}")


def head_template(synth: Synth) -> dict[str, Any]:
    (instance_id,) = synth.resources("AWS::EC2::Instance")
    assert instance_id == "HeadNode"
    return synth.props(synth.props(instance_id)["LaunchTemplate"]["LaunchTemplateId"]["Ref"])["LaunchTemplateData"]


def user_data(data: dict[str, Any], refs: dict[str, str] | None = None) -> str:
    return text(data["UserData"]["Fn::Base64"], refs)


def role_of_profile(synth: Synth, profile_arn: dict[str, Any]) -> str:
    (role,) = synth.props(profile_arn["Fn::GetAtt"][0])["Roles"]
    return role["Ref"]


def node_role(synth: Synth) -> str:
    return role_of_profile(synth, synth.launch_template("WorkerGroup")["IamInstanceProfile"]["Arn"])


def head_role(synth: Synth) -> str:
    return role_of_profile(synth, head_template(synth)["IamInstanceProfile"]["Arn"])


def statements(synth: Synth, role_id: str) -> list[dict[str, Any]]:
    return [s for p in synth.resources("AWS::IAM::Policy").values() if {"Ref": role_id} in p["Properties"]["Roles"]
            for s in p["Properties"]["PolicyDocument"]["Statement"]]


def grants(synth: Synth, role_id: str) -> set[tuple[tuple[str, ...], Any]]:
    """(actions, resource) of each statement; several resources as a sorted tuple."""
    return {(tuple(sorted([s["Action"]] if isinstance(s["Action"], str) else s["Action"])),
             tuple(sorted(map(text, s["Resource"]))) if isinstance(s["Resource"], list) else text(s["Resource"]))
            for s in statements(synth, role_id)}


def ttl_parameter_arn(cluster: str) -> str:
    return f"arn:aws:ssm:{REGION}:<AWS::AccountId>:parameter{ttl.parameter_name(cluster)}"


# --- The head node: on demand, a catalog CPU type, in the cluster's subnet and group, the project's image -------------


def test_head_node_is_on_demand_while_the_workers_are_spot(spot: Synth) -> None:
    distribution = spot.props("WorkerGroup")["MixedInstancesPolicy"]["InstancesDistribution"]
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0  # the workers are Spot...
    head = spot.props("HeadNode")
    data = head_template(spot)
    # ... and the head node is an instance with no market options anywhere: on demand.
    assert not {"InstanceMarketOptions", "SpotPrice"} & (head.keys() | data.keys())
    assert spot.resources_all["HeadNode"]["Type"] == "AWS::EC2::Instance"


@pytest.mark.parametrize("name", SHAPES)
def test_head_node_is_the_catalogs_small_cpu_type(name: str, request: pytest.FixtureRequest) -> None:
    synth = _synth(request, name)
    entry = catalog.get(HEAD_INSTANCE_TYPE)
    assert head_template(synth)["InstanceType"] == entry.name == "m5.large"
    assert (entry.gpus, entry.vcpus, entry.memory_gib, entry.efa_cards) == (0, 2, 8, 0)
    assert entry.price_usd_per_hour == 0.096 and "http" in entry.price_source
    assert json.loads(text(synth.json["Outputs"]["HeadNode"]["Value"]))["instance_type"] == entry.name


@pytest.mark.parametrize("name", SHAPES)
def test_head_node_is_launched_like_the_nodes_in_their_subnet_and_group(
    name: str, request: pytest.FixtureRequest
) -> None:
    synth = _synth(request, name)
    head, data, worker = synth.props("HeadNode"), head_template(synth), synth.launch_template("WorkerGroup")
    (subnet_id,) = synth.resources("AWS::EC2::Subnet")
    assert head["SubnetId"] == {"Ref": subnet_id} and synth.props("WorkerGroup")["VPCZoneIdentifier"] == [
        {"Ref": subnet_id}]
    assert head["SecurityGroupIds"] == [{"Fn::GetAtt": [synth.node_group(), "GroupId"]}]
    assert "PlacementGroupName" not in head
    # The same image as the workers (resolved from the pipeline's parameter, or the user's AMI), the same IMDSv2,
    # encrypted root and monitoring.
    assert data["ImageId"] == worker["ImageId"] == ({"Ref": IMAGE_PARAMETER_ID} if name == "spot" else AMI)
    for key in ("MetadataOptions", "BlockDeviceMappings", "Monitoring"):
        assert data[key] == worker[key], key
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    assert data["BlockDeviceMappings"][0]["Ebs"]["Encrypted"] is True
    tags = {t["Key"]: t["Value"] for t in head["Tags"]}
    assert tags["scaletrain:role"] == boot.HEAD_ROLE and tags["scaletrain:cluster"] == synth.context["cluster_name"]


@pytest.mark.parametrize("name", SHAPES)
def test_slurm_traffic_stays_within_the_cluster_group(name: str, request: pytest.FixtureRequest) -> None:
    """slurmctld (6817), slurmd (6818) and srun's ephemeral ports pass the group's all-traffic rule to and from itself,
    which holds the head node and every node; nothing outside the group is admitted to any port."""
    synth = _synth(request, name)
    nodes = {"Fn::GetAtt": [synth.node_group(), "GroupId"]}
    synth.template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress", {"IpProtocol": "-1", "GroupId": nodes, "SourceSecurityGroupId": nodes})
    synth.template.has_resource_properties(
        "AWS::EC2::SecurityGroupEgress", {"IpProtocol": "-1", "GroupId": nodes, "DestinationSecurityGroupId": nodes})
    for rule in synth.rules("AWS::EC2::SecurityGroupIngress"):
        if rule["GroupId"] == nodes:
            assert rule.get("SourceSecurityGroupId") in (nodes, {"Fn::GetAtt": [synth.storage_group(), "GroupId"]})


def test_the_head_node_boots_after_its_grants_and_the_secrets_manager_endpoint(spot: Synth) -> None:
    (endpoint_id,) = (k for k, v in spot.resources("AWS::EC2::VPCEndpoint").items()
                      if text(v["Properties"]["ServiceName"]).endswith(".secretsmanager"))
    assert spot.props(endpoint_id)["PrivateDnsEnabled"] is True
    depends = set(spot.resources_all["HeadNode"]["DependsOn"])
    policy_id = next(k for k, p in spot.resources("AWS::IAM::Policy").items()
                     if p["Properties"]["Roles"] == [{"Ref": head_role(spot)}])
    assert {endpoint_id, policy_id, head_role(spot)} <= depends


# --- What the head node and the nodes run at boot ------------------------------------------------------------------


def _conf_from_boot(script: str, tmp_path: Path, host: str, addr: str) -> str:
    """Run the head script's slurm.conf lines (the here-document and the sed) with bash, into tmp_path."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"cat > {slurm.CONF_PATH} <<"))
    end = next(i for i, line in enumerate(lines) if line.startswith("sed -i"))
    conf = tmp_path / "slurm.conf"
    part = "\n".join(lines[start:end + 1]).replace(slurm.CONF_PATH, str(conf))
    subprocess.run(["bash", "-euo", "pipefail", "-c", f"HEAD_HOST={host}; HEAD_ADDR={addr}\n{part}"], check=True)
    return conf.read_text()


def test_head_node_boot_writes_the_rendered_slurm_conf(spot: Synth, tmp_path: Path) -> None:
    script = user_data(head_template(spot))
    assert script.startswith("#!/bin/bash\nset -euo pipefail\n")
    # The controller's own name and address, read at boot, in the file slurm_conf renders.
    assert "HEAD_HOST=$(hostname -s)" in script and "HEAD_ADDR=$(imds local-ipv4)" in script
    written = _conf_from_boot(script, tmp_path, "ip-10-0-12-34", "10.0.12.34")
    max_nodes = 4 + 2 + boot.REPLACEMENT_SPARE_MIN  # 6 nodes: every one replaced once is less than the spare
    assert written == slurm.slurm_conf(slurm.SlurmCluster(
        name=SPOT_CLUSTER, controller="ip-10-0-12-34", controller_addr="10.0.12.34", max_nodes=max_nodes,
        epilog_ctld=slurm.EPILOG_PATH, health_check=slurm.HEALTH_CHECK,
        health_check_interval_s=slurm.HEALTH_CHECK_INTERVAL_S))
    for line in ("SlurmctldHost=ip-10-0-12-34(10.0.12.34)", "SlurmctldParameters=enable_configless",
                 "ReturnToService=2", f"SlurmdTimeout={slurm.SLURMD_TIMEOUT_S}", f"MaxNodeCount={max_nodes}",
                 f"ClusterName={slurm.cluster_name(SPOT_CLUSTER)}"):
        assert line in written.splitlines(), line


def _epilog_from_boot(script: str, tmp_path: Path) -> Path:
    """The head script's epilog (its here-document), written by bash into tmp_path as the boot writes it."""
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"cat > {slurm.EPILOG_PATH} <<"))
    end = next(i for i, line in enumerate(lines) if line == f"chmod 0755 {slurm.EPILOG_PATH}")
    epilog = tmp_path / "epilog.sh"
    part = "\n".join(lines[start:end + 1]).replace(slurm.EPILOG_PATH, str(epilog))
    subprocess.run(["bash", "-euo", "pipefail", "-c", part], check=True)
    assert epilog.stat().st_mode & 0o111
    return epilog


def _run_epilog(epilog: Path, tmp_path: Path, *, comment: str, state: str, aws_cli: str | None = None,
                env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the epilog as slurmctld does, SLURM_JOB_ID and SLURM_JOB_COMMENT set, with an `scontrol` that reports
    ``state``; the image's AWS CLI is a recorder unless ``aws_cli`` names a real one."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text(f"#!/bin/bash\necho 'JobId=7 JobName=x JobState={state} Reason=None'\n")
    (bin_dir / "aws").write_text(f'#!/bin/bash\nprintf "%s\\n" "$@" > {tmp_path}/aws-argv\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    text = epilog.read_text().replace(paths.AWS_CLI, aws_cli or str(bin_dir / "aws"))
    run_env = {**(env or os.environ), "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
               "SLURM_JOB_COMMENT": comment}
    return subprocess.run(["bash", "-c", text], env=run_env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("comment,state,moves", [
    (slurm.TEARDOWN_COMMENT, "COMPLETED", True), (slurm.TEARDOWN_COMMENT, "FAILED", True),
    (slurm.TEARDOWN_COMMENT, "PENDING", False),  # requeued after a lost node: the run goes on
    # A job being requeued (squeue(1), JOB STATE CODES: REQUEUED "Completing job is being requeued", REQUEUE_HOLD,
    # REQUEUE_FED): with --max-restarts the run goes on, and deleting the stack now would end it (issue 37 item 10).
    (slurm.TEARDOWN_COMMENT, "REQUEUED", False), (slurm.TEARDOWN_COMMENT, "REQUEUE_HOLD", False),
    (slurm.TEARDOWN_COMMENT, "REQUEUE_FED", False),
    (slurm.TEARDOWN_COMMENT, "CANCELLED", True), (slurm.TEARDOWN_COMMENT, "TIMEOUT", True),
    (slurm.TEARDOWN_COMMENT, "NODE_FAIL", True),  # out of restarts: nothing more will run
    ("", "COMPLETED", False), ("something else", "COMPLETED", False)])
def test_the_epilog_moves_the_ttl_to_now_only_when_a_teardown_job_has_ended(
    spot: Synth, tmp_path: Path, comment: str, state: str, moves: bool
) -> None:
    epilog = _epilog_from_boot(user_data(head_template(spot)), tmp_path)
    done = _run_epilog(epilog, tmp_path, comment=comment, state=state)
    assert done.returncode == 0, done.stderr
    recorded = tmp_path / "aws-argv"
    assert recorded.exists() == moves
    if moves:
        argv = recorded.read_text().splitlines()
        assert argv[:4] == ["--region", REGION, "ssm", "put-parameter"]
        assert argv[argv.index("--name") + 1] == ttl.parameter_name(SPOT_CLUSTER) and "--overwrite" in argv
        ttl.parse_expiry(argv[argv.index("--value") + 1])  # the guard's format, read by the guard


def test_head_node_boot_fetches_the_munge_key_then_enables_slurmctld(spot: Synth) -> None:
    script = user_data(head_template(spot))
    lines = script.splitlines()
    fetch = next(i for i, line in enumerate(lines) if "secretsmanager get-secret-value" in line)
    assert (f"{paths.AWS_CLI} --region {REGION} secretsmanager get-secret-value --secret-id '<MungeKey>' "
            f"--query SecretString --output text > {slurm.MUNGE_KEY}") in lines[fetch]
    # The units of the image's Slurm (ami/versions.json), enabled so that they start again after a reboot.
    assert boot.image_slurm() == render.load_versions().slurm
    daemons = "\n".join(slurm.controller_boot_commands(boot.image_slurm())) + "\n"
    assert script.endswith("\n" + daemons) and script.index(daemons) > script.index(lines[fetch])
    assert lines[-2:] == ["systemctl enable --now munge.service", "systemctl enable --now slurmctld.service"]
    assert "Type=notify" in script and "/usr/sbin/slurmctld --systemd $SLURMCTLD_OPTIONS" in script
    assert not [line for line in lines if line.startswith(("/usr/sbin/", "runuser"))]  # nothing started by hand
    subprocess.run(["bash", "-n", "-c", script], check=True)


def test_the_boot_takes_the_slurm_release_it_is_given() -> None:
    """A rehearsal node runs the same scripts with Debian 12's Slurm: SchedMD's 22.05 units."""
    head = boot.head_script(cluster_name="c", region=REGION, secret_id="arn:x", max_nodes=9,
                            slurm_version=slurm.REHEARSAL_SLURM)
    node = boot.node_script(region=REGION, secret_id="arn:x", controller_addr="10.0.0.5", role="worker", cpus=2,
                            slurm_version=slurm.REHEARSAL_SLURM)
    assert "/usr/sbin/slurmctld -D -s $SLURMCTLD_OPTIONS" in head and "Type=notify" not in head
    assert "/usr/sbin/slurmd -D -s $SLURMD_OPTIONS" in node and "Type=notify" not in node
    # Without one, the image's: what the stack renders.
    node_kw = dict(region=REGION, secret_id="arn:x", controller_addr="10.0.0.5", role="worker", cpus=2)
    assert boot.node_script(**node_kw) == boot.node_script(**node_kw, slurm_version=render.load_versions().slurm)
    for script in (head, node):
        subprocess.run(["bash", "-n", "-c", script], check=True)


def test_max_nodes_leaves_room_for_every_node_to_be_replaced() -> None:
    assert boot.max_nodes(workers=1, reducers=0) == 1 + boot.REPLACEMENT_SPARE_MIN
    assert boot.max_nodes(workers=8, reducers=2) == 20
    assert boot.max_nodes(workers=256, reducers=4) == 520
    with pytest.raises(ValueError):
        boot.max_nodes(workers=0, reducers=1)


def _slurmd_environment(script: str, addr: str, root: Path) -> Path:
    """The script's write of slurmd's environment file run by bash with NODE_ADDR set, into ``root``."""
    end = script.index(f" > {slurm.SLURMD_ENV}\n")
    start = script.rindex("\nprintf %s ", 0, end) + 1
    target = root / slurm.SLURMD_ENV.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    part = script[start:end] + f" > {target}"
    subprocess.run(["bash", "-euo", "pipefail", "-c", f"NODE_ADDR={addr}\n{part}"], check=True)
    return target


@pytest.mark.parametrize(("name", "group", "role", "instance_type"), [
    ("spot", "WorkerGroup", "worker", "p5.48xlarge"),
    ("spot", "ReducerGroup", "reducer", "c5n.18xlarge"),
    ("on_demand", "WorkerGroup", "worker", "p4d.24xlarge"),
])  # fmt: skip
def test_every_node_fetches_the_key_and_registers_with_the_head_nodes_address(
    name: str, group: str, role: str, instance_type: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    synth = _synth(request, name)
    script = user_data(synth.launch_template(group))
    subprocess.run(["bash", "-n", "-c", script], check=True)
    lines = script.splitlines()
    fetch = next(i for i, line in enumerate(lines) if "secretsmanager get-secret-value" in line)
    assert "--secret-id '<MungeKey>'" in lines[fetch] and f"> {slurm.MUNGE_KEY}" in lines[fetch]
    assert "NODE_ADDR=$(imds local-ipv4)" in lines[:fetch]
    # The head node's private IP is a CloudFormation attribute; the node's own address is read at boot. Both reach
    # slurmd through its environment file, quoted so that systemd (and a shell) reads the --conf value as one word.
    assert f"<HeadNode.PrivateIp>:{slurm.SLURMCTLD_PORT}" in script
    resolved = user_data(synth.launch_template(group), {"HeadNode.PrivateIp": "10.0.0.5"})
    env = _slurmd_environment(resolved, "10.0.7.9", tmp_path)
    argv = ["-Z", "--conf-server", f"10.0.0.5:{slurm.SLURMCTLD_PORT}", "--conf",
            f"NodeAddr=10.0.7.9 CPUs={catalog.get(instance_type).vcpus} Feature={role}"]
    assert systemd_argv(env.read_text(), "SLURMD_OPTIONS") == argv == shell_argv(env, "SLURMD_OPTIONS")
    # munge.service, then slurmd.service, enabled (they start again after a reboot) once the key, the unit with
    # unlimited locked memory and the options are written.
    unit = lines.index(f"' > {slurm.SLURMD_UNIT}")
    options = lines.index(f"' > {slurm.SLURMD_ENV}")
    munge = lines.index("systemctl enable --now munge.service")
    slurmd = lines.index("systemctl enable --now --no-block slurmd.service")
    assert fetch < unit < options < lines.index("systemctl daemon-reload") < munge < slurmd
    assert "LimitMEMLOCK=infinity" in lines[fetch:unit] and "Delegate=yes" in lines[fetch:unit]
    assert "ExecStart=/usr/sbin/slurmd --systemd $SLURMD_OPTIONS" in lines[fetch:unit]
    assert not [line for line in lines if line.startswith(("/usr/sbin/", "runuser"))]  # nothing started by hand
    # A replacement registering under a name the controller knows sets its own address (read at boot) once slurmd
    # is up.
    up = next(i for i, line in enumerate(lines) if "systemctl is-active --quiet slurmd.service" in line)
    rejoin = next(i for i, line in enumerate(lines) if "scontrol update NodeName=" in line and "NodeAddr=" in line)
    assert slurmd < up < rejoin and 'NodeAddr="$NODE_ADDR"' in lines[rejoin]
    # Its health check (the doctor's node checks, as Slurm's HealthCheckProgram) is written before slurmd starts,
    # against this group's instance type and EFA devices; these stacks have no shared storage (with FSx the boot
    # mounts it and the check asks for it: test_infra.py, test_with_fsx_every_instance_mounts_it_from_fstab...).
    written = re.search(r"printf %s ('[^']*') > " + re.escape(slurm.HEALTH_CHECK), script)
    assert written and script.index(written[0]) < script.index("\nsystemctl enable --now --no-block slurmd.service")
    argv = shlex.split(shlex.split(written[1])[0].splitlines()[-1])[1:]  # the script's exec line
    assert argv[argv.index("--backend") + 1] == "aws" and argv[argv.index("--instance-type") + 1] == instance_type
    assert argv[argv.index("--storage") + 1] == "none"
    efa = int(argv[argv.index("--efa-devices") + 1])
    assert (efa > 0) == (role == "worker" and catalog.get(instance_type).efa_cards > 0)


# --- The munge key and the roles -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_munge_key_is_a_generated_secret_only_the_two_roles_read(name: str, request: pytest.FixtureRequest) -> None:
    synth = _synth(request, name)
    (secret_id,) = synth.resources("AWS::SecretsManager::Secret")
    props = synth.props(secret_id)
    assert secret_id == "MungeKey" and "SecretString" not in props
    assert props["GenerateSecretString"] == {"PasswordLength": MUNGE_KEY_LENGTH, "ExcludePunctuation": True}
    assert MUNGE_KEY_LENGTH >= 32  # munged's minimum
    readers = {
        (p["Properties"]["Roles"][0]["Ref"], text(s["Resource"]))
        for p in synth.resources("AWS::IAM::Policy").values()
        for s in p["Properties"]["PolicyDocument"]["Statement"]
        if "secretsmanager" in json.dumps(s["Action"])
    }
    assert readers == {(node_role(synth), "<MungeKey>"), (head_role(synth), "<MungeKey>")}
    assert node_role(synth) != head_role(synth)
    assert not synth.resources("AWS::SecretsManager::ResourcePolicy")


@pytest.mark.parametrize("name", SHAPES)
def test_head_role_is_ssm_core_the_munge_key_and_the_ttl_parameter_only(
    name: str, request: pytest.FixtureRequest
) -> None:
    synth = _synth(request, name)
    role = synth.props(head_role(synth))
    assert [text(arn) for arn in role["ManagedPolicyArns"]] == [
        "arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore"]
    assert "Policies" not in role
    assert grants(synth, head_role(synth)) == {
        (("secretsmanager:GetSecretValue",), "<MungeKey>"),
        (("ssm:PutParameter",), ttl_parameter_arn(synth.context["cluster_name"])),
    }
    # Nothing beyond SSM core's own "*" (a managed policy, not in the template): no wildcard action or resource.
    assert "*" not in json.dumps(statements(synth, head_role(synth)))


# A node scaletrain drained marks its own instance Unhealthy for its group (launcher/doctor/health.py, infra/compute.py
# NodeIdentity.allow_marking_unhealthy): the health check's grant, not the boot's.
GROUP_ARN = "arn:<AWS::Partition>:autoscaling:<AWS::Region>:<AWS::AccountId>:autoScalingGroup:*:autoScalingGroupName/"
SET_HEALTH = (("autoscaling:SetInstanceHealth",), f"{GROUP_ARN}<WorkerGroup>")


def test_node_role_gains_the_munge_key_and_nothing_else(on_demand: Synth, spot: Synth) -> None:
    assert grants(on_demand, node_role(on_demand)) == {
        (("s3:GetBucketLocation", "s3:ListBucket"), "arn:<AWS::Partition>:s3:::my-shards"),
        (("s3:GetObject",), "arn:<AWS::Partition>:s3:::my-shards/*"),
        (("secretsmanager:GetSecretValue",), "<MungeKey>"),
        SET_HEALTH,
    }
    both = (f"{GROUP_ARN}<ReducerGroup>", f"{GROUP_ARN}<WorkerGroup>")   # its groups, and no other
    assert grants(spot, node_role(spot)) == {(("secretsmanager:GetSecretValue",), "<MungeKey>"), (SET_HEALTH[0], both)}


def test_the_roles_statements_are_infra_policies_which_the_rehearsal_account_grants_too(spot: Synth) -> None:
    """One source for what the boot may do: the template's statements are infra/policies.py's, which the local
    cluster's stand-in account grants its two roles (launcher/local/rehearsal_account.py)."""
    arns = {"secret_arn": "<MungeKey>", "parameter_arn": ttl_parameter_arn(spot.context["cluster_name"])}
    for role, role_id in ((policies.HEAD_ROLE, head_role(spot)), (policies.NODE_ROLE, node_role(spot))):
        # The boot's statements: the health check's SetInstanceHealth (above) is not one, and the rehearsal account
        # has no Auto Scaling group to grant it on (the keeper stands in for the group).
        found = [{k: text(v) if k == "Resource" else v for k, v in st.items()} for st in statements(spot, role_id)
                 if st["Action"] != SET_HEALTH[0][0]]
        assert found == policies.role_statements(role, **arns), role
        trust = spot.props(role_id)["AssumeRolePolicyDocument"]
        assert trust["Statement"] == policies.trust_policy()["Statement"], role
    with pytest.raises(ValueError, match="unknown role 'reducer'; allowed: node, head"):
        policies.role_statements("reducer", **arns)


# --- The output the launcher reads, the linters ----------------------------------------------------------------------


@pytest.mark.parametrize("name", SHAPES)
def test_head_node_output_says_how_to_find_it(name: str, request: pytest.FixtureRequest) -> None:
    synth = _synth(request, name)
    assert json.loads(text(synth.json["Outputs"]["HeadNode"]["Value"])) == {
        "instance_id": "<HeadNode>",
        "private_ip": "<HeadNode.PrivateIp>",
        "host_name": "<<HeadNode.PrivateDnsName>|split .|0>",
        "instance_type": HEAD_INSTANCE_TYPE,
        "slurmctld_port": slurm.SLURMCTLD_PORT,
    }
    assert "| `HeadNode` |" in (ROOT / "infra" / "README.md").read_text()


@pytest.mark.parametrize("name", SHAPES)
def test_cdk_nag_and_cfn_lint_pass(name: str, request: pytest.FixtureRequest) -> None:
    synth = _synth(request, name)
    assert _nag_findings(synth.stack) == []
    matches = lint(json.dumps(synth.json), config=ManualArgs(regions=[synth.stack.region]))
    errors = [m for m in matches if m.rule.id.startswith("E")]
    assert errors == [], "\n".join(f"{m.rule.id} {'/'.join(map(str, m.path))}: {m.message[:200]}" for m in errors)


# --- On AWS (moto, IAM enforced): what the roles let the boot scripts and the head node do ---------------------------

ACCOUNT = "123456789012"  # moto's default account
AWS_CLI = Path(sys.executable).parent / "aws"  # AWS CLI v1, from the dev extra


def _resolve(value: Any, refs: dict[str, str]) -> Any:
    if isinstance(value, list):
        return [_resolve(v, refs) for v in value]
    if isinstance(value, dict) and not {"Ref", "Fn::Join", "Fn::GetAtt"} & value.keys():
        return {k: _resolve(v, refs) for k, v in value.items()}
    return text(value, refs)


@pytest.fixture(scope="module")
def on_aws(spot: Synth) -> Iterator[dict[str, Any]]:
    """A moto server holding the stack's munge key, another secret and the TTL parameter, and one IAM user per role
    with exactly the role's statements (its policies from the template, SSM core's from moto's copy of it);
    then IAM enforced, each call naming its resource as in the local cluster's account
    (launcher/local/account_server.py: moto itself checks Secrets Manager's and SSM's against "*" only)."""
    moto_server = pytest.importorskip("moto.server")
    import boto3
    from moto.core.authorization import enable_iam_authentication
    from moto.iam.aws_managed_policies import aws_managed_policies_data
    from moto.secretsmanager.responses import SecretsManagerResponse
    from moto.ssm.responses import SimpleSystemManagerResponse

    if not AWS_CLI.is_file():
        pytest.skip("the AWS CLI v1 comes with the dev extra")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    admin = {"endpoint_url": endpoint, "region_name": REGION, "aws_access_key_id": "testing",
             "aws_secret_access_key": "testing"}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(SecretsManagerResponse, "_determine_resource", account_server.determine_secret, raising=False)
            patch.setattr(SimpleSystemManagerResponse, "_determine_resource", account_server.determine_parameter,
                          raising=False)
            secrets, ssm, iam = (boto3.client(s, **admin) for s in ("secretsmanager", "ssm", "iam"))
            key = "K" * MUNGE_KEY_LENGTH
            munge_arn = secrets.create_secret(Name="slurm-spot-munge", SecretString=key)["ARN"]
            other_arn = secrets.create_secret(Name="someone-elses", SecretString="not yours")["ARN"]
            parameter = ttl.parameter_name(SPOT_CLUSTER)
            ssm.put_parameter(Name=parameter, Value="2030-01-01T00:00:00Z", Type="String")
            ssm.put_parameter(Name="/scaletrain/image/ami-id", Value="ami-0123456789abcdef0", Type="String")
            refs = {"MungeKey": munge_arn, "AWS::AccountId": ACCOUNT, "AWS::Partition": "aws", "AWS::Region": REGION}
            core = json.loads(aws_managed_policies_data)["AmazonSSMManagedInstanceCore"]["Document"]["Statement"]
            users = {}
            for name, role_id in (("node", node_role(spot)), ("head", head_role(spot))):
                iam.create_user(UserName=name)
                document = {"Version": "2012-10-17", "Statement": [*_resolve(statements(spot, role_id), refs), *core]}
                iam.put_user_policy(UserName=name, PolicyName="role", PolicyDocument=json.dumps(document))
                access = iam.create_access_key(UserName=name)["AccessKey"]
                users[name] = {"aws_access_key_id": access["AccessKeyId"],
                               "aws_secret_access_key": access["SecretAccessKey"]}
            with enable_iam_authentication():
                yield {"endpoint": endpoint, "users": users, "refs": refs, "key": key, "munge_arn": munge_arn,
                       "other_arn": other_arn, "parameter": parameter}
    finally:
        server.stop()


def _boot_cli_call(script: str) -> list[str]:
    """The AWS CLI call of a boot script's munge key line, as argv, with the image's CLI swapped for this one."""
    (line,) = [line for line in script.splitlines() if "secretsmanager get-secret-value" in line]
    call = re.fullmatch(r"until \(umask 077 && (.*) > " + re.escape(slurm.MUNGE_KEY) + r"\); do", line)
    assert call, line
    argv = shlex.split(call.group(1))
    assert argv[0] == paths.AWS_CLI
    return [str(AWS_CLI), *argv[1:]]


def _run_cli(argv: list[str], aws: dict[str, Any], user: str) -> subprocess.CompletedProcess[str]:
    """As a node runs it: no AWS configuration, no region in the environment, the role's credentials."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    creds = aws["users"][user]
    env.update(AWS_ENDPOINT_URL=aws["endpoint"], AWS_ACCESS_KEY_ID=creds["aws_access_key_id"],
               AWS_SECRET_ACCESS_KEY=creds["aws_secret_access_key"], AWS_CONFIG_FILE="/dev/null",
               AWS_SHARED_CREDENTIALS_FILE="/dev/null", AWS_EC2_METADATA_DISABLED="true")
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


def _client(aws: dict[str, Any], user: str, service: str) -> Any:
    import boto3

    return boto3.client(service, endpoint_url=aws["endpoint"], region_name=REGION, **aws["users"][user])


def _denied(call: Any, action: str, user: str) -> None:
    """``call`` is refused by IAM: moto's server answers a JSON service's AccessDenied as XML with status 403, which
    botocore reports as code "403" with the XML as its message."""
    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as refused:
        call()
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    message = refused.value.response["Error"]["Message"]
    assert "<Code>AccessDenied</Code>" in message
    assert f"user/{user} is not authorized to perform: {action}" in message


def test_node_boot_reads_the_munge_key_and_the_node_cannot_move_the_ttl(spot: Synth, on_aws: dict[str, Any]) -> None:
    for group in ("WorkerGroup", "ReducerGroup"):
        argv = _boot_cli_call(user_data(spot.launch_template(group), on_aws["refs"]))
        done = _run_cli(argv, on_aws, "node")
        assert (done.returncode, done.stdout) == (0, on_aws["key"] + "\n"), done.stderr
    ssm = _client(on_aws, "node", "ssm")
    _denied(lambda: ssm.put_parameter(Name=on_aws["parameter"], Value="2020-01-01T00:00:00Z", Type="String",
                                      Overwrite=True), "ssm:PutParameter", "node")
    secrets = _client(on_aws, "node", "secretsmanager")
    _denied(lambda: secrets.get_secret_value(SecretId=on_aws["other_arn"]), "secretsmanager:GetSecretValue", "node")


def test_head_boot_reads_the_munge_key_and_the_head_may_move_the_ttl_only(
    spot: Synth, on_aws: dict[str, Any], tmp_path: Path
) -> None:
    argv = _boot_cli_call(user_data(head_template(spot), on_aws["refs"]))
    done = _run_cli(argv, on_aws, "head")
    assert (done.returncode, done.stdout) == (0, on_aws["key"] + "\n"), done.stderr
    # What the head's epilog runs after a `launch train --teardown` job: its own AWS CLI call, with the head's
    # credentials only, moves the expiry to now.
    epilog = _epilog_from_boot(user_data(head_template(spot), on_aws["refs"]), tmp_path)
    creds = on_aws["users"]["head"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_ENDPOINT_URL=on_aws["endpoint"], AWS_ACCESS_KEY_ID=creds["aws_access_key_id"],
               AWS_SECRET_ACCESS_KEY=creds["aws_secret_access_key"], AWS_CONFIG_FILE="/dev/null",
               AWS_SHARED_CREDENTIALS_FILE="/dev/null", AWS_EC2_METADATA_DISABLED="true")
    moved = _run_epilog(epilog, tmp_path, comment=slurm.TEARDOWN_COMMENT, state="COMPLETED", aws_cli=str(AWS_CLI),
                        env=env)
    assert moved.returncode == 0 and not moved.stderr, moved.stderr
    # Read back with the head's own SSM core grant (ssm:GetParameter on "*"): IAM is enforced, admin is refused now.
    now = _client(on_aws, "head", "ssm").get_parameter(Name=on_aws["parameter"])["Parameter"]["Value"]
    import datetime as dt

    # The fixture's expiry was 2030: now it is this minute.
    assert abs(ttl.parse_expiry(now) - dt.datetime.now(dt.timezone.utc)) < dt.timedelta(minutes=5), now
    ssm, secrets = _client(on_aws, "head", "ssm"), _client(on_aws, "head", "secretsmanager")
    for name in (ttl.parameter_name("another-cluster"), "/scaletrain/image/ami-id"):
        _denied(lambda n=name: ssm.put_parameter(Name=n, Value="x", Type="String", Overwrite=True),
                "ssm:PutParameter", "head")
    _denied(lambda: secrets.get_secret_value(SecretId=on_aws["other_arn"]), "secretsmanager:GetSecretValue", "head")
