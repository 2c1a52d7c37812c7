"""Rehearsal nodes' pure plans: which scripts build the root and with what, the network, a node's boot; and the one
switch every component script honours (run for real, in bash, with nothing on PATH)."""

from __future__ import annotations

import subprocess

import pytest
from golden import assert_golden

from ami import paths, render
from launcher.errors import LaunchError
from launcher.plans import bootlog
from launcher.plans import rehearsal as plan

VERSIONS = render.load_versions()
# Layers that need GPUs, EFA or vendor repositories: each must skip itself under the switch.
HARDWARE = {"nvidia", "fabricmanager", "efa", "nccl", "aws-ofi-nccl", "beegfs", "lustre", "image-test"}


def test_every_component_of_the_recipe_runs_in_recipe_order_with_the_switch():
    system, project = plan.build_steps(VERSIONS)
    scripts = [s.script for s in system if s.source == "components"] + [project.script]
    assert scripts == [c.script for c in render.components_for(VERSIONS, "ubuntu") if "build" in c.phases]
    assert all(s.env[plan.SWITCH] == "1" for s in [*system, project])
    assert project.script == "scaletrain.sh"
    # each component gets exactly the variables the image gives it, plus the switch
    for step in system:
        if step.source == "components":
            component = next(c for c in render.COMPONENTS if c.script == step.script)
            expected = render.component_env(VERSIONS, component)
            if component.key == "pytorch":  # the CPU build of the project's own release (plan.REHEARSAL_TORCH)
                expected["TORCH_VERSION"] = plan.REHEARSAL_TORCH
            assert {k: v for k, v in step.env.items() if k != plan.SWITCH} == expected


def test_the_rehearsal_torch_is_the_one_this_projects_venv_and_horovod_wheel_use():
    makefile = (render.HERE.parent / "Makefile").read_text()
    assert f"TORCH_VERSION := {plan.REHEARSAL_TORCH}\n" in makefile


def test_what_the_ubuntu_ami_is_and_minbase_is_not_comes_first():
    """systemd, cloud-init and their configuration are in the root before any component runs, as they are in the
    AMI the recipe starts from."""
    system, _ = plan.build_steps(VERSIONS)
    assert system[0] == plan.Step(plan.INSTANCE, "rehearsal", {plan.SWITCH: "1"})
    text = (render.HERE / "rehearsal" / plan.INSTANCE).read_text()
    for package in ("systemd", "systemd-sysv", "cloud-init", "dbus", "sshfs"):
        assert f" {package} " in text
    assert "datasource_list: [ NoCloud, None ]" in text


def test_open_mpi_stands_in_right_where_the_efa_installer_runs():
    system, _ = plan.build_steps(VERSIONS)
    names = [s.script for s in system]
    assert names[names.index("efa.sh") + 1] == plan.STANDIN
    standin = system[names.index(plan.STANDIN)]
    assert standin.source == "rehearsal" and standin.env["SCALETRAIN_MPI_PREFIX"] == paths.MPI_PREFIX


def test_a_cached_horovod_wheel_reaches_only_the_horovod_component():
    system, _ = plan.build_steps(VERSIONS, horovod_wheel="/tmp/wheels/horovod.whl")
    assert [s.script for s in system if "SCALETRAIN_HOROVOD_WHEEL" in s.env] == ["horovod.sh"]


def test_the_layer_key_follows_every_script_and_its_environment():
    system, _ = plan.build_steps(VERSIONS)
    scripts = {s.script: b"echo" for s in system}
    base = plan.digest(plan.system_inputs(system, scripts, {}))
    assert base == plan.digest(plan.system_inputs(system, dict(scripts), {}))
    assert base != plan.digest(plan.system_inputs(system, {**scripts, "base.sh": b"echo 2"}, {}))
    changed = [plan.Step(s.script, s.source, {**s.env, "TORCH_VERSION": "9"}) for s in system]
    assert base != plan.digest(plan.system_inputs(changed, scripts, {}))


def _run_script(source: str, script: str, env: dict[str, str], tmp_path) -> subprocess.CompletedProcess:
    empty = tmp_path / "empty-bin"
    empty.mkdir(exist_ok=True)
    return subprocess.run(["/bin/bash", str(render.HERE / source / script), "build"], capture_output=True, text=True,
                          env={**env, "PATH": str(empty)}, timeout=60)


@pytest.mark.parametrize("key", sorted(HARDWARE))
def test_a_hardware_layer_skips_itself_under_the_switch_and_touches_nothing(key, tmp_path):
    """With no program on PATH at all, the script can only succeed by skipping before it runs anything."""
    component = next(c for c in render.COMPONENTS if c.key == key)
    env = render.component_env(VERSIONS, component)
    proc = _run_script("components", component.script, {**env, plan.SWITCH: "1"}, tmp_path)
    assert proc.returncode == 0 and "skipped on a rehearsal node" in proc.stdout, proc.stderr
    # ... and without the switch the same script does try to install (and here, with nothing on PATH, fails)
    assert _run_script("components", component.script, env, tmp_path).returncode != 0


@pytest.mark.parametrize("key", ["base", "aws-cli", "pytorch", "horovod", "scaletrain"])
def test_what_a_node_needs_is_installed_under_the_switch_not_skipped(key, tmp_path):
    component = next(c for c in render.COMPONENTS if c.key == key)
    proc = _run_script("components", component.script,
                       {**render.component_env(VERSIONS, component), plan.SWITCH: "1"}, tmp_path)
    assert proc.returncode != 0 and "skipped" not in proc.stdout


def test_the_open_mpi_stand_in_refuses_to_run_outside_a_rehearsal(tmp_path):
    proc = _run_script("rehearsal", plan.STANDIN, {"SCALETRAIN_MPI_PREFIX": paths.MPI_PREFIX}, tmp_path)
    assert proc.returncode == 2 and "rehearsal nodes only" in proc.stderr


def test_build_steps_run_in_a_clean_environment():
    system, _ = plan.build_steps(VERSIONS)
    cmd = plan.step_command(system[1])
    assert cmd[:2] == ["/usr/bin/env", "-i"] and cmd[-2:] == [f"{paths.SCRIPT_DIR}/base.sh", "build"]
    assert f"{plan.SWITCH}=1" in cmd and f"PATH={plan.BUILD_PATH}" in cmd
    assert not any(a.startswith(("VIRTUAL_ENV=", "PYTHONPATH=")) for a in cmd)


def test_the_network_gives_each_node_its_own_address_and_short_interface_names():
    netw = plan.network("local", ["node0", "node1", "reducer0"], "10.213.0.0/24")
    assert netw.gateway == "10.213.0.1" and netw.prefixlen == 24
    assert [n.address for n in netw.nodes] == ["10.213.0.2", "10.213.0.3", "10.213.0.4"]
    names = [netw.bridge, *(n.veth for n in netw.nodes)]
    assert all(len(n) <= 15 for n in names) and len(set(names)) == len(names)  # IFNAMSIZ
    assert len({n.netns for n in netw.nodes}) == 3
    other = plan.network("/elsewhere/clusters/local", ["node0"], "10.214.0.0/24")
    assert other.bridge != netw.bridge and other.nodes[0].netns != netw.nodes[0].netns


@pytest.mark.parametrize("subnet, fragment", [
    ("nonsense", "not an IPv4 network"),
    ("10.213.0.1/24", "not an IPv4 network"),
    ("8.8.8.0/24", "private IPv4 network"),
    ("10.0.0.0/8", "/16 to /28"),
])
def test_a_bad_subnet_is_one_line_naming_what_is_allowed(subnet, fragment):
    with pytest.raises(LaunchError, match=fragment):
        plan.network("local", ["node0"], subnet)


def test_a_subnet_too_small_for_the_nodes_is_refused():
    with pytest.raises(LaunchError, match="room for 11 nodes, not 20"):
        plan.network("local", [f"node{i}" for i in range(20)], "10.213.0.0/28")


def test_overlapping_routes_are_found():
    routes = ["default", "10.213.0.0/24", "172.17.0.0/16", "192.168.1.0/24"]
    assert plan.overlapping("10.213.0.0/24", routes) == ["10.213.0.0/24"]
    assert plan.overlapping("172.17.5.0/24", routes) == ["172.17.0.0/16"]
    assert plan.overlapping("10.214.0.0/24", routes) == []


def test_a_node_boots_into_its_own_root_and_becomes_systemd():
    script = plan.boot_script(node="node1", lowerdirs=["/c/project/upper", "/c/system/root"], upper="/s/n/upper",
                              work="/s/n/work", merged="/s/n/merged")
    assert_golden("rehearsal-boot.sh", script)
    lines = script.splitlines()
    binds = [ln for ln in lines if "--bind" in ln]
    # no directory of this machine is bound in (device nodes and the console only): the node's own boot mounts
    # the shared storage from the storage host
    assert binds and all("/dev/" in b for b in binds) and not any("/fsx" in ln for ln in lines)
    # cgroup v2 at /sys/fs/cgroup, as Ubuntu 22.04 mounts it (slurmd's cgroup/v2 plugin reads it there)
    assert "mount -t cgroup2 cgroup2 /s/n/merged/sys/fs/cgroup" in lines
    assert not any("-t cgroup " in ln or "name=systemd" in ln for ln in lines)  # no made-up v1 hierarchy
    assert lines.index("pivot_root . .oldroot") < lines.index("umount -l /.oldroot")
    # the image's init is the node's PID 1, and nothing the launcher starts by hand runs before it
    assert lines[-1] == ("exec setpriv --bounding-set=-sys_time,-sys_module env -i container=scaletrain-rehearsal "
                         "/sbin/init")
    assert not any("sshd" in ln or "ssh-keygen" in ln or "slurm" in ln or "munge" in ln for ln in lines)


def test_the_node_moves_into_its_cgroup_before_it_leaves_this_machines_sysfs():
    """`ip netns exec` remounts /sys, where the cgroup2 hierarchy is not mounted: writing cgroup.procs after it
    fails, and a node's systemd would then take this machine's whole cgroup tree as its own."""
    cmd = plan.boot_command("st-ab-node0", "/sys/fs/cgroup/unified/scaletrain/st-ab-node0", "/s/n/boot.sh")
    assert cmd[:2] == ["bash", "-c"]
    text = cmd[2]
    assert text.index("cgroup.procs") < text.index("ip netns exec") < text.index("unshare --cgroup")
    assert "&& exec ip netns exec st-ab-node0 unshare" in text  # no boot when the move failed


def test_the_seed_is_what_nocloud_reads(tmp_path):
    import yaml

    files = plan.seed_files(instance_id="i-0123456789abcdef0", hostname="node0", user_data="#!/bin/bash\ntrue\n",
                            public_keys=["ssh-ed25519 AAAA launcher", "", "ssh-ed25519 BBBB nodes\n"])
    assert set(files) == {"/var/lib/cloud/seed/nocloud/meta-data", "/var/lib/cloud/seed/nocloud/user-data"}
    meta = yaml.safe_load(files["/var/lib/cloud/seed/nocloud/meta-data"][0])
    assert meta == {"instance-id": "i-0123456789abcdef0", "local-hostname": "node0",
                    "public-keys": ["ssh-ed25519 AAAA launcher", "ssh-ed25519 BBBB nodes"]}
    assert files["/var/lib/cloud/seed/nocloud/user-data"] == (b"#!/bin/bash\ntrue\n", 0o600)


def test_cloud_inits_result_names_what_failed():
    assert bootlog.cloud_failure({"v1": {"datasource": "DataSourceNoCloud", "errors": []}}) is None
    assert bootlog.cloud_failure({"v1": {"errors": ["('scripts_user', RuntimeError('failed'))"]}}) == (
        "('scripts_user', RuntimeError('failed'))")


def test_imds_is_on_link_from_every_node_and_held_by_the_services_namespace():
    netw = plan.network("local", ["node0", "node1"], "10.213.0.0/24")
    assert netw.services is not None and netw.services.address == "10.213.0.254"
    assert netw.storage is not None and netw.storage.address == "10.213.0.253"
    assert ["ip", "-n", netw.node("node0").netns, "route", "add", "169.254.169.254/32", "dev", "eth0"] in (
        plan.node_net_commands(netw, netw.node("node0")))
    svc = plan.services_net_commands(netw)
    assert ["ip", "-n", netw.services.netns, "addr", "add", "169.254.169.254/32", "dev", "eth0"] in svc
    assert not any("route" in c for c in svc)  # it holds the address; it needs no route to it
    # no node, first or replacement, is ever given the services' or the storage host's address
    assert not {"10.213.0.253", "10.213.0.254"} & {n.address for n in netw.nodes}
    taken = {f"10.213.0.{i}" for i in range(2, 253)}
    with pytest.raises(LaunchError, match="no address left"):
        plan.replacement_address("10.213.0.0/24", taken)
    assert plan.replacement_address("10.213.0.0/24", taken - {"10.213.0.252"}) == "10.213.0.252"


def test_the_aws_clis_one_difference_is_its_endpoint():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read_string(plan.aws_config("http://10.213.0.254:5000", "us-east-1"))
    assert dict(cfg["default"]) == {"region": "us-east-1", "endpoint_url": "http://10.213.0.254:5000"}


def test_the_rehearsals_aws_cli_reads_the_one_config_the_cluster_writes():
    """root's boot and SlurmUser's epilog (no HOME, no environment) both reach the stand-in account."""
    text = (render.HERE / "components" / "aws-cli.sh").read_text()
    assert f"REHEARSAL_CONFIG={plan.AWS_CONFIG}\n" in text


def test_host_keys_are_read_from_cloud_inits_console_by_the_ec2_parser():
    from launcher.cluster.aws.access import host_keys_from_console

    # what a node's console held, cloud-init's own keys-to-console output (a rehearsal node, 2026-11-27)
    console = "\n".join(["<14>Nov 27 17:02:54 cloud-init: -----BEGIN SSH HOST KEY FINGERPRINTS-----",
                         "<14>Nov 27 17:02:54 cloud-init: 256 SHA256:dUdYH6Nv root@node0 (ECDSA)",
                         "<14>Nov 27 17:02:54 cloud-init: -----END SSH HOST KEY FINGERPRINTS-----",
                         plan.HOST_KEYS_BEGIN, "ecdsa-sha2-nistp256 " + "B" * 140 + " root@node0",
                         "ssh-ed25519 " + "A" * 68 + " root@node0", plan.HOST_KEYS_END])
    assert host_keys_from_console(console) == ["ecdsa-sha2-nistp256 " + "B" * 140, "ssh-ed25519 " + "A" * 68]


def test_missing_tools_and_root_are_one_line_naming_the_fix():
    assert plan.missing_tools({"ip": True, "debootstrap": True}) is None
    line = plan.missing_tools({"ip": False, "debootstrap": False, "unshare": True})
    assert line == "rehearsal nodes need ip, debootstrap: install iproute2; install debootstrap (`make setup` does)"
    with pytest.raises(LaunchError, match="need root.*--loopback"):
        plan.root_required(1000)
    plan.root_required(0)  # root: no error


def test_a_replacement_gets_an_address_no_node_has_had():
    assert plan.replacement_address("10.213.0.0/24", {"10.213.0.2", "10.213.0.3"}) == "10.213.0.4"
    assert plan.replacement_address("10.213.0.0/28", {"10.213.0.2", "10.213.0.4"}) == "10.213.0.3"
    with pytest.raises(LaunchError, match="no address left"):
        plan.replacement_address("10.213.0.0/28", {f"10.213.0.{i}" for i in range(2, 13)})


def test_the_default_subnet_is_the_first_one_nothing_routes():
    assert plan.free_subnet(["default", "172.17.0.0/16"]) == "10.213.0.0/24"
    assert plan.free_subnet(["10.213.0.0/24", "10.213.1.0/24"]) == "10.213.2.0/24"
    with pytest.raises(LaunchError, match="choose a free private subnet with --subnet"):
        plan.free_subnet(["10.213.0.0/16"])


def test_a_nodes_boot_time_grows_with_the_cpu_of_the_nodes_booting_beside_it() -> None:
    """A node booting beside 64 others on 2 cores needs 65 boots' CPU over 2 cores, not a fixed minute."""
    assert plan.boot_timeout(1, 2) == plan.BOOT_SLACK_S + plan.BOOT_CPU_S / 2
    assert plan.boot_timeout(3, 2) < plan.BOOT_SLACK_S + 20  # the demo's cluster still fails within seconds
    assert plan.boot_timeout(65, 2) == plan.BOOT_SLACK_S + 65 * plan.BOOT_CPU_S / 2 > 60 + 65 * 9.6 / 2  # measured
    assert plan.boot_timeout(65, 16) < plan.boot_timeout(65, 2)
    assert plan.boot_timeout(0, 0) == plan.boot_timeout(1, 1)


def test_nodes_boot_two_a_core_at_a_time() -> None:
    """64 nodes at once on 2 cores crawled until one timed out: 4 boot at once there, the rest wait their turn."""
    assert plan.boot_parallelism(64, 2) == 4
    assert plan.boot_parallelism(3, 2) == 3            # the demo's cluster boots all at once
    assert plan.boot_parallelism(4, 2) == 4 and plan.boot_parallelism(5, 2) == 4
    assert plan.boot_parallelism(64, 16) == 32
    assert plan.boot_parallelism(0, 0) == 1
    # and a node's time to boot is its turn's, not the whole cluster's
    assert plan.boot_timeout(plan.boot_parallelism(64, 2) + 1, 2) == plan.BOOT_SLACK_S + 5 * plan.BOOT_CPU_S / 2


def test_nodes_are_refused_in_one_line_when_roots_inotify_instances_would_run_out() -> None:
    """Each node's systemd, dbus and logind hold 7 (8 counted); the 128 default fits 16 nodes beside nothing."""
    assert plan.inotify_shortfall(16, 128, 0) is None
    said = plan.inotify_shortfall(17, 128, 0)
    assert said is not None and "\n" not in said
    assert "17 rehearsal node(s) need about 136 inotify instances" in said and "128 left" in said
    assert "sysctl fs.inotify.max_user_instances=256 (restore 128 afterwards)" in said
    assert plan.inotify_shortfall(3, 128, 104) is None                 # 104 + 24 = 128: the last one fits
    assert "has 23 of its 128 left" in plan.inotify_shortfall(3, 128, 105)
    assert "max_user_instances=1024" in plan.inotify_shortfall(65, 128, 10)   # 10 + 520 = 530 -> 1024
    assert "has 0 of its 128 left" in plan.inotify_shortfall(1, 128, 200)


def test_a_failed_ups_paths_are_rewritten_to_where_its_logs_were_kept():
    said = "node0's user data failed: boom; output: /h/clusters/c/nodes/node0/upper/var/log/cloud-init-output.log"
    assert bootlog.kept_path(said, "/h/clusters/c", "/h/failed/c") == (
        "node0's user data failed: boom; output: /h/failed/c/nodes/node0/upper/var/log/cloud-init-output.log")
    assert bootlog.kept_path("log: /h/clusters/cc/services.log", "/h/clusters/c", "/h/failed/c") == (
        "log: /h/clusters/cc/services.log")  # another cluster's directory is not this one's
    assert all(not p.startswith("/") for p in bootlog.KEPT_LOGS)


CLOUD_INIT_OUTPUT = """Cloud-init v. 22.4.2 running 'init-local' at Sat, 28 Nov 2026 15:12:31 +0000. Up 3977.21 seconds.
ci-info: |  eth0  | True |          10.213.0.2         | 255.255.255.0 | global | 72:fe:05:94:9f:a9 |
Generating public/private rsa key pair.
Cloud-init v. 22.4.2 running 'modules:config' at Sat, 28 Nov 2026 15:12:33 +0000. Up 3979.06 seconds.
Cloud-init v. 22.4.2 running 'modules:final' at Sat, 28 Nov 2026 15:12:33 +0000. Up 3979.38 seconds.
+ install -d /fsx
+ mount /fsx
mount: /fsx: mount failed

2026-11-28 15:12:33,850 - cc_scripts_user.py[WARNING]: Failed to run module scripts-user (scripts in /var/lib/cloud/instance/scripts)
2026-11-28 15:12:33,850 - util.py[WARNING]: Running module scripts-user (<module 'cloudinit.config.cc_scripts_user' from '/usr/lib/python3/dist-packages/cloudinit/config/cc_scripts_user.py'>) failed
Cloud-init v. 22.4.2 finished at Sat, 28 Nov 2026 15:12:33 +0000. Datasource DataSourceNoCloud [seed=/var/lib/cloud/seed/nocloud][dsmode=net].  Up 3979.46 seconds
"""  # noqa: E501  (a real node's cloud-init-output.log, the user data's lines traced with set -x)


def test_a_failed_user_datas_own_last_lines_are_what_the_error_says_not_cloud_inits():
    assert bootlog.user_data_output(CLOUD_INIT_OUTPUT) == "+ install -d /fsx | + mount /fsx | mount: /fsx: mount failed"
    assert bootlog.user_data_output(CLOUD_INIT_OUTPUT, 1) == "mount: /fsx: mount failed"
    # a user data that printed nothing: cloud-init's lines are not passed off as its output
    silent = CLOUD_INIT_OUTPUT.replace("+ install -d /fsx\n+ mount /fsx\nmount: /fsx: mount failed\n", "")
    assert bootlog.user_data_output(silent) == "(no output)"
    # the log cut short at the final stage's banner: nothing of the banner's own line passed off as output either
    banner_only = "Cloud-init v. 22.4.2 running 'modules:final' at Sat. Up 1.0 seconds."
    assert bootlog.user_data_output(banner_only) == "(no output)"
    # a log without the final stage's banner (cut short): its last lines, cloud-init's own left out
    assert bootlog.user_data_output("boom\n2026-11-28 15:12:33,850 - util.py[WARNING]: failed\n") == "boom"


def test_a_nodes_clocks_start_about_a_second_into_its_boot_and_never_below_zero():
    assert plan.clock_offsets(7671.9, 7600.2) == (-7670, -7599)
    assert plan.clock_offsets(0.4, 0.0) == (0, 0)  # a machine that has just booted: nothing to take away
    cmd = plan.boot_command("st-ab-node0", "/cg", "/s/n/boot.sh", (-7670, -7599))[2]
    assert "unshare --cgroup --mount --uts --ipc --pid --time --boottime=-7670 --monotonic=-7599 --fork" in cmd
