"""Pure plans for AWS clusters, golden-tested per family: hostfile + mpirun argv + EFA env (from the AMI's tags),
BeeGFS / FSx set-up, the SSM ssh_config, host keys from a recorded console, staging, readiness."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from golden import assert_golden

from ami import paths
from ami.render import ami_tags, load_versions, software_versions
from infra import catalog
from infra.layout import beegfs_layout
from infra.spec import ClusterSpec
from launcher.cluster.aws import access, discover, lifecycle, readiness
from launcher.errors import LaunchError
from launcher.plans import dataprep, efa, staging, storage
from launcher.plans import job as plan

DATA = Path(__file__).parent / "data"
FAMILIES = ["p3.16xlarge", "p3dn.24xlarge", "p4d.24xlarge", "p5.48xlarge"]
SPEC = plan.TrainSpec(data="/fsx/scaletrain/data/shards", output="/fsx/scaletrain/runs/r1", epochs=90)


def node_groups(spec: ClusterSpec) -> list[dict]:
    """The stack's NodeGroups output for ``spec``, as infra/stack.py builds it (tests/test_infra.py pins its shape):
    each group's transport and interfaces from the spec."""
    groups = [{"role": "worker", "group_name": "c1-Workers", "instance_type": spec.instance_type, "nodes": spec.nodes,
               "transport": "efa" if spec.worker_efa else "tcp",
               "efa_devices": [i.as_dict() for i in spec.worker_interfaces]}]
    if spec.reducers:
        groups.append({"role": "reducer", "group_name": "c1-Reducers", "instance_type": spec.reducer_type,
                       "nodes": spec.reducers, "transport": spec.reducer_transport,
                       "efa_devices": [i.as_dict() for i in spec.reducer_interfaces]})
    return groups


def outputs(instance_type: str, *, reducers: int = 0, storage_kind: str = "beegfs",
            efa: bool | None = None) -> discover.StackOutputs:
    worker = catalog.get(instance_type)
    groups = node_groups(ClusterSpec(cluster_name="c1", instance_type=instance_type, nodes=2, reducers=reducers,
                                     efa=efa, ami="ami-0123456789abcdef0"))
    mount = beegfs_layout(worker, reducers=reducers) if storage_kind == "beegfs" else {
        "file_system_id": "fs-0123456789abcdef0", "dns_name": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        "mount_name": "abcdefgh", "mount_point": "/fsx", "mount_options": "relatime,flock", "capacity_gib": 1200,
        "deployment_type": "SCRATCH_2", "data_repository": "s3://imagenet-shards"}
    values = {"ClusterName": "c1", "InstanceType": instance_type, "NodeGroups": json.dumps(groups),
              "Storage": storage_kind, "StorageMount": json.dumps(mount), "DataBucket": "imagenet-shards",
              "TtlHours": "24", "TtlExpiresAt": "2026-11-18T09:00:00Z", "TtlScheduleName": "c1-ttl",
              "TtlScheduleGroup": "default"}
    return discover.parse_outputs("c1", [{"OutputKey": k, "OutputValue": v} for k, v in values.items()])


def instances(instance_type: str, workers: int, reducers: int = 0) -> list[discover.Instance]:
    # Deliberately out of IPv4 order (10.0.0.10 sorts after 10.0.0.9 numerically, before it as text).
    ips = ["10.0.0.10", "10.0.0.9", "10.0.1.2", "10.0.0.33"]
    made = [discover.Instance(instance_id=f"i-0{k:016x}", state="running", private_ip=ips[k], role="worker",
                              instance_type=instance_type, group_name="c1-Workers", launch_time="2026-11-17T09:00:00Z",
                              image_id="ami-0abc") for k in range(workers)]
    made += [discover.Instance(instance_id=f"i-1{k:016x}", state="running", private_ip=f"10.0.2.{k + 5}",
                               role="reducer", instance_type="c5n.18xlarge", group_name="c1-Reducers",
                               launch_time="2026-11-17T09:00:00Z", image_id="ami-0abc") for k in range(reducers)]
    return made


SOFTWARE = discover.software_from_tags(ami_tags(load_versions(), "ubuntu"))


def cluster(instance_type: str, workers: int = 2, reducers: int = 0, storage_kind: str = "beegfs",
            efa: bool | None = None):
    return discover.build_cluster(outputs(instance_type, reducers=reducers, storage_kind=storage_kind, efa=efa),
                                  instances(instance_type, workers, reducers), stack="c1", region="us-east-1",
                                  profile=None, ssh_config="/home/me/.scaletrain/clusters/c1/ssh_config",
                                  known_hosts="/home/me/.scaletrain/clusters/c1/known_hosts", software=SOFTWARE)


def test_nodes_are_named_in_ascending_ipv4_order_with_gpu_slots():
    c = cluster("p4d.24xlarge", workers=4, reducers=1)
    assert [(n.name, n.address) for n in c.workers] == [
        ("node0", "10.0.0.9"), ("node1", "10.0.0.10"), ("node2", "10.0.0.33"), ("node3", "10.0.1.2")]
    assert [n.slots for n in c.workers] == [8] * 4 and c.reducers[0].slots == 0
    assert c.mpi_ssh_config == "/home/ubuntu/.scaletrain/cluster/ssh_config"
    assert c.aws.software["aws-ofi-nccl"] == load_versions().aws_ofi_nccl


@pytest.mark.parametrize("instance_type", FAMILIES)
def test_hostfile_argv_and_env_per_family(instance_type):
    c = cluster(instance_type)
    instance = catalog.get(instance_type)
    versions = software_versions({f"scaletrain:{k}": v for k, v in c.aws.software.items()})
    env = efa.fabric_env(instance, versions)
    argv = plan.fabric_mpirun_argv(c, c.workers, SPEC, f"{SPEC.output}/hostfile", fabric_env=env,
                                   mca=efa.mpi_mca(instance, mpi_interface=c.mpi_interface))
    doc = {"hostfile": plan.hostfile(c.workers), "env": env, "mpirun": argv}
    assert_golden(f"aws-{instance_type}.json", json.dumps(doc, indent=1) + "\n")
    # The image's Open MPI by absolute path, and --prefix for the remote orted: not on a non-login shell's PATH.
    assert argv[:3] == [paths.MPIRUN, "--prefix", paths.MPI_PREFIX] and c.python == paths.PYTHON
    if not instance.has_efa:
        assert env == {} and not any(a.startswith("FI_") for a in argv)
    else:  # the image's aws-ofi-nccl (>= 1.7) and libfabric (>= 1.18) need none of the old workarounds
        assert env == {"FI_EFA_USE_HUGE_PAGE": "0"}
        assert argv[argv.index("btl") + 1] == "tcp,self"


def test_old_software_on_the_image_brings_back_the_workarounds():
    old = software_versions({"scaletrain:aws-ofi-nccl": "1.5.0", "scaletrain:libfabric": "1.16.0"})
    assert efa.fabric_env(catalog.get("p4d.24xlarge"), old) == {
        "FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0", "FI_PROVIDER": "efa", "NCCL_PROTO": "simple"}


@pytest.mark.parametrize("instance_type", ["p3dn.24xlarge", "p4d.24xlarge"])
def test_mpmd_argv_with_reducers(instance_type):
    c = cluster(instance_type, workers=2, reducers=2)
    spec = SPEC.model_copy(update={"engine": "reducer", "reducers": 2})
    fabric, mca = efa.for_cluster(c)
    argv = plan.launch_argv(c, c.workers, c.reducers, spec, f"{SPEC.output}/hostfile", fabric_env=fabric, mca=mca)
    doc = {"hostfile": plan.mpmd_hostfile(c.workers, c.reducers), "mpirun": argv}
    assert_golden(f"aws-{instance_type}-reducers.json", json.dumps(doc, indent=1) + "\n")
    assert argv[argv.index(":") + 4] == "reducer0:1,reducer1:1"
    # MPI's own traffic stays on TCP for the whole job; the EFA variables go to the GPU workers only.
    workers, reducers = argv[:argv.index(":")], argv[argv.index(":"):]
    assert argv[argv.index("btl") + 1] == "tcp,self" and "^openib" not in argv
    assert "FI_EFA_USE_HUGE_PAGE=0" in workers and not any(a.startswith("FI_") for a in reducers)


@pytest.mark.parametrize("instance_type", FAMILIES)
def test_a_discovered_cluster_runs_with_the_plan_launch_plan_shows(instance_type):
    # launch train (efa.for_cluster over discovery) and launch plan (catalog + the image's tags) agree.
    c = cluster(instance_type)
    instance = catalog.get(instance_type)
    fabric, mca = efa.for_cluster(c)
    versions = software_versions({f"scaletrain:{k}": v for k, v in c.aws.software.items()})
    assert versions == efa.versions_of(c.aws.software)
    assert fabric == efa.fabric_env(instance, versions)
    assert mca == efa.mpi_mca(instance, mpi_interface=c.mpi_interface)
    argv = plan.launch_argv(c, c.workers, [], SPEC, f"{SPEC.output}/hostfile", fabric_env=fabric, mca=mca)
    assert argv == plan.fabric_mpirun_argv(c, c.workers, SPEC, f"{SPEC.output}/hostfile", fabric_env=fabric, mca=mca)


# --- Each node group's transport and EFA devices come from the stack's NodeGroups output -------------------------


def test_reducers_beside_p4d_are_on_tcp_expect_no_efa_device_and_get_no_efa_env():
    # EFA traffic does not cross P4d/P5 and other families: the stack gives the c5n reducers one plain interface.
    c = cluster("p4d.24xlarge", workers=2, reducers=2)
    assert [(n.name, n.transport, n.efa_devices) for n in c.nodes] == [
        ("node0", "efa", 4), ("node1", "efa", 4), ("reducer0", "tcp", 0), ("reducer1", "tcp", 0)]
    assert readiness.expected_devices(c) == {"node0": (8, 4), "node1": (8, 4), "reducer0": (0, 0), "reducer1": (0, 0)}
    ready = readiness.NodeFacts("reducer0", "running", True, ssh_ok=True, cloud_init="done", gpus=0, efa=0)
    assert readiness.verdict(ready, gpus=0, efa=0).ready
    fabric, mca = efa.for_cluster(c)
    argv = plan.launch_argv(c, c.workers, c.reducers, SPEC.model_copy(update={"engine": "reducer", "reducers": 2}),
                            "/h", fabric_env=fabric, mca=mca)
    workers, reducers = argv[:argv.index(":")], argv[argv.index(":"):]
    assert "FI_EFA_USE_HUGE_PAGE=0" in workers and not any(a.startswith(("FI_", "NCCL_")) for a in reducers)


def test_reducers_beside_p3dn_use_their_efa_device():
    c = cluster("p3dn.24xlarge", workers=2, reducers=1)
    assert [(n.transport, n.efa_devices) for n in c.reducers] == [("efa", 1)]
    assert readiness.expected_devices(c)["reducer0"] == (0, 1)


def test_an_efa_false_stack_expects_no_efa_device_and_sets_no_efa_env():
    c = cluster("p4d.24xlarge", efa=False)
    assert readiness.expected_devices(c) == {"node0": (8, 0), "node1": (8, 0)}
    assert not efa.uses_efa(c) and efa.for_cluster(c) == ({}, [])
    argv = plan.launch_argv(c, c.workers, [], SPEC, "/h", fabric_env={}, mca=[])
    assert not any(a.startswith(("FI_", "NCCL_")) for a in argv) and argv[argv.index("btl") + 1] == "^openib"
    # What a node of that stack shows (8 GPUs, no EFA device) is ready; it used to wait for 4 devices.
    shows = readiness.NodeFacts("node0", "running", True, ssh_ok=True, cloud_init="done", gpus=8, efa=0)
    assert readiness.verdict(shows, gpus=8, efa=0).ready


def test_the_local_cluster_gets_no_fabric_settings():
    local = cluster("p4d.24xlarge").model_copy(update={"backend": "local", "aws": None, "instance_type": None})
    assert efa.for_cluster(local) == ({}, [])
    argv = plan.launch_argv(local, local.workers, [], SPEC, "/h", fabric_env={}, mca=[])
    assert argv == plan.mpirun_argv(local, local.workers, SPEC, "/h")


@pytest.mark.parametrize("instance_type", FAMILIES)
def test_beegfs_plan_per_family(instance_type):
    c = cluster(instance_type, workers=3)
    phases = storage.storage_plan(c.aws.storage, c.workers, c.reducers, secret="GOLDEN-SECRET")
    assert_golden(f"storage-beegfs-{instance_type}.txt", storage.render_plan(phases))
    by_name = {p.name: p for p in phases}
    assert list(by_name["management"].scripts) == ["node0"] == list(by_name["metadata"].scripts)
    assert list(by_name["storage targets"].scripts) == ["node0", "node1", "node2"]
    size = int(catalog.get(instance_type).memory_gib * 0.25)
    assert f"size={size}g" in by_name["ramdisk and auth"].scripts["node2"]
    assert "-m 10.0.0.9" in by_name["clients"].scripts["node1"]  # node0's address: the management service


def test_beegfs_plan_with_reducers_mounts_on_reducers_only_as_clients():
    c = cluster("p4d.24xlarge", workers=2, reducers=1)
    phases = storage.storage_plan(c.aws.storage, c.workers, c.reducers, secret="GOLDEN-SECRET")
    assert_golden("storage-beegfs-p4d.24xlarge-reducers.txt", storage.render_plan(phases))
    by_name = {p.name: p for p in phases}
    assert "reducer0" in by_name["clients"].scripts and "reducer0" not in by_name["storage targets"].scripts
    assert "mount -t tmpfs" not in by_name["ramdisk and auth"].scripts["reducer0"]


def test_fsx_plan_and_bad_storage_roles():
    c = cluster("p5.48xlarge", storage_kind="fsx")
    assert_golden("storage-fsx-p5.48xlarge.txt", storage.render_plan(storage.storage_plan(c.aws.storage, c.workers,
                                                                                         c.reducers, secret="x")))
    with pytest.raises(LaunchError, match="names worker:5 but the cluster has 2 worker"):
        storage.resolve_roles(["worker:5"], c.workers, c.reducers)


def test_ssh_config_through_ssm():
    c = cluster("p4d.24xlarge")
    nodes = [(n.name, n.instance_id) for n in c.nodes]
    ssm = access.ssh_config_ssm("c1", nodes, user="ubuntu", identity_file="/k/id_ed25519",
                                known_hosts="/k/known_hosts", region="us-east-1")
    assert_golden("ssh_config-aws-ssm.txt", ssm)
    assert ("ProxyCommand sh -c \"aws ssm start-session --target %h --document-name AWS-StartSSHSession "
            "--parameters 'portNumber=%p' --region us-east-1\"") in ssm
    assert "StrictHostKeyChecking yes" in ssm
    # SSM is the only way in: the node subnet has no internet gateway, so no bastion could reach it.
    assert not hasattr(access, "ssh_config_bastion") and "ProxyJump" not in ssm


def test_host_keys_come_from_the_recorded_console_and_nothing_is_pinned_blindly():
    text = (DATA / "console-output-cloud-init.txt").read_text()
    keys = access.host_keys_from_console(text)
    assert [k.split()[0] for k in keys] == ["ecdsa-sha2-nistp256", "ssh-ed25519"]
    assert all("root@" not in k for k in keys)  # the comment is dropped, the fingerprints block ignored
    assert access.host_keys_from_console(text.split("-----BEGIN SSH HOST KEY KEYS")[0]) == []
    line = access.known_hosts_aws([(["i-0abc"], keys)])
    assert line.splitlines()[1] == f"i-0abc {keys[1]}"
    with pytest.raises(LaunchError, match="no host key pinned for i-0def"):
        access.known_hosts_aws([(["i-0def"], [])])


def test_node_ssh_config_names_a_port_only_off_22_and_known_hosts_follow_openssh():
    nodes = [("node0", "127.0.0.1"), ("node1", "127.0.0.1")]
    cfg = access.node_ssh_config("c1", nodes, user="me", identity_file="/n/id_ed25519", known_hosts="/n/known_hosts",
                                 ports={"node0": 22, "node1": 2202})
    assert "Host node1\n    HostName 127.0.0.1\n    Port 2202\n" in cfg
    assert "Host node0\n    HostName 127.0.0.1\nHost node1" in cfg  # the shared block's Port 22
    assert [access.known_host_name("10.0.0.9"), access.known_host_name("127.0.0.1", 2202)] == [
        "10.0.0.9", "[127.0.0.1]:2202"]


def test_authorize_key_script_refuses_anything_but_one_public_key():
    script = access.authorize_key_script("ubuntu", "ssh-ed25519 " + "A" * 68 + " me@laptop\n")
    assert "authorized_keys" in script and "grep -qxF" in script
    with pytest.raises(LaunchError):
        access.authorize_key_script("ubuntu", "-----BEGIN OPENSSH PRIVATE KEY-----\nabc")


def test_staging_splits_shards_across_nodes_and_follows_fsx_import():
    shards = [f"train-{i:06d}.tar" for i in range(5)]
    s3 = staging.decide("s3://imagenet-shards/v1/", storage={"type": "beegfs", "mount_point": "/beegfs"},
                        data_bucket="imagenet-shards", shared_root="/beegfs/scaletrain")
    assert (s3.kind, s3.dest) == ("s3-copy", "/beegfs/scaletrain/data/imagenet-shards/v1")
    cli = {"aws_cli": paths.AWS_CLI, "region": "eu-west-1"}  # the stack's region, not the nodes' (they have none)
    scripts = staging.s3_copy_scripts(s3, shards, ["node0", "node1"], shared=True, **cli)
    assert_golden("staging-s3-2-nodes.txt", "".join(f"### {k}\n{v}" for k, v in scripts.items()))
    # One CLI process per node, filtered to its share (and the manifest on node0): the image's AWS CLI v2 by its
    # path (a non-login shell has no PATH to it), sent to the stack's region (the S3 gateway endpoint's).
    assert [scripts[n].count(f"{paths.AWS_CLI} --region eu-west-1 s3 cp") for n in ("node0", "node1")] == [1, 1]
    assert scripts["node0"].count("--include") == 4 and scripts["node1"].count("--include") == 2
    assert staging.s3_manifest_command("s3://imagenet-shards/v1/", **cli) == (
        f"{paths.AWS_CLI} --region eu-west-1 s3 cp --only-show-errors s3://imagenet-shards/v1/manifest.json -")
    alone = staging.s3_copy_scripts(s3, shards, ["node0", "node1"], shared=False, **cli)
    assert alone["node1"].count("--include") == 6
    # More nodes than shards: a node with nothing to copy runs no copy at all.
    assert "s3 cp" not in staging.s3_copy_scripts(s3, shards[:1], ["node0", "node1", "node2"], shared=True,
                                                  **cli)["node2"]
    fsx = staging.decide("s3://imagenet-shards/v1", storage={"type": "fsx", "mount_point": "/fsx",
                                                              "data_repository": "s3://imagenet-shards"},
                         data_bucket="imagenet-shards", shared_root="/fsx/scaletrain")
    assert (fsx.kind, fsx.dest) == ("fsx-import", "/fsx/v1")
    with pytest.raises(LaunchError, match="may only read s3://imagenet-shards"):
        staging.decide("s3://other/x", storage={}, data_bucket="imagenet-shards", shared_root="/r")
    assert staging.decide("/fsx/shards", storage={}, data_bucket=None, shared_root="/r",
                          found={"/fsx/shards": "manifest"}).kind == "ready"


FSX = {"type": "fsx", "mount_point": "/fsx", "data_repository": "s3://imagenet-raw"}


def decide_path(data: str, storage: dict, found: dict) -> staging.Staging:
    return staging.decide(data, storage=storage, data_bucket="imagenet-raw", shared_root="/fsx/scaletrain",
                          found=found, node="node0")


def test_raw_imagenet_on_shared_storage_is_converted_once_into_a_shards_directory_named_after_it():
    raw = "/fsx/ILSVRC2012/"  # e.g. s3://imagenet-raw/ILSVRC2012 imported by FSx, as the nodes see it
    paths = staging.probe_paths(raw, shared_root="/fsx/scaletrain")
    script = staging.probe_script(paths)
    cases = {"shards given": {paths[0]: "manifest"}, "imagenet, first run": {paths[0]: "dir", paths[1]: "missing"},
             "imagenet, interrupted run": {paths[0]: "dir", paths[1]: "dir"},
             "imagenet, converted before": {paths[0]: "dir", paths[1]: "manifest"}}
    lines = [f"probe: {script}"] + [f"{name}: {decide_path(raw, FSX, found)}" for name, found in cases.items()]
    # What awsrun.stage_data then runs: every node converts its share, node0 merges.
    c = cluster("p5.48xlarge", storage_kind="fsx")
    spec = dataprep.ConvertSpec(src=paths[0], out=paths[1])
    lines += [f"{node.name}: {cmd}" for node, cmd in dataprep.plan_convert(c, spec)]
    lines += [f"node0: {dataprep.merge_command(c, spec, len(c.nodes))}"]
    assert_golden("staging-convert-fsx.txt", "\n".join(lines) + "\n")
    assert paths == ["/fsx/ILSVRC2012", "/fsx/scaletrain/data/shards-ILSVRC2012-" + paths[1][-8:]]
    assert [decide_path(raw, FSX, f).kind for f in cases.values()] == ["ready", "convert", "convert", "ready"]
    assert decide_path(raw, FSX, cases["imagenet, converted before"]).dest == paths[1]
    # Two sources with the same name never share a shards directory.
    assert staging.shards_dir("/fsx/a/train", "/r") != staging.shards_dir("/fsx/b/train", "/r")


def test_the_probe_script_reports_each_directory_as_the_shell_finds_it(tmp_path):
    import subprocess

    (tmp_path / "shards").mkdir()
    (tmp_path / "shards" / "manifest.json").write_text("{}")
    (tmp_path / "raw dir").mkdir()
    paths = [str(tmp_path / "shards"), str(tmp_path / "raw dir"), str(tmp_path / "nowhere")]
    out = subprocess.run(["bash", "-c", staging.probe_script(paths)], capture_output=True, text=True, check=True)
    assert staging.parse_probe(out.stdout) == dict(zip(paths, ["manifest", "dir", "missing"], strict=True))


def test_conversion_needs_shared_storage_and_bad_data_is_one_line():
    found = {"/data/imagenet": "dir"}
    with pytest.raises(LaunchError) as e:
        decide_path("/data/imagenet", {"type": "none"}, found)
    assert "launch data convert" in str(e.value) and "s3://" in str(e.value) and "storage=fsx" in str(e.value)
    assert "\n" not in str(e.value)
    # Shards need no shared storage: every node reads the same path.
    assert decide_path("/data/shards", {"type": "none"}, {"/data/shards": "manifest"}).kind == "ready"
    with pytest.raises(LaunchError, match="no such directory on node0"):
        decide_path("/fsx/nowhere", FSX, {"/fsx/nowhere": "missing"})
    with pytest.raises(LaunchError, match="absolute path"):
        decide_path("imagenet", FSX, {})
    message = staging.no_s3_manifest("s3://imagenet-raw/ILSVRC2012", "node0")
    assert "manifest.json" in message and "data_bucket" in message and "\n" not in message


def test_readiness_stages_in_order():
    base = readiness.NodeFacts("node0", "running", True, ssh_ok=True, cloud_init="done", gpus=8, efa=4)
    assert readiness.verdict(base, gpus=8, efa=4).ready
    cases = [(base.__class__("node0", "pending", None), "instance"),
             (readiness.NodeFacts("node0", "running", False), "agent"),
             (readiness.NodeFacts("node0", "running", True, ssh_error="timed out"), "ssh"),
             (readiness.NodeFacts("node0", "running", True, ssh_ok=True, cloud_init="running"), "cloud-init"),
             (readiness.NodeFacts("node0", "running", True, ssh_ok=True, cloud_init="done", gpus=7, efa=4), "gpus"),
             (readiness.NodeFacts("node0", "running", True, ssh_ok=True, cloud_init="done", gpus=8, efa=0), "efa")]
    for facts, stage in cases:
        assert readiness.verdict(facts, gpus=8, efa=4).stage == stage
    assert readiness.parse_probe("cloud_init=done\ngpus=8\nefa=4\n") == {"cloud_init": "done", "gpus": "8", "efa": "4"}


def test_wait_ready_times_out_naming_the_stuck_nodes_with_a_fake_clock():
    now = [0.0]
    seen = []

    def gather():
        return [readiness.NodeFacts("node0", "running", True, ssh_ok=True, cloud_init="done", gpus=8, efa=4),
                readiness.NodeFacts("node1", "running", True, ssh_ok=True, cloud_init="running")]

    with pytest.raises(LaunchError) as e:
        readiness.wait_ready(gather, {"node0": (8, 4), "node1": (8, 4), "node2": (8, 4)}, timeout_s=600,
                             interval_s=30, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                             on_progress=seen.append)
    assert str(e.value) == ("2 of 3 node(s) not ready after 600 s: node1 (cloud-init running); "
                            "node2 (not launched)")
    assert len(seen) == 21  # checked at 0, 30, ..., 600 s


def test_status_arithmetic_and_ttl_extension():
    now = dt.datetime(2026, 11, 17, 11, 30, tzinfo=dt.timezone.utc)
    row = lifecycle.node_status("node0", "p4d.24xlarge", "running", "2026-11-17T09:00:00Z", now)
    assert row.uptime_s == 9000 and row.cost_usd == pytest.approx(21.957642 * 2.5)
    assert lifecycle.ttl_left("2026-11-17T12:00:00Z", now) == 1800
    assert lifecycle.format_duration(9000) == "2h30m"
    start = dt.datetime(2026, 11, 17, 12, 0, tzinfo=dt.timezone.utc)
    assert lifecycle.extended_start(start, 4, now) == dt.datetime(2026, 11, 17, 16, 0, tzinfo=dt.timezone.utc)
    # an already-due schedule is extended from now, not from the past
    assert lifecycle.extended_start(start - dt.timedelta(hours=5), 1, now) == now + dt.timedelta(hours=1)
    with pytest.raises(LaunchError, match="--extend-ttl must be more than 0 and at most 720 hours"):
        lifecycle.extended_start(start, 0, now)
    assert lifecycle.leftovers_verdict("c1", "us-east-1", []) is None
    assert "i-0abc (running)" in lifecycle.leftovers_verdict("c1", "us-east-1", [("i-0abc", "running")])


def test_undiscovered_instances_are_named_or_nothing_is_said():
    assert lifecycle.undiscovered({"i-1", "i-2"}, [("i-1", "worker", "running")]) is None
    line = lifecycle.undiscovered({"i-1"}, [("i-3", "worker", "pending"), ("i-1", "worker", "running"),
                                            ("i-2", "reducer", "running")])
    assert line == ("2 instance(s) of this cluster not discovered yet: i-2 (reducer, running), i-3 (worker, pending); "
                    "`launch discover` (or any `launch train`) adds them")
