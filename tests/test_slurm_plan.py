"""Slurm's pure decisions (launcher/plans/slurm.py): the controller's slurm.conf, the daemons each node starts, the
training job's batch script, and what `scontrol` and the job completion log say about jobs. No servers."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from golden import assert_golden

from launcher.plans import slurm, slurm_rejoin

CLUSTER = slurm.SlurmCluster(name="local", controller="head", controller_addr="10.213.0.4", max_nodes=6)


def test_slurm_conf_golden():
    assert_golden("slurm-local.conf", slurm.slurm_conf(CLUSTER))


def conf_settings(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#") and not line.startswith(("NodeSet", "PartitionName")):
            key, _, value = line.partition("=")
            out[key] = value
    return out


def test_slurm_conf_is_what_recovery_relies_on():
    s = conf_settings(slurm.slurm_conf(CLUSTER))
    # A lost node noticed in about a minute, a replacement under the same name taken back, jobs requeued.
    assert int(s["SlurmdTimeout"]) <= 60
    assert s["ReturnToService"] == "2"
    assert s["JobRequeue"] == "1"
    # Nodes fetch the configuration from the controller; dynamic nodes need room in MaxNodeCount.
    assert "enable_configless" in s["SlurmctldParameters"]
    assert s["MaxNodeCount"] == "6"
    assert s["SlurmctldHost"] == "head(10.213.0.4)"
    # Finished jobs are remembered long enough for `launch jobs` after a detached run, and logged beyond that.
    assert int(s["MinJobAge"]) >= 24 * 3600
    assert s["JobCompType"] == "jobcomp/filetxt"


def test_slurm_conf_adds_health_check_and_epilog_only_when_given():
    bare = slurm.slurm_conf(CLUSTER)
    assert "HealthCheckProgram" not in bare and "EpilogSlurmctld" not in bare
    full = slurm.slurm_conf(slurm.SlurmCluster(name="x", controller="h", controller_addr="10.0.0.1", max_nodes=1,
                                               health_check="/opt/check", epilog_ctld="/opt/epilog"))
    assert "HealthCheckProgram=/opt/check" in full and "EpilogSlurmctld=/opt/epilog" in full


@pytest.mark.parametrize("max_nodes", [0, -1])
def test_slurm_conf_refuses_no_room_for_nodes(max_nodes):
    with pytest.raises(ValueError, match="max_nodes"):
        slurm.slurm_conf(slurm.SlurmCluster(name="x", controller="h", controller_addr="10.0.0.1", max_nodes=max_nodes))


def test_cluster_name_is_lower_case_and_safe():
    assert slurm.cluster_name("My-Cluster.1") == "scaletrain_my_cluster_1"


def _boot(role: str = "worker", cpus: int = 2, address: str = "10.213.0.2", health_check=None) -> list[str]:
    return slurm.worker_boot_commands(slurm.REHEARSAL_SLURM, controller_addr="10.213.0.4", role=role, cpus=cpus,
                                      address=address, health_check=health_check)


def test_worker_registers_itself_with_the_controller():
    cmds = _boot()
    options = slurm.environment_file("SLURMD_OPTIONS", slurm.slurmd_options(
        controller_addr="10.213.0.4", role="worker", cpus=2, address="10.213.0.2"))
    assert "-Z --conf-server 10.213.0.4:6817 --conf 'NodeAddr=10.213.0.2 CPUs=2 Feature=worker'" in options
    env = next(i for i, c in enumerate(cmds) if slurm.SLURMD_ENV in c and "printf" in c)
    slurmd = next(i for i, c in enumerate(cmds) if "enable --now" in c and slurm.SLURMD_SERVICE in c)
    munge = next(i for i, c in enumerate(cmds) if "enable --now" in c and "munge.service" in c)
    assert env < slurmd and munge < slurmd  # munged authenticates slurmd's registration
    # After registering, a replacement under a known name sets its own address, returns itself from DOWN, and
    # requeues the batch jobs its predecessor held.
    assert cmds[-3:] == slurm_rejoin.rejoin_commands("10.213.0.2")
    rejoin = cmds[-3:]
    assert "NodeAddr=10.213.0.2" in rejoin[0] and "State=RESUME" in rejoin[1] and "scontrol requeue" in rejoin[2]
    assert any("Feature=reducer" in c for c in _boot(role="reducer", cpus=4, address="10.0.0.9"))


def test_controller_starts_munge_before_slurmctld():
    cmds = slurm.controller_boot_commands(slurm.REHEARSAL_SLURM)
    munge = next(i for i, c in enumerate(cmds) if "enable --now" in c and "munge.service" in c)
    ctld = next(i for i, c in enumerate(cmds) if "enable --now" in c and slurm.SLURMCTLD_SERVICE in c)
    assert munge < ctld


def test_a_jobs_locked_memory_limit_is_slurmds_not_the_submitters():
    assert conf_settings(slurm.slurm_conf(CLUSTER))["PropagateResourceLimitsExcept"] == "MEMLOCK"


# --- The daemons as systemd units ------------------------------------------------------------------------------------

AWS_SLURM = "23.11.10"  # the release ami/versions.json pins (the stack takes it from there: tests/test_infra_head.py)


def unit_settings(text: str) -> dict[str, dict[str, list[str]]]:
    """A unit file's settings by section; a key may repeat (systemd.syntax(7))."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    for line in text.splitlines():
        if not line.strip() or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        assert current is not None, line
        current.setdefault(key, []).append(value)
    return sections


def systemd_argv(env_text: str, variable: str) -> list[str]:
    """What systemd passes for a unit's ``$VARIABLE`` read from an EnvironmentFile: the double-quoted value as it is
    (systemd.exec(5), EnvironmentFile), split at whitespace with quotes removed (systemd.service(5), "Command lines";
    env-util.c, replace_env_argv: EXTRACT_RELAX|EXTRACT_UNQUOTE)."""
    (value,) = [line.split("=", 1)[1] for line in env_text.splitlines() if line.startswith(f"{variable}=")]
    assert value[0] == value[-1] == '"' and '"' not in value[1:-1] and "\\" not in value, value
    return shlex.split(value[1:-1])


def shell_argv(env_file: Path, variable: str) -> list[str]:
    """The same file read by a shell: sourced, then the value's words as a command line would take them."""
    done = subprocess.run(["bash", "-c", f'. "$1"; eval "set -- ${variable}"; printf "%s\\n" "$@"', "-",
                           str(env_file)], check=True, capture_output=True, text=True)
    return done.stdout.splitlines()


@pytest.mark.parametrize("version", ["22.05", "22.05.8", "23.11", AWS_SLURM, "24.05.1"])
def test_units_are_schedmds_with_unlimited_locked_memory_and_their_own_cgroup(version):
    units = slurm.units(version)
    assert set(units) == {"/etc/systemd/system/slurmd.service", "/etc/systemd/system/slurmctld.service"}
    for path, text in units.items():
        u = unit_settings(text)
        after = u["Unit"]["After"][0].split()
        assert {"munge.service", "network-online.target", "remote-fs.target"} <= set(after), path
        assert u["Unit"]["Wants"] == ["network-online.target"]
        assert u["Install"] == {"WantedBy": ["multi-user.target"]}
        assert u["Service"]["TasksMax"] == ["infinity"]
    d = unit_settings(units[slurm.SLURMD_UNIT])["Service"]
    # Slurm's FAQ, "memlock": every job inherits slurmd's limit, and EFA needs it unlimited.
    assert d["LimitMEMLOCK"] == ["infinity"] and d["LimitSTACK"] == ["infinity"] and d["LimitNOFILE"] == ["131072"]
    assert d["Delegate"] == ["yes"]  # cgroup/v2 needs its subtree delegated
    assert d["KillMode"] == ["process"]  # restarting slurmd leaves the jobs' slurmstepd running
    assert d["EnvironmentFile"] == [f"-{slurm.SLURMD_ENV}"]
    assert d["ExecStart"][0].startswith("/usr/sbin/slurmd ") and d["ExecStart"][0].endswith(" $SLURMD_OPTIONS")
    assert d["Restart"] == ["on-failure"]  # until the controller answers: a worker may boot before the head node
    assert "ConditionPathExists" not in unit_settings(units[slurm.SLURMD_UNIT])["Unit"]  # configless: no slurm.conf
    ctld = unit_settings(units[slurm.SLURMCTLD_UNIT])
    assert ctld["Unit"]["ConditionPathExists"] == [slurm.CONF_PATH]
    assert ctld["Service"]["EnvironmentFile"] == [f"-{slurm.SLURMCTLD_ENV}"]
    assert ctld["Service"]["ExecStart"][0].endswith(" $SLURMCTLD_OPTIONS")


def test_units_follow_the_release_2205_simple_and_foreground_2311_notify_and_systemd():
    old, new = ({path: unit_settings(text)["Service"] for path, text in slurm.units(v).items()}
                for v in (slurm.REHEARSAL_SLURM, AWS_SLURM))
    # SchedMD's etc/*.service.in at slurm-22-05-8-1 and at slurm-23-11-10-1.
    assert old[slurm.SLURMD_UNIT]["Type"] == ["simple"]
    assert old[slurm.SLURMD_UNIT]["ExecStart"] == ["/usr/sbin/slurmd -D -s $SLURMD_OPTIONS"]
    assert old[slurm.SLURMCTLD_UNIT]["ExecStart"] == ["/usr/sbin/slurmctld -D -s $SLURMCTLD_OPTIONS"]
    assert "User" not in old[slurm.SLURMCTLD_UNIT] and "RuntimeDirectory" not in old[slurm.SLURMD_UNIT]
    assert new[slurm.SLURMD_UNIT]["Type"] == new[slurm.SLURMCTLD_UNIT]["Type"] == ["notify"]
    assert new[slurm.SLURMD_UNIT]["ExecStart"] == ["/usr/sbin/slurmd --systemd $SLURMD_OPTIONS"]
    assert new[slurm.SLURMCTLD_UNIT]["ExecStart"] == ["/usr/sbin/slurmctld --systemd $SLURMCTLD_OPTIONS"]
    assert new[slurm.SLURMCTLD_UNIT]["User"] == ["slurm"] and new[slurm.SLURMD_UNIT]["RuntimeDirectory"] == ["slurm"]
    assert slurm.units("23.11") == {k: v.replace(AWS_SLURM, "23.11") for k, v in slurm.units(AWS_SLURM).items()}


@pytest.mark.parametrize("version", ["21.08.5", "slurm-23.11", "23", ""])
def test_a_release_without_dynamic_nodes_or_no_release_is_refused(version):
    with pytest.raises(ValueError, match="Slurm"):
        slurm.units(version)


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize("version", [slurm.REHEARSAL_SLURM, AWS_SLURM])
def test_systemd_reads_the_units_without_a_complaint(version, tmp_path):
    """systemd's own parser (``systemd-analyze verify``): an unknown key or a bad value is reported; the daemons
    themselves are not installed here, which is the one complaint allowed."""
    files = []
    for path, text in slurm.units(version).items():
        files.append(tmp_path / path.rsplit("/", 1)[1])
        files[-1].write_text(text)
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", *map(str, files)], capture_output=True,
                          text=True, cwd=tmp_path, timeout=60)
    complaints = [line for line in done.stderr.splitlines()
                  if not re.search(r"Command /usr/sbin/slurm(ctl)?d is not executable", line)]
    assert complaints == []


def test_slurmds_options_survive_the_environment_file_as_systemd_and_a_shell_read_it(tmp_path):
    options = slurm.slurmd_options(controller_addr="10.0.0.1", role="reducer", cpus=96, address="10.0.7.9")
    assert options == ["-Z", "--conf-server", "10.0.0.1:6817", "--conf", "NodeAddr=10.0.7.9 CPUs=96 Feature=reducer"]
    text = slurm.environment_file("SLURMD_OPTIONS", options)
    assert systemd_argv(text, "SLURMD_OPTIONS") == options
    (tmp_path / "slurmd").write_text(text)
    assert shell_argv(tmp_path / "slurmd", "SLURMD_OPTIONS") == options
    assert systemd_argv(slurm.environment_file("SLURMCTLD_OPTIONS", []), "SLURMCTLD_OPTIONS") == []
    with pytest.raises(ValueError, match="double quote"):
        slurm.environment_file("SLURMD_OPTIONS", ['Feature="x"'])


def _run_writes(cmds: list[str], root: Path) -> None:
    """Run a boot's file writes (install -d, printf, chmod; not those owned by munge or slurm) with bash, each path
    they write under ``root``."""
    def under(cmd: str) -> str:
        if cmd.startswith("printf %s "):
            body, path = cmd.rsplit(" > ", 1)
            return f"{body} > {root}{path}"
        return shlex.join(f"{root}{w}" if w.startswith("/") else w for w in shlex.split(cmd))

    writes = [under(c) for c in cmds if c.startswith(("install -d -m", "printf %s ", "chmod "))]
    subprocess.run(["bash", "-euo", "pipefail", "-c", "\n".join(writes)], check=True)


def test_a_worker_writes_its_unit_and_options_then_enables_munge_and_slurmd(tmp_path):
    health = ["/opt/scaletrain/venv/bin/python", "-m", "launcher.doctor.health", "--backend", "aws"]
    cmds = slurm.worker_boot_commands(AWS_SLURM, controller_addr="10.0.0.1", role="worker", cpus=8,
                                      address="10.0.0.2", health_check=health)

    def at(fragment: str) -> int:
        return next(i for i, c in enumerate(cmds) if fragment in c)

    key, unit, env = at(f"chown munge:munge {slurm.MUNGE_KEY}"), at(f"> {slurm.SLURMD_UNIT}"), at(
        f"> {slurm.SLURMD_ENV}")
    reload, munge = cmds.index("systemctl daemon-reload"), cmds.index("systemctl enable --now munge.service")
    slurmd = cmds.index("systemctl enable --now --no-block slurmd.service")
    wait, rejoin = at("systemctl is-active --quiet slurmd.service"), at("scontrol update NodeName=")
    assert key < unit < reload and env < reload < munge < slurmd < wait < rejoin
    assert at(f"> {slurm.HEALTH_CHECK}") < slurmd  # slurmd runs the check as it starts
    assert cmds[-3:] == slurm_rejoin.rejoin_commands("10.0.0.2")
    assert not [c for c in cmds if c.startswith(("/usr/sbin/", "runuser"))]  # nothing started by hand
    _run_writes(cmds, tmp_path)
    written = tmp_path / slurm.SLURMD_ENV.lstrip("/")
    assert written.read_text() == slurm.environment_file("SLURMD_OPTIONS", slurm.slurmd_options(
        controller_addr="10.0.0.1", role="worker", cpus=8, address="10.0.0.2"))
    assert systemd_argv(written.read_text(), "SLURMD_OPTIONS")[-1] == "NodeAddr=10.0.0.2 CPUs=8 Feature=worker"
    assert (tmp_path / slurm.SLURMD_UNIT.lstrip("/")).read_text() == slurm.units(AWS_SLURM)[slurm.SLURMD_UNIT]
    assert (tmp_path / slurm.HEALTH_CHECK.lstrip("/")).stat().st_mode & 0o777 == 0o755
    subprocess.run(["bash", "-n", "-c", "\n".join(cmds)], check=True)


def test_the_controller_enables_slurmctld_with_its_state_on_its_own_disk(tmp_path):
    cmds = slurm.controller_boot_commands(slurm.REHEARSAL_SLURM)
    state = cmds.index(f"install -d -o slurm -g slurm -m 0755 {slurm.STATE_DIR} {slurm.LOG_DIR}")
    unit = next(i for i, c in enumerate(cmds) if c.endswith(f"> {slurm.SLURMCTLD_UNIT}"))
    assert cmds[-3:] == ["systemctl daemon-reload", "systemctl enable --now munge.service",
                         "systemctl enable --now slurmctld.service"]
    assert state < unit < len(cmds) - 3
    assert not any(slurm.SLURMD_SERVICE in c for c in cmds)
    _run_writes(cmds, tmp_path)
    assert (tmp_path / slurm.SLURMCTLD_UNIT.lstrip("/")).read_text() == slurm.units("22.05")[slurm.SLURMCTLD_UNIT]
    assert systemd_argv((tmp_path / slurm.SLURMCTLD_ENV.lstrip("/")).read_text(), "SLURMCTLD_OPTIONS") == []
    subprocess.run(["bash", "-n", "-c", "\n".join(cmds)], check=True)


JOB = slurm.BatchJob(name="scaletrain-resnet18", nodes=2, slots=1, output="/fsx/scaletrain/runs/r1",
                     python="/opt/scaletrain/venv/bin/python",
                     mpirun=("/opt/amazon/openmpi/bin/mpirun", "-np", "2", "--hostfile",
                             "/fsx/scaletrain/runs/r1/hostfile", "python", "-m", "training.train", "--epochs", "3"),
                     max_restarts=1, stall_timeout_s=1800)


def test_batch_script_golden():
    assert_golden("slurm-job.sbatch", slurm.batch_script(JOB))


def test_batch_script_asks_for_requeue_and_appends_output():
    lines = slurm.batch_script(JOB).splitlines()
    sbatch = [ln for ln in lines if ln.startswith("#SBATCH ")]
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --requeue" in sbatch
    assert "#SBATCH --open-mode=append" in sbatch  # a restarted job continues the same output file
    assert "#SBATCH --output=/fsx/scaletrain/runs/r1/slurm-%j.out" in sbatch
    assert lines[-1].startswith("exec /opt/scaletrain/venv/bin/python -m launcher.execute.jobstep --max-restarts 1 ")
    # Every #SBATCH line comes before the first command: sbatch ignores those after it.
    first_command = next(i for i, ln in enumerate(lines) if ln and not ln.startswith("#"))
    assert all(i < first_command for i, ln in enumerate(lines) if ln.startswith("#SBATCH"))


@pytest.mark.parametrize("nodes,slots", [(0, 1), (1, 0)])
def test_batch_script_refuses_an_empty_allocation(nodes, slots):
    with pytest.raises(ValueError):
        slurm.batch_script(slurm.BatchJob(**{**JOB.__dict__, "nodes": nodes, "slots": slots}))


@pytest.mark.parametrize("printed,job_id", [("42\n", "42"), ("42;scaletrain_local\n", "42"),
                                            ("sbatch: warning: x\n43\n", "43")])
def test_submitted_id(printed, job_id):
    assert slurm.submitted_id(printed) == job_id


@pytest.mark.parametrize("printed", ["", "sbatch: error: Batch job submission failed: Invalid feature specification"])
def test_submitted_id_refuses_no_id(printed):
    with pytest.raises(ValueError, match="no job id"):
        slurm.submitted_id(printed)


@pytest.mark.parametrize("slurm_state,state", [
    ("PENDING", "queued"), ("REQUEUED", "queued"), ("CONFIGURING", "queued"), ("RUNNING", "running"),
    ("COMPLETING", "running"), ("COMPLETED", "succeeded"), ("FAILED", "failed"), ("NODE_FAIL", "failed"),
    ("OUT_OF_MEMORY", "failed"), ("TIMEOUT", "failed"), ("CANCELLED", "cancelled"), ("CANCELLED+", "cancelled"),
    ("CANCELLED by 0", "cancelled")])
def test_state_of(slurm_state, state):
    assert slurm.state_of(slurm_state) == state


# What Slurm 22.05.8's `scontrol show job --oneliner` printed on the local cluster (trimmed of fields not read).
SCONTROL = (
    "JobId=2 JobName=scaletrain-resnet18 UserId=root(0) GroupId=root(0) Priority=1 JobState=PENDING "
    "Reason=BeginTime Dependency=(null) Requeue=1 Restarts=1 BatchFlag=1 ExitCode=0:0 "
    "StartTime=2026-11-25T15:40:12 EndTime=Unknown NodeList=(null) NumNodes=2-2 "
    "WorkDir=/fsx/scaletrain/runs/b StdOut=/fsx/scaletrain/runs/b/slurm-2.out\n"
    "JobId=1 JobName=scaletrain-resnet18 UserId=root(0) GroupId=root(0) Priority=1 JobState=COMPLETED "
    "Reason=None Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 ExitCode=0:0 "
    "StartTime=2026-11-25T15:30:00 EndTime=2026-11-25T15:38:09 NodeList=node[0-1] NumNodes=2 "
    "WorkDir=/fsx/scaletrain/runs/a b StdOut=/fsx/scaletrain/runs/a b/slurm-1.out\n")
JOBCOMP = (
    "JobId=1 UserId=root(0) GroupId=root(0) Name=scaletrain-resnet18 JobState=NODE_FAIL Partition=train "
    "TimeLimit=UNLIMITED StartTime=2026-11-25T15:20:00 EndTime=2026-11-25T15:25:00 NodeList=node[0-1] NodeCnt=2 "
    "ProcCnt=2 WorkDir=/fsx/scaletrain/runs/a b ExitCode=0:0\n"
    "JobId=0 UserId=root(0) GroupId=root(0) Name=old JobState=CANCELLED Partition=train TimeLimit=UNLIMITED "
    "StartTime=2026-11-24T10:00:00 EndTime=2026-11-24T10:05:00 NodeList=node0 NodeCnt=1 ProcCnt=1 "
    "WorkDir=/fsx/scaletrain/runs/old ExitCode=0:15\n")


def test_parse_jobs_newest_first_controller_over_log():
    jobs = slurm.parse_jobs(SCONTROL, JOBCOMP)
    assert [j.id for j in jobs] == ["2", "1", "0"]
    queued, done, old = jobs
    assert (queued.state, queued.restarts, queued.nodes, queued.started, queued.ended) == \
        ("queued", 1, "2-2", "2026-11-25T15:40:12", None)
    assert queued.reason == "BeginTime"
    # The controller's record wins over the log's older line for the same job (a NODE_FAIL before the requeue).
    assert (done.state, done.output, done.stdout) == \
        ("succeeded", "/fsx/scaletrain/runs/a b", "/fsx/scaletrain/runs/a b/slurm-1.out")
    assert done.reason is None
    # A job only the log remembers.
    assert (old.name, old.state, old.nodes, old.exit_code) == ("old", "cancelled", "node0", "0:15")


def test_parse_jobs_of_nothing():
    assert slurm.parse_jobs("No jobs in the system\n", "") == []


def test_the_jobs_mpirun_starts_its_daemons_through_slurm_with_the_runs_hostfile():
    from test_plan import SPEC, local_cluster

    c = local_cluster(2)
    argv = slurm.job_mpirun(c, c.select_workers(2), SPEC, fabric_env={"FI_PROVIDER": "efa"},
                            mca=[("btl_tcp_if_include", "ens5")])
    assert_golden("slurm-mpirun-local-2.json", json.dumps(argv, indent=1) + "\n")
    pairs = {argv[i + 1]: argv[i + 2] for i, a in enumerate(argv) if a == "--mca"}
    assert pairs["plm"] == "slurm" and pairs["btl_tcp_if_include"] == "ens5"
    assert argv[argv.index("--hostfile") + 1] == f"{SPEC.output}/{slurm.HOSTFILE}"
    assert "FI_PROVIDER=efa" in argv and argv[argv.index("-np") + 1] == "2"


@pytest.mark.parametrize("state,resumes", [
    ("IDLE", False), ("ALLOCATED", False), ("DOWN+DYNAMIC_NORM", True), ("DOWN+DYNAMIC_NORM+NOT_RESPONDING", True),
    ("IDLE+DRAIN+DYNAMIC_NORM", True), ("MIXED+DRAIN", True)])
def test_a_replacement_returns_itself_from_down_or_drain_only(state, resumes, tmp_path):
    """Run the rejoin's test with bash against what `scontrol show node` prints."""
    import subprocess

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f"#!/bin/bash\nif [ \"$1\" = show ]; then echo 'NodeName=node1 State={state} "
                                      f"ThreadsPerCore=1'; else echo \"$@\" >> {tmp_path}/updates; fi\n")
    (bin_dir / "scontrol").chmod(0o755)
    (bin_dir / "hostname").write_text("#!/bin/bash\necho node1\n")
    (bin_dir / "hostname").chmod(0o755)
    line = slurm_rejoin.rejoin_commands("10.0.0.9")[1]
    subprocess.run(["bash", "-euo", "pipefail", "-c", line], check=True, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    updates = (tmp_path / "updates").read_text() if (tmp_path / "updates").exists() else ""
    assert ("update NodeName=node1 State=RESUME" in updates) == resumes


def test_a_node_writes_its_health_check_before_slurmd_starts():
    argv = slurm.health_check_argv(python="/opt/scaletrain/venv/bin/python", backend="local",
                                   mpirun="/opt/amazon/openmpi/bin/mpirun", shared_mount="/fsx")
    assert argv == ["/opt/scaletrain/venv/bin/python", "-m", "launcher.doctor.health", "--backend", "local",
                    "--python", "/opt/scaletrain/venv/bin/python", "--mpirun", "/opt/amazon/openmpi/bin/mpirun",
                    "--shared-mount", "/fsx"]
    cmds = _boot(health_check=argv)
    write = next(i for i, c in enumerate(cmds) if f"> {slurm.HEALTH_CHECK}" in c)
    slurmd = next(i for i, c in enumerate(cmds) if "enable --now" in c and slurm.SLURMD_SERVICE in c)
    assert write < slurmd  # slurmd runs the check as it starts
    assert slurm.health_check_script(argv).splitlines()[-1] == "exec " + " ".join(argv)
    assert not any(slurm.HEALTH_CHECK in c for c in _boot())


def test_the_health_check_script_written_by_the_boot_is_the_rendered_one(tmp_path):
    import subprocess

    argv = ["/usr/bin/python3", "-m", "launcher.doctor.health", "--shared-mount", "/fsx with space"]
    write = next(c for c in _boot(health_check=argv) if f"> {slurm.HEALTH_CHECK}" in c)
    target = tmp_path / "healthcheck.sh"
    subprocess.run(["bash", "-c", write.replace(slurm.HEALTH_CHECK, str(target))], check=True)
    assert target.read_text() == slurm.health_check_script(argv)


def test_drain_reason_is_one_short_line():
    reason = slurm.drain_reason([("shared storage", "/fsx not mounted\n(findmnt)"), ("mpirun", "exit 127")])
    assert reason == "scaletrain health: shared storage: /fsx not mounted (findmnt); mpirun: exit 127"
    at_limit = slurm.drain_reason([("x", "y" * (slurm.REASON_LIMIT - len(slurm.DRAIN_PREFIX) - 3))])
    assert len(at_limit) == slurm.REASON_LIMIT and not at_limit.endswith("...")
    over = slurm.drain_reason([("x", "y" * (slurm.REASON_LIMIT - len(slurm.DRAIN_PREFIX) - 2))])
    assert len(over) == slurm.REASON_LIMIT and over.endswith("...")


@pytest.mark.parametrize("fields,restored", [
    ({"State": "IDLE+DRAIN", "Reason": "scaletrain health: mpirun: exit 127"}, True),
    ({"State": "IDLE+DRAIN", "Reason": "maintenance by the admin"}, False),  # not ours to undo
    ({"State": "IDLE", "Reason": "scaletrain health: old"}, False),
    ({}, False)])
def test_only_a_node_that_drained_itself_is_restored(fields, restored):
    assert slurm.health_restored(fields) == restored


def test_a_ddp_jobs_rendezvous_is_the_job_steps_not_the_submitters():
    """On a requeue the allocation's first node may be a replacement with a new address: the rendezvous comes from
    the job's step (the allocation as Slurm has it then), forwarded by name, never the address at submit time."""
    from test_plan import SPEC, local_cluster

    c = local_cluster(2)
    argv = slurm.job_mpirun(c, c.select_workers(2), SPEC.model_copy(update={"engine": "ddp"}), fabric_env={},
                            mca=[])
    exported = [argv[i + 1] for i, a in enumerate(argv) if a == "-x"]
    assert "MASTER_ADDR" in exported and "MASTER_PORT" in exported
    assert not [x for x in exported if x.startswith(("MASTER_ADDR=", "MASTER_PORT="))]
    horovod = slurm.job_mpirun(c, c.select_workers(2), SPEC, fabric_env={}, mca=[])
    assert not [a for a in horovod if a.startswith("MASTER_")]
    script = slurm.batch_script(slurm.BatchJob(**{**JOB.__dict__, "rendezvous_port": 29500}))
    assert " --rendezvous-port 29500 -- " in script and "--no-resume" not in script
    assert " --no-resume -- " in slurm.batch_script(slurm.BatchJob(**{**JOB.__dict__, "resume_flag": False}))


def test_the_node_check_runs_unless_the_job_says_no():
    """`launch train/run --no-node-check`: the step starts without the ring test (launcher/execute/jobstep.py, whose
    parser takes it: tests/test_jobstep_main.py)."""
    assert "--no-node-check" not in slurm.batch_script(JOB)
    script = slurm.batch_script(slurm.BatchJob(**{**JOB.__dict__, "node_check": False}))
    step = next(ln for ln in script.splitlines() if "launcher.execute.jobstep" in ln)
    assert " --no-node-check -- " in step
    argv = shlex.split(step)
    assert "--no-node-check" in argv[argv.index("launcher.execute.jobstep") + 1:argv.index("--")]


def test_on_straggler_drain_reaches_the_step_and_warn_adds_nothing():
    """`launch train/run --on-straggler drain` (launcher/plans/draining.py): the step's own option; warn, the
    default, leaves the script as it was."""
    assert "--on-straggler" not in slurm.batch_script(JOB)
    step = next(ln for ln in slurm.batch_script(slurm.BatchJob(**{**JOB.__dict__, "on_straggler": "drain"}))
                .splitlines() if "launcher.execute.jobstep" in ln)
    argv = shlex.split(step)
    assert argv[argv.index("--on-straggler") + 1] == "drain" and argv.index("--on-straggler") < argv.index("--")


def test_forward_by_name_touches_only_the_named_exports():
    assert slurm.forward_by_name(["mpirun", "-x", "A=1", "-x", "B=2", "prog", "A=3"], ("A", "C")) == \
        ["mpirun", "-x", "A", "-x", "B=2", "prog", "A=3"]


def test_a_replacement_requeues_only_the_batch_jobs_started_before_its_own_slurmd(tmp_path):
    """Run the requeue line with bash against what `scontrol` and `squeue` print. The instance booted 100 s ago;
    until its slurmd registers, the controller's record is the predecessor's (started before the boot), and the line
    waits. Then node1's slurmd started at T: a job whose batch script node1 held, started a second before T, is its
    predecessor's and requeued; one started a second after is this instance's own, and a job whose batch host is
    node0 is node0's to see fail; neither is touched."""
    import datetime
    import subprocess

    now = datetime.datetime.now(datetime.timezone.utc)

    def ago(seconds: int) -> str:
        return (now - datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "shows"

    def fakes(show_node: str, squeue: str) -> None:
        for name, body in {
            "squeue": squeue,
            "scontrol": f"if [ \"$1\" = show ]; then echo x >> {calls}; {show_node}; "
                        f"else echo \"$@\" >> {tmp_path}/updates; fi",
            "hostname": "echo node1",
            "cut": "if [ \"$*\" = '-d. -f1 /proc/uptime' ]; then echo 100; else exec /usr/bin/cut \"$@\"; fi",
            "sleep": "true",
        }.items():
            (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
            (bin_dir / name).chmod(0o755)

    def run(wait_s: int = 30) -> tuple[str, str]:
        calls.unlink(missing_ok=True)
        line = slurm_rejoin.lost_batch_requeue("$(hostname -s)", wait_s)
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", line], check=True, capture_output=True, text=True,
                             env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
        updates = tmp_path / "updates"
        said = updates.read_text() if updates.exists() else ""
        updates.unlink(missing_ok=True)
        return said, out.stdout

    jobs = f"echo '7 node1 {ago(96)}'; echo '8 node1 {ago(94)}'; echo '9 node0 {ago(300)}'"
    # the predecessor's record (its slurmd started 200 s ago) for two looks, then this instance's (95 s ago)
    fakes(f"if [ $(wc -l < {calls}) -le 2 ]; then s={ago(200)}; else s={ago(95)}; fi; "
          "echo 'NodeName=node1 Arch=x86_64'; echo \"   LastBusyTime=x SlurmdStartTime=$s\"", jobs)
    said, out = run()
    assert said == "requeue 7\n", out
    assert "requeueing job 7: its batch script was on the instance this one replaces" in out
    assert calls.read_text().count("x") == 3  # waited for this instance's registration
    # the predecessor's record throughout (this slurmd never registered): nothing is requeued
    fakes(f"echo 'NodeName=node1 SlurmdStartTime={ago(200)}'", jobs)
    assert run(wait_s=3) == ("", "")
    # a name Slurm does not know (a replacement's new host name on AWS, not registered): nothing, the boot goes on
    fakes("echo 'Node node1 not found' >&2; exit 1", "echo 'squeue: error: Invalid node name specified' >&2; exit 1")
    assert run(wait_s=3) == ("", "")
