"""Rehearsal nodes' pure plans: which scripts build the root and with what, the network, a node's boot; and the one
switch every component script honours (run for real, in bash, with nothing on PATH)."""

from __future__ import annotations

import subprocess

import pytest
from golden import assert_golden

from ami import paths, render
from launcher.errors import LaunchError
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
    cmd = plan.step_command(system[0])
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
    with pytest.raises(LaunchError, match="room for 13 nodes, not 20"):
        plan.network("local", [f"node{i}" for i in range(20)], "10.213.0.0/28")


def test_overlapping_routes_are_found():
    routes = ["default", "10.213.0.0/24", "172.17.0.0/16", "192.168.1.0/24"]
    assert plan.overlapping("10.213.0.0/24", routes) == ["10.213.0.0/24"]
    assert plan.overlapping("172.17.5.0/24", routes) == ["172.17.0.0/16"]
    assert plan.overlapping("10.214.0.0/24", routes) == []


def test_a_node_boots_into_its_own_root_with_only_the_shared_mount_from_this_machine():
    script = plan.boot_script(node="node1", lowerdirs=["/c/project/upper", "/c/system/root"], upper="/s/n/upper",
                              work="/s/n/work", merged="/s/n/merged", shared="/s/shared")
    assert_golden("rehearsal-boot.sh", script)
    lines = script.splitlines()
    binds = [ln for ln in lines if "--bind" in ln]
    # the only directory of this machine bound in is the shared one (the rest are device nodes)
    assert [b for b in binds if "/dev/" not in b] == ["mount --bind /s/shared /s/n/merged/fsx"]
    assert lines.index("pivot_root . .oldroot") < lines.index("umount -l /.oldroot")
    assert lines[-1] == "exec /usr/sbin/sshd -D -e"


def test_host_keys_are_printed_as_cloud_init_prints_them_and_read_by_the_ec2_parser():
    from launcher.cluster.aws.access import host_keys_from_console

    console = "\n".join(["booting", plan.HOST_KEYS_BEGIN, "ssh-ed25519 " + "A" * 68 + " root@node0",
                         "ecdsa-sha2-nistp256 " + "B" * 140 + " root@node0", plan.HOST_KEYS_END,
                         "Server listening on 0.0.0.0 port 22."])
    assert host_keys_from_console(console) == ["ssh-ed25519 " + "A" * 68, "ecdsa-sha2-nistp256 " + "B" * 140]
    assert plan.sshd_listening(console) and not plan.sshd_listening("booting")


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
        plan.replacement_address("10.213.0.0/28", {f"10.213.0.{i}" for i in range(2, 15)})


def test_the_default_subnet_is_the_first_one_nothing_routes():
    assert plan.free_subnet(["default", "172.17.0.0/16"]) == "10.213.0.0/24"
    assert plan.free_subnet(["10.213.0.0/24", "10.213.1.0/24"]) == "10.213.2.0/24"
    with pytest.raises(LaunchError, match="choose a free private subnet with --subnet"):
        plan.free_subnet(["10.213.0.0/16"])
