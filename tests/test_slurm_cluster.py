"""Runs that live on the cluster, on a real local cluster with Slurm (`launch local up --slurm`): a head node running
slurmctld, slurmd -Z on two rehearsal nodes (each its own machine, sharing only /fsx), and the keeper that replaces
a lost node as an Auto Scaling group does. The launcher submits and follows; nothing of a run depends on it.

One cluster for the module: each test's runs are Slurm jobs queued one after another, as a user's would be."""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import pytest
from clusterutil import (
    ROOT,
    SHARDS,
    TINY,
    alive,
    assert_one_line_error,
    cluster_state,
    launch,
    launch_background,
    needs_root,
    node_cpus,
    node_run,
    on_host,
    put_on_shared,
    tiny_shards,
    up,
)

pytestmark = [pytest.mark.cluster, needs_root]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    root = tmp_path_factory.mktemp("slurm")
    home = root / "home"
    up(home, "--nodes", "2", "--reducers", "1", "--slurm")
    try:
        put_on_shared(home, tiny_shards(home, root), SHARDS)
        yield home
    finally:  # the last test takes the cluster down from its job's epilog; if it did not run, this does
        record = home / "clusters/local/rehearsal.json"
        keeper = json.loads(record.read_text())["keeper"] if record.exists() else None
        launch(home, "local", "down")
        assert keeper is None or not alive(keeper), "the keeper outlived `launch local down`"


def jobs(home: Path) -> list[dict]:
    proc = launch(home, "jobs", "--cluster", "local", "--json", check=True)
    return json.loads(proc.stdout)


def job(home: Path, job_id: str) -> dict:
    return next(j for j in jobs(home) if j["id"] == job_id)


def wait_for(what, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"not within {timeout:.0f} s: {what.__doc__ or what}")


def submitted(proc, timeout: float = 300) -> str:
    """The job id `launch train` printed ("job ID: ..."), read from its output as it runs."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("job ") and ":" in line:
            return line.split()[1].rstrip(":")
    raise AssertionError("launch train printed no job id:\n" + "".join(seen))


def test_slurm_runs_on_rehearsal_nodes_only(tmp_path):
    proc = launch(tmp_path / "home", "local", "up", "--loopback", "--slurm")
    assert_one_line_error(proc, "--slurm", "--loopback")


def test_nodes_registered_themselves_with_the_controller(home):
    state = cluster_state(home)
    assert state["head"]["name"] == "head" and state["head"]["role"] == "head"
    proc = launch(home, "exec", "--", "true", check=False)  # the nodes answer; the head is no rank's node
    assert proc.returncode == 0, proc.stderr
    assert "[head]" not in proc.stdout
    head = launch(home, "ssh", "--cluster", "local", "head", "hostname; sinfo --noheader -o '%n %T'", check=True)
    lines = head.stdout.split("\n")
    assert lines[0] == "head" and sorted(lines[1:4]) == ["node0 idle", "node1 idle", "reducer0 idle"], head.stdout
    # The munge key is the cluster's, made in the account as the stack's secret is, not the image's: every node's
    # boot read it from Secrets Manager (moto's, through the AWS CLI's endpoint setting, with IMDS's credentials).
    from launcher.local import rehearsal_services

    rehearsal = state["rehearsal"]
    sm = rehearsal_services.account(rehearsal["services"], "secretsmanager", rehearsal["account_key"],
                                    rehearsal["account_secret"])
    key = sm.get_secret_value(SecretId=rehearsal["secret"])["SecretString"].encode() + b"\n"
    assert len(key) == 1025  # the stack's 1024 characters, and the newline `--output text` ends them with
    node_key = home / "clusters/local/nodes/node0/upper/etc/munge/munge.key"
    assert node_key.read_bytes() == key and oct(node_key.stat().st_mode & 0o777) == "0o400"


def test_nodes_boot_as_instances_of_the_image_boot(home):
    """The issue's "done when", node by node: systemd is PID 1, cloud-init ran the user data and says done, cgroup v2
    at /sys/fs/cgroup, /fsx a network mount the node made itself (in its fstab), munge and Slurm's daemon active
    units asking for unlimited locked memory, and IMDS refusing a GET without a token."""
    for node, daemon in (("head", "slurmctld"), ("node0", "slurmd"), ("reducer0", "slurmd")):
        said = launch(home, "ssh", "--cluster", "local", node, " ; ".join([
            "ps -o comm= -p 1", "cloud-init status", "stat -f -c %T /sys/fs/cgroup",
            "findmnt -n -o FSTYPE,SOURCE /fsx", "grep -c ' /fsx fuse.sshfs ' /etc/fstab",
            f"systemctl is-active munge {daemon}", f"systemctl is-enabled {daemon}",
            f"systemctl show -p LimitMEMLOCK --value {daemon}",
            "curl -s -o /dev/null -w '%{http_code}\\n' http://169.254.169.254/latest/meta-data/instance-id",
            "t=$(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token)"
            " && curl -sf -H \"X-aws-ec2-metadata-token: $t\" http://169.254.169.254/latest/meta-data/local-ipv4; echo",
            "awk '/^CapBnd/ {print $2}' /proc/1/status", "systemctl show -p LoadState --value chrony",
            "systemctl show -p ConditionResult --value chrony", "cut -d. -f1 /proc/uptime",
            "scontrol show node $(hostname) 2>/dev/null | grep -o 'BootTime=[^ ]*' || echo none"]),
            check=True).stdout.split("\n")
        address = next(n["address"] for n in [*cluster_state(home)["nodes"], cluster_state(home)["head"]]
                       if n["name"] == node)
        storage = cluster_state(home)["rehearsal"]["storage"]
        memlock = "infinity" if daemon == "slurmd" else said[8]  # SchedMD's slurmctld.service sets none: no jobs
        assert said[:10] == ["systemd", "status: done", "cgroup2fs", f"fuse.sshfs root@{storage}:/", "1",
                             "active", "active", "enabled", memlock, "401"], (node, said)
        assert said[10] == address, (node, said)
        # No process of the node may set this machine's clock or load a module into its kernel (boot_script's
        # bounding set, bits 25 and 16 of capabilities(7); 21, CAP_SYS_ADMIN, kept: it mounts /fsx), so the
        # image's chrony, installed, skips itself.
        bounding = int(said[11], 16)
        assert not bounding & (1 << 25) and not bounding & (1 << 16) and bounding & (1 << 21), (node, said)
        assert said[12:14] == ["loaded", "no"], (node, said)
        # The node's clocks are its own (a time namespace: plans/rehearsal.clock_offsets): its uptime is since its
        # boot, not this machine's, and Slurm records that boot (BootTime), as for an instance booted minutes ago.
        with open("/proc/uptime") as f:
            host_up = float(f.read().split()[0])
        up = int(said[14])
        assert up < 1800 and (up < host_up - 30 or host_up < 600), (node, said[14], host_up)
        if daemon == "slurmd":
            booted = time.mktime(time.strptime(said[15].split("=", 1)[1], "%Y-%m-%dT%H:%M:%S"))
            assert abs((time.time() - up) - booted) < 120, (node, said[14:16])
    # A job's locked-memory limit is slurmd's, not that of the shell that submitted it (PropagateResourceLimits-
    # Except=MEMLOCK): submitted from a shell limited to 64 KiB, the job has slurmd's. (This machine's processes lack
    # CAP_SYS_RESOURCE, so slurmd's own stays at the machine's; on an instance it is the unit's infinity.)
    probe = "ulimit -l; awk '/locked/ {print $4}' /proc/$(pgrep -x slurmd)/limits"
    out = launch(home, "ssh", "--cluster", "local", "head",
                 f"ulimit -S -l 64; srun -N1 -w node0 bash -c {shlex.quote(probe)}", check=True).stdout.split()
    job_kib, slurmd_bytes = out[0], out[1]
    assert job_kib != "64", out
    assert job_kib == ("unlimited" if slurmd_bytes == "unlimited" else str(int(slurmd_bytes) // 1024)), out


def test_the_account_enforces_the_stacks_roles_on_the_credentials_imds_hands_each_node(home):
    """IMDS hands each node its instance profile's session (the head's role on the head, the node role elsewhere), and
    the stand-in account enforces the stack's statements (infra/policies.py) on it: the head may move the cluster's
    TTL (its epilog does, for --teardown), a worker or a reducer may not, and no role reads another secret. Unsigned
    calls are refused too: the account is locked once the stack's part of it is made."""
    from infra import ttl

    parameter = ttl.parameter_name("local")
    put = (f"aws ssm put-parameter --name {parameter} --value 2099-01-01T00:00:00Z --type String --overwrite "
           "--query Version --output text 2>&1 | tail -c 300; ")
    import boto3
    from botocore.exceptions import ClientError

    from launcher.local import rehearsal_services

    r = cluster_state(home)["rehearsal"]
    secrets = rehearsal_services.account(r["services"], "secretsmanager", r["account_key"], r["account_secret"])
    elses = secrets.create_secret(Name=f"someone-elses-{time.time_ns()}", SecretString="not yours")["ARN"]
    other = f"aws secretsmanager get-secret-value --secret-id {elses} --query Name --output text 2>&1 | tail -c 300"
    identity = "aws sts get-caller-identity --query Arn --output text; "
    said = {n: launch(home, "ssh", "--cluster", "local", n, identity + put + other, check=True).stdout
            for n in ("head", "node0", "reducer0")}
    assert said["head"].startswith("arn:aws:sts::123456789012:assumed-role/scaletrain-local-head/"), said["head"]
    assert said["head"].split("\n")[1].isdigit(), said["head"]  # PutParameter's version: allowed
    for node in ("node0", "reducer0"):
        assert said[node].startswith("arn:aws:sts::123456789012:assumed-role/scaletrain-local-node/"), said[node]
        assert "assumed-role/scaletrain-local-node/scaletrain-local-node is not authorized to perform: " \
               "ssm:PutParameter" in said[node], said[node]
    for node, text in said.items():
        assert "not authorized to perform: secretsmanager:GetSecretValue" in text, (node, text)
    secrets.delete_secret(SecretId=elses, ForceDeleteWithoutRecovery=True)
    unsigned = boto3.client("ssm", endpoint_url=rehearsal_services.endpoint(r["services"]), region_name="us-east-1",
                            aws_access_key_id="AKIAANYONE", aws_secret_access_key="anything")
    with pytest.raises(ClientError) as refused:
        unsigned.get_parameter(Name=parameter)
    assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    launcher = rehearsal_services.account(r["services"], "ssm", r["account_key"], r["account_secret"])
    assert launcher.get_parameter(Name=parameter)["Parameter"]["Value"] == "2099-01-01T00:00:00Z"
    launcher.delete_parameter(Name=parameter)  # the other tests' teardown reads it: as the cluster was


def test_each_node_ran_the_stacks_own_user_data_for_its_role(home):
    """The user data each node ran is what the synthesized stack gives that role's launch template (infra/boot.py),
    the tokens resolved, apart from the named values: the storage's mount line, the health check's arguments, the
    cgroup plugin on this machine and the Slurm release of the root (Debian's 22.05; the image's 23.11)."""
    from infra import boot
    from launcher.plans import rehearsal as plan
    from launcher.plans import slurm

    state = cluster_state(home)
    r = state["rehearsal"]
    seed = "var/lib/cloud/seed/nocloud/user-data"
    ran = {n: (home / "clusters/local/nodes" / n / "upper" / seed).read_text() for n in ("head", "node0", "reducer0")}
    mount = plan.storage_mount(r["storage"])
    assert ran["head"] == boot.head_script(cluster_name="local", region=plan.REGION, secret_id=r["secret"],
                                           max_nodes=boot.max_nodes(workers=2, reducers=1), storage=mount,
                                           cgroup_plugin=slurm.REHEARSAL_CGROUP_PLUGIN,
                                           slurm_version=slurm.REHEARSAL_SLURM)
    for node, role in (("node0", "worker"), ("reducer0", "reducer")):
        cpus = node_cpus(home, node)
        health = slurm.health_check_argv(python=state["python"], backend="local", mpirun=state["mpirun"],
                                         shared_mount=plan.SHARED_MOUNT)
        assert ran[node] == boot.node_script(region=plan.REGION, secret_id=r["secret"],
                                             controller_addr=state["head"]["address"], role=role, cpus=cpus,
                                             health_check=health, storage=mount,
                                             slurm_version=slurm.REHEARSAL_SLURM)
    # and the stack's, for the same spec, differs from it in those values only (the AWS defaults)
    aws = boot.node_script(region=plan.REGION, secret_id=r["secret"], controller_addr=state["head"]["address"],
                           role="worker", cpus=cpus, health_check=health, storage=mount)
    differing = [ln for ln in aws.splitlines() if ln not in ran["node0"].splitlines()]
    unit = [ln for ln in slurm.units(boot.image_slurm())[slurm.SLURMD_UNIT].splitlines() if ln]
    assert differing and all(any(u in ln for u in unit) for ln in differing), differing  # the unit's text only


def test_each_node_is_an_instance_of_the_accounts_ec2(home):
    """describe-instances against the stand-in account sees the cluster as it would see the stack's: one running
    instance per node at its address, from the cluster's image, whose id is what the node's IMDS and cloud-init say
    and whose user data is what the node ran. A node replaced before this test left its predecessor terminated, so
    no name has two running instances."""
    import base64

    from launcher.local import rehearsal_services

    state = cluster_state(home)
    r = state["rehearsal"]
    ec2 = rehearsal_services.account(r["services"], "ec2", r["account_key"], r["account_secret"])
    found = ec2.describe_instances(Filters=[{"Name": "tag:scaletrain:cluster", "Values": ["local"]},
                                            {"Name": "instance-state-name", "Values": ["pending", "running"]}])
    running: dict[str, dict] = {}
    for i in (i for res in found["Reservations"] for i in res["Instances"]):
        name = {t["Key"]: t["Value"] for t in i["Tags"]}["Name"]
        assert name not in running, f"{name} has two running instances"
        running[name] = i
    nodes = {n["name"]: n["address"] for n in [*state["nodes"], state["head"]]}
    assert {n: i["PrivateIpAddress"] for n, i in running.items()} == nodes
    imds = ("t=$(curl -sf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token)"
            " && for p in instance-id ami-id mac; do curl -sf -H \"X-aws-ec2-metadata-token: $t\" "
            "http://169.254.169.254/latest/meta-data/$p; echo; done; cat /var/lib/cloud/data/instance-id")
    seed = "var/lib/cloud/seed/nocloud/user-data"
    for node in ("head", "node0", "reducer0"):
        said = launch(home, "ssh", "--cluster", "local", node, imds, check=True).stdout.split()
        inst = running[node]
        assert said == [inst["InstanceId"], inst["ImageId"], inst["NetworkInterfaces"][0]["MacAddress"],
                        inst["InstanceId"]], (node, said)
        data = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"], Attribute="userData")["UserData"]
        ran = (home / "clusters/local/nodes" / node / "upper" / seed).read_text()
        assert base64.b64decode(data["Value"]).decode() == ran


def test_a_rebooted_head_keeps_its_queue_and_a_running_job_goes_on(home):
    """EC2's reboot: every process of the head node ends, its disk stays, systemd boots it again, cloud-init does not
    run the user data again; the units bring munge and slurmctld back, with the queue (StateSaveLocation)."""
    ssh = ["ssh", "-F", str(home / "clusters/local/ssh_config"), "head"]
    submit = subprocess.run([*ssh, "sbatch --parsable -N1 --wrap 'sleep 25'; sbatch --parsable -N3 --wrap true"],
                            capture_output=True, text=True, timeout=60, check=True).stdout.split()
    running, queued = submit
    wait_for(lambda: launch(home, "jobs", "--cluster", "local").returncode == 0 and job(home, running)["state"]
             == "running", 60)
    boots = (home / "clusters/local/nodes/head/upper/var/log/cloud-init-output.log").read_text().count("finished at")
    launch(home, "local", "reboot", "head", check=True)
    wait_for(lambda: launch(home, "jobs", "--cluster", "local").returncode == 0, 60)
    assert job(home, running)["state"] == "running" and job(home, queued)["state"] == "queued"
    wait_for(lambda: job(home, running)["state"] == "succeeded", 120)
    wait_for(lambda: job(home, queued)["state"] == "succeeded", 120)
    again = (home / "clusters/local/nodes/head/upper/var/log/cloud-init-output.log").read_text()
    assert again.count("finished at") == boots + 1  # cloud-init ran at the boot, the user data did not
    assert again.count("Created symlink /etc/systemd/system/multi-user.target.wants/slurmctld.service") == 1
    # a worker's reboot: it rejoins and takes jobs again, the same instance (the keeper may see its processes end,
    # but replaces nothing: a replacement would be a new address)
    keeper, address = home / "clusters/local/keeper.log", cluster_state(home)["nodes"][1]["address"]
    mark = len(keeper.read_text())
    launch(home, "local", "reboot", "node1", check=True)
    wait_for(lambda: "idle" in subprocess.run([*ssh, "sinfo --noheader -n node1 -o %T"], capture_output=True,
                                              text=True, timeout=60).stdout, 90)
    assert cluster_state(home)["nodes"][1]["address"] == address and "node1 replaced:" not in keeper.read_text()[mark:]
    assert launch(home, "doctor", "--cluster", "local").returncode == 0
    # a node that is not there is one line, exit 2
    proc = launch(home, "local", "reboot", "node9")
    assert proc.returncode == 2 and "no node 'node9'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_run_outlives_its_launcher_and_a_lost_node(home):
    """The issue's "done when": SIGKILL the launcher and node1 after the first checkpoint; with no launcher, Slurm
    requeues the job, the keeper's replacement registers, the job resumes and finishes every epoch."""
    run = node_run("outlives")
    proc = launch_background(home, "train", "--data", SHARDS, "--epochs", "6", *TINY, "--max-restarts", "1",
                             "--output", run)
    job_id = submitted(proc)
    checkpoint = on_host(home, f"{run}/checkpoint-epoch000.pt")
    wait_for(lambda: checkpoint.exists(), 300, 0.2)
    proc.kill()
    proc.wait(10)
    before = cluster_state(home)["nodes"][1]["address"]
    killed_at = time.monotonic()
    launch(home, "local", "kill", "node1", check=True)
    output = on_host(home, f"{run}/slurm-{job_id}.out")

    def training_again():
        """the job's second attempt printed a step"""
        text = output.read_text()
        return "attempt 2" in text and "epoch " in text.split("attempt 2", 1)[1]

    try:
        wait_for(training_again, 300)
    except AssertionError:  # what the cluster says, for whoever reads a CI log
        config = str(home / "clusters/local/ssh_config")
        said = subprocess.run(["ssh", "-F", config, "head", "sinfo -N; sinfo -R; scontrol show job; "
                               "tail -n 30 /var/log/slurm/slurmctld.log"], capture_output=True, text=True, timeout=60)
        keeper = (home / "clusters/local/keeper.log").read_text()
        raise AssertionError(f"the job did not train again within 300 s\n{output.read_text()[-4000:]}\n"
                             f"{said.stdout}\n{keeper}") from None
    print(f"lost node to training again: {time.monotonic() - killed_at:.1f} s")

    def finished():
        """the job finished"""
        return job(home, job_id)["state"] in ("succeeded", "failed", "cancelled")

    wait_for(finished, 400, 2)
    done = job(home, job_id)
    assert done["state"] == "succeeded", output.read_text()[-3000:]
    assert done["restarts"] == 1 and done["output"] == run
    logs = launch(home, "logs", job_id, "--cluster", "local", check=True)
    assert any(ln.startswith("summary: resnet18 2 ranks, 6 epochs") for ln in logs.stdout.splitlines()), logs.stdout
    record = json.loads(on_host(home, f"{run}/restarts.json").read_text())
    assert record["history"][0]["lost"] == ["node1"] and record["history"][0]["resumed_from_epoch"] >= 1
    keeper = (home / "clusters/local/keeper.log").read_text()
    after = cluster_state(home)["nodes"][1]["address"]
    assert f"node1 replaced: {after}" in keeper and after != before  # a new instance, a new address


def test_a_batch_job_whose_node_is_lost_in_its_first_seconds_is_requeued_as_the_replacement_registers(home):
    """Slurm requeues a batch job missing from its batch node only at that node's registration, and spares one that
    started less than 20 s before (BatchStartTimeout + MessageTimeout, slurmctld's _purge_missing_jobs); the
    controller asks a node to register again only about every 400 s. A replacement registering under the lost
    node's name inside those 20 s requeues the job itself (plans/slurm_rejoin.lost_batch_requeue): before, the job
    stayed "running" on no instance for minutes (fresh clone: the lost-launcher test, node1 replaced 19 s after the
    job started)."""
    ssh = ["ssh", "-F", str(home / "clusters/local/ssh_config"), "head"]

    def on_head(command: str) -> str:
        return subprocess.run([*ssh, command], capture_output=True, text=True, timeout=60).stdout

    wait_for(lambda: on_head("sinfo --noheader -n node1 -o %T").strip() == "idle", 300)
    job_id = on_head("sbatch --parsable --requeue -N1 -w node1 --wrap 'sleep 600'").strip()
    assert job_id.isdigit(), job_id
    try:
        wait_for(lambda: "JobState=RUNNING" in on_head(f"scontrol show job {job_id}"), 60, 0.2)
        started = time.monotonic()
        launch(home, "local", "kill", "node1", check=True)
        replaced = home / "clusters/local/nodes/node1/upper/var/log/cloud-init-output.log"
        try:
            wait_for(lambda: "Restarts=1" in on_head(f"scontrol show job {job_id}"), 90)
        except AssertionError:
            raise AssertionError(f"job {job_id} not requeued within 90 s of node1's loss\n"
                                 + on_head(f"scontrol show job {job_id}; sinfo -N; tail -n 20 "
                                           "/var/log/slurm/slurmctld.log")
                                 + (home / "clusters/local/keeper.log").read_text()
                                 + "\n".join(replaced.read_text().splitlines()[-15:])) from None
        print(f"lost in its first seconds, requeued {time.monotonic() - started:.1f} s after the job started")
        assert f"requeueing job {job_id}: its batch script was on the instance this one replaces" in \
            replaced.read_text()
    finally:
        on_head(f"scancel {job_id}")


def test_ctrl_c_detaches_and_a_second_run_queues_behind_the_first(home):
    first = launch_background(home, "train", "--data", SHARDS, "--epochs", "30", *TINY, "--output",
                              node_run("first"))
    first_id = submitted(first)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 130, out + err
    assert f"detached from job {first_id}" in out and f"launch cancel {first_id}" in out
    assert "Traceback" not in err and "error:" not in err  # detaching is not a failure
    second = launch_background(home, "train", "--data", SHARDS, "--epochs", "1", *TINY, "--output",
                               node_run("second"))
    second_id = submitted(second)
    second.send_signal(signal.SIGINT)
    second.communicate(timeout=60)
    running = job(home, first_id)
    assert running["state"] == "running", on_host(home, running["stdout"]).read_text()[-3000:]
    queued = job(home, second_id)
    assert queued["state"] == "queued", queued
    cancelled = launch(home, "cancel", first_id, "--cluster", "local", check=True)
    assert f"job {first_id}" in cancelled.stdout and "cancelled" in cancelled.stdout
    wait_for(lambda: job(home, first_id)["state"] == "cancelled", 120)
    again = launch(home, "cancel", first_id, "--cluster", "local")
    assert_one_line_error(again, f"job {first_id} has already finished (cancelled)")
    wait_for(lambda: job(home, second_id)["state"] == "succeeded", 300, 2)


def test_a_node_held_to_30_percent_of_its_cpu_is_named_a_straggler_with_its_phase(home):
    """node1 held to 30% of one CPU (launch local fault --cpu 0.3 on a node of one vCPU): the job's step names it
    from the ranks' recorded phases, in the run's output, in `launch logs` and in the run directory's
    stragglers.json; node0 is never named."""
    # --cpu is a share of the node's vCPUs, and a rank runs one torch thread a vCPU (OMP_NUM_THREADS). Nodes share
    # the machine's cores, so on a machine of 8 cores each node has 2 or more, and a rank of this tiny model keeps
    # barely more than one of them busy: 30% of 2+ vCPUs hardly slowed it (CI: node1 at 1.3x, unnamed). Held to 30%
    # of one vCPU, node1's rank is at least 3x slower than node0's whatever the machine.
    cpus = node_cpus(home, "node1")
    launch(home, "local", "fault", "node1", "--cpu", f"{0.3 / cpus:.4f}", check=True)
    throttled = ""
    try:
        run = node_run("straggler")
        # 12 steps an epoch (batch 4 a rank), more than the detector's window of 8: each epoch's first step is slow
        # on every node (loader workers start, rank 0 writes a checkpoint) and the detector tolerates one such step
        # a window; with 6 steps an epoch every window held two, and one jittery step more left node1 unnamed (CI,
        # 1 run in 4). A real epoch has thousands of steps.
        at = TINY.index("--batch-per-gpu")
        small = [*TINY[:at], "--batch-per-gpu", "4", *TINY[at + 2:]]
        proc = launch(home, "train", "--data", SHARDS, "--epochs", "3", *small, "--output", run)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        throttled = cpu_stat(home, "node1")
    finally:
        launch(home, "local", "fault", "node1", "--clear", check=True)
    # node1's rank is whichever the hostfile gave it: Slurm lists dynamic nodes in registration order
    ranks = [int(p.name.split("@")[0][5:]) for p in on_host(home, f"{run}/progress").iterdir()
             if p.name.endswith("@node1.tsv")]
    named = [ln for ln in proc.stdout.splitlines() if "straggler:" in ln]
    assert len(ranks) == 1 and len(named) == 1, (proc.stdout[-3000:] + local_times(on_host(home, f"{run}/progress"))
                                                 + f"node1: {cpus} vCPU(s), its quota's cpu.stat: {throttled}")
    assert f"straggler: node1 (rank {ranks[0]}) is " in named[0], named
    assert re.search(r"slower than the other nodes in (forward \(compute\)|waiting for data) since step \d+$",
                     named[0]), named
    kept = json.loads(on_host(home, f"{run}/stragglers.json").read_text())["stragglers"]
    assert [(k["node"], k["ranks"]) for k in kept] == [("node1", ranks)] and kept[0]["ratio"] > 1.5
    job_id = next(j["id"] for j in jobs(home) if j["output"] == run)
    assert named[0] in launch(home, "logs", job_id, "--cluster", "local", check=True).stdout
    listed = next(j for j in jobs(home) if j["id"] == job_id)["stragglers"]  # launch jobs reads the same record
    assert [(s["node"], s["ranks"], s["phase"]) for s in listed] == [(k["node"], k["ranks"], k["phase"]) for k in kept]


def cpu_stat(home: Path, node: str) -> str:
    """The node's CPU quota cgroup's cpu.stat (nr_periods, nr_throttled, throttled_time), for a failure's message."""
    from launcher.local import faults

    netns = cluster_state(home)["rehearsal"]["netns"][node]
    cg = faults._cpu_cgroup(netns)
    try:
        return " ".join((cg / "cpu.stat").read_text().split()) if cg else "no cpu controller"
    except OSError as e:
        return f"unreadable ({e.strerror})"


def local_times(progress: Path) -> str:
    """Each rank's last steps' local time (data + forward, what plans/stragglers.py compares), for a failure's
    message."""
    from launcher.plans import stragglers

    lines = []
    for p in sorted(progress.iterdir()) if progress.is_dir() else []:
        times = [t for t in map(stragglers.parse, p.read_text().splitlines()) if t][-12:]
        lines.append(f"{p.name}: " + " ".join(f"{t.step}:{t.local:.2f}" for t in times))
    return "\n".join(lines)


def test_a_straggler_drained_mid_run_is_replaced_and_the_run_finishes_every_epoch(home):
    """The issue's "done when": node1 throttled mid-run is named a straggler with its phase within the default
    window; with --on-straggler drain the job's step drains it with that reason, stops the run and requeues the job;
    the keeper replaces the drained node (as its Auto Scaling group would, marked Unhealthy by its health check on
    AWS) and the run resumes there from its newest checkpoint and finishes every epoch.

    Throttled to 15% of its CPU, not the issue's 30%: this machine's 2 cores are shared (other tests, load average
    4), and a node held to 30% is then barely slower than one that gets what the load leaves it (the first run here:
    not named in 36 steps). The 30% case, on a quieter start, is the test above."""
    from launcher.plans import draining, stragglers

    config = str(home / "clusters/local/ssh_config")

    def nodes_state() -> str:
        return subprocess.run(["ssh", "-F", config, "head", "sinfo -h -N -o '%N %t'; squeue -h"],
                              capture_output=True, text=True, timeout=60).stdout

    # The tests before leave their jobs completing: the run needs both workers idle to start at once.
    wait_for(lambda: all(f"{n} idle" in nodes_state() for n in ("node0", "node1")), 300)
    before = cluster_state(home)["nodes"][1]
    assert before["name"] == "node1"
    run = node_run("drained")
    proc = launch_background(home, "train", "--data", SHARDS, "--epochs", "6", *TINY, "--max-restarts", "1",
                             "--on-straggler", "drain", "--output", run)
    try:
        job_id = submitted(proc)
        output = on_host(home, f"{run}/slurm-{job_id}.out")
        progress = on_host(home, f"{run}/progress")

        def steps() -> int:
            """the step both ranks have recorded (-1 before any)"""
            files = list(progress.iterdir()) if progress.is_dir() else []
            done = [max((t.step for t in map(stragglers.parse, p.read_text().splitlines()) if t), default=-1)
                    for p in files]
            return min(done) if len(done) == 2 else -1

        wait_for(lambda: steps() >= 2, 300, 0.2)   # mid-run: past the first steps' start-up
        throttled_at = steps()
        # 15% of one vCPU whatever the node has (see the 30% test: a share of a node of several barely slows it)
        cpus = node_cpus(home, "node1")
        launch(home, "local", "fault", "node1", "--cpu", f"{0.15 / cpus:.4f}", check=True)
        in_force_at = steps()  # the command's own start-up, on cores the ranks keep busy, may take steps
        try:
            wait_for(lambda: "requeueing job" in output.read_text(), 300)
        except AssertionError:
            raise AssertionError(output.read_text()[-3000:] + "\n" + nodes_state() + "\n" + local_times(progress)) \
                from None
    finally:  # the keeper may be replacing node1 already (a fresh node has no drill in force): no check
        launch(home, "local", "fault", "node1", "--clear")
    out, err = proc.communicate(timeout=900)
    text = output.read_text()
    assert proc.returncode == 0 and "run finished" in out, out[-4000:] + err[-2000:] + text[-3000:]
    first, second = text.split("attempt 2", 1)
    drained = re.search(r"\[job\] straggler: draining node1 \((scaletrain straggler: node1 ([\d.]+)x slower than the "
                        r"other nodes in (forward \(compute\)|waiting for data) since step (\d+))\)", first)
    assert drained, first[-3000:]
    reason, ratio, since = drained.group(1), float(drained.group(2)), int(drained.group(4))
    # the reason gives the ratio to one decimal: a node named at 1.52x reads 1.5x, so the figure read back is at
    # least the factor (the rule itself, over it, is plans/stragglers' and tested there at its boundary)
    assert ratio >= stragglers.FACTOR and not re.search(r"straggler: (draining )?node0", text), text[-3000:]
    # Named within the default window of the throttle: the window's first step is the throttle's, or the one before
    # (one step of the window may fall under the factor), and not later than a window after it was in force.
    assert throttled_at - 1 <= since <= in_force_at + stragglers.WINDOW, (throttled_at, in_force_at, since)
    assert f"[job] requeueing job {job_id} (restart 1 of 1) without node1" in first
    assert "epoch " in second, second[-3000:]   # trained again, on node1's replacement
    record = json.loads(on_host(home, f"{run}/restarts.json").read_text())
    assert [(h["lost"], h["why"]) for h in record["history"]] == [(["node1"], reason)]
    done = job(home, job_id)
    assert done["state"] == "succeeded" and done["restarts"] == 1, done
    logs = launch(home, "logs", job_id, "--cluster", "local", check=True).stdout
    assert any(ln.startswith("summary: resnet18 2 ranks, 6 epochs") for ln in logs.splitlines()), logs[-3000:]
    keeper = (home / "clusters/local/keeper.log").read_text()
    after = cluster_state(home)["nodes"][1]["address"]
    assert f"node1 is drained ({draining.REASON_PREFIX}node1 " in keeper and f"node1 replaced: {after}" in keeper
    assert after != before["address"]  # a new instance
    print(f"throttled at step {throttled_at} (in force by {in_force_at}), named since step {since} at {ratio}x; "
          + " ".join(ln for ln in first.splitlines() if "drained; stopping" in ln))


def test_a_frozen_nodes_ranks_are_located_with_every_ranks_stack_before_the_job_stops(home):
    """A node frozen mid-run (launch local fault --freeze): nothing moves for --stall-timeout, and before the job's
    step stops the run it takes each rank's stack (py-spy, over srun --overlap) and says where each group is: the
    other node's rank in the collective that waits, the frozen node's with no stack (it answers nothing). The node
    frozen is the one the job's step does not run on (the batch host, whichever Slurm listed first): the step is
    what watches."""
    from launcher.plans import restarts

    run = node_run("frozen")
    # A line every step, so that only the freeze stalls the run; the stall timeout well inside SlurmdTimeout (60 s),
    # after which Slurm itself takes the frozen node for dead and ends the job.
    proc = launch_background(home, "train", "--data", SHARDS, "--epochs", "40", *TINY, "--output", run,
                             "--stall-timeout", "20", "--", "--log-every", "1")
    frozen = None
    try:
        job_id = submitted(proc)
        progress = on_host(home, f"{run}/progress")
        wait_for(lambda: progress.is_dir() and len([p for p in progress.iterdir() if p.stat().st_size]) == 2, 300)
        batch_host = on_host(home, f"{run}/{restarts.BATCH_HOST_FILE}").read_text().split()[0]
        frozen = "node1" if batch_host == "node0" else "node0"
        launch(home, "local", "fault", frozen, "--freeze", check=True)
        out, err = proc.communicate(timeout=600)
    finally:
        if frozen:
            launch(home, "local", "fault", frozen, "--clear", check=True)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0 and "--stall-timeout" in out, out[-3000:] + err[-2000:]
    said = [ln for ln in out.splitlines() if re.match(r"\[job\] ranks? \d", ln)]
    waiting = [m for ln in said if (m := re.match(rf"\[job\] rank (\d) on {batch_host}: in allreduce: (\S+) ", ln))]
    assert waiting, out[-3000:]
    assert any(re.match(rf"\[job\] rank \d on {frozen}: no stack ", ln) for ln in said), out[-3000:]
    stacks = on_host(home, f"{run}/stacks/attempt-1")
    assert (stacks / "summary.txt").read_text().splitlines() == [ln[len("[job] "):] for ln in said]
    rank, frame = waiting[0].groups()  # the frame the line names is in that rank's stack as py-spy dumped it
    assert f"    {frame} (" in (stacks / f"rank-{rank}.txt").read_text(), list(stacks.iterdir())
    wait_for(lambda: job(home, job_id)["state"] in ("failed", "cancelled"), 120)


def test_a_node_with_a_shaped_link_is_refused_before_the_first_step_and_the_job_runs_on_its_replacement(home):
    """The issue's "done when": node1's link shaped to 5 Mbit/s (launch local fault --net) before the job starts. The
    job's step measures the ring of pairs over its three nodes (node0, node1, reducer0) before the first step, names
    node1 with its figure and the expected one, drains it with that reason and requeues the job; node1 replaced (as
    an Auto Scaling group replaces an unhealthy instance: the keeper replaces a node drained with the node check's
    reason), the job runs on the others and the replacement."""
    from launcher.plans import nodecheck

    config = str(home / "clusters/local/ssh_config")

    def nodes_state() -> str:
        return subprocess.run(["ssh", "-F", config, "head", "sinfo -h -N -o '%N %t'; squeue -h"],
                              capture_output=True, text=True, timeout=60).stdout

    # The tests before leave their jobs completing and a frozen node catching up: the check needs all three idle.
    wait_for(lambda: all(f"{n} idle" in nodes_state() for n in ("node0", "node1", "reducer0")), 300)
    run = node_run("shaped")
    launch(home, "local", "fault", "node1", "--net", "5mbit", check=True)
    proc = launch_background(home, "train", "--data", SHARDS, "--epochs", "1", *TINY, "--reducers", "1",
                             "--max-restarts", "1", "--output", run)
    try:
        job_id = submitted(proc)
        output = on_host(home, f"{run}/slurm-{job_id}.out")
        try:
            wait_for(lambda: output.exists() and "requeueing job" in output.read_text(), 300)
        except AssertionError:
            raise AssertionError((output.read_text()[-3000:] if output.exists() else "no output yet") + "\n"
                                 + nodes_state()) from None
        text = output.read_text()
        assert "epoch " not in text.split("requeueing job", 1)[0], text[-3000:]   # before the first step
        refused = re.search(r"\[job\] node check: node1 refused: measured ([\d.,]+) Mbit/s, expected 1.00 Gbit/s "
                            r"\(at least 500.0 Mbit/s\)", text)
        assert refused and float(refused.group(1).replace(",", "")) < 50, text[-3000:]
        assert not re.search(r"node check: (node0|reducer0) refused", text), text[-3000:]
        took = re.search(r"\[job\] node check: ([\d.]+) s", text)
        print(f"node check on 3 nodes: {took.group(1)} s")
        # Drained with that reason, which the keeper reads to replace it (the record itself returns to service as
        # the replacement registers, maybe before this looks).
        keeper = home / "clusters/local/keeper.log"
        mark = f"node1 is drained ({nodecheck.REASON_PREFIX}"
        wait_for(lambda: mark in keeper.read_text(), 120)
        drained = next(ln for ln in keeper.read_text().splitlines() if mark in ln)
        assert f"{refused.group(1)} Mbit/s to and from its neighbours" in drained, drained
    finally:  # the keeper may be replacing node1 already (a fresh node has no drill in force): no check
        launch(home, "local", "fault", "node1", "--clear")
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0 and "run finished" in out, out[-4000:] + err[-2000:]
    text = output.read_text()
    assert "attempt 2" in text and "node check: every node at least" in text.split("attempt 2", 1)[1], text[-3000:]
    print(f"node check on 3 healthy nodes: {re.findall(r'node check: ([0-9.]+) s', text)[-1]} s")
    record = json.loads(on_host(home, f"{run}/restarts.json").read_text())
    assert record["history"][0]["lost"] == ["node1"] and record["history"][0]["why"].startswith(
        nodecheck.REASON_PREFIX)
    assert "node1 replaced: " in keeper.read_text().split(mark, 1)[1]  # by the keeper, as its group would


def test_a_run_stops_at_its_max_cost_with_a_checkpoint_and_resume_continues_from_it(home):
    """The issue's "done when" for --max-cost: a cap a minute of the cluster's price beyond what it has cost since it
    came up (priced as the same shape on AWS). The job's step warns, then asks the trainer to stop: the ranks write a
    checkpoint and end, the job ends with one line saying what it spent and Slurm does not requeue it; `launch logs`
    shows the line; `launch train --resume` continues from that checkpoint (and stops at its own cap again)."""
    from launcher.cluster import Cluster
    from launcher.execute import budget as spend
    from launcher.plans import budget

    c = Cluster.model_validate(cluster_state(home))
    rate = budget.total(budget.hourly(c))

    def cap_in(seconds: float) -> str:
        return f"{budget.spent(rate, time.time() - spend.came_up(c)) + rate * seconds / 3600:.4f}"

    run = node_run("budget")
    # Epochs enough that neither run can finish inside its minute: at 43 img/s (this machine on a quiet day) the
    # first stopped at epoch 25 of 40 and the resume finished the other 14 in 32 s, never reaching its cap.
    epochs = "1000"
    proc = launch(home, "train", "--data", SHARDS, "--epochs", epochs, *TINY, "--max-cost", cap_in(60), "--output", run)
    said = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and said, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "stopped at the budget: the cluster has cost $" in said[-1] and "--resume continues from it" in said[-1]
    assert "budget: $" in proc.stdout and "spent since cluster 'local' came up" in proc.stdout  # said at submission
    job_id = next(j["id"] for j in jobs(home) if j["output"] == run)
    ended = job(home, job_id)
    assert ended["state"] == "failed" and ended["restarts"] == 0, ended  # a deliberate stop: never requeued
    assert ended["budget"]["state"] == "stopped" and ended["budget"]["spent_usd"] >= ended["budget"]["cap_usd"]
    listed = launch(home, "jobs", "--cluster", "local", check=True).stdout
    assert re.search(rf"{job_id} .* failed \(stopped at --max-cost \$[\d.,]+\)", listed), listed
    logs = launch(home, "logs", job_id, "--cluster", "local", check=True).stdout
    stop = [ln for ln in logs.splitlines() if ln.startswith("error: stopped at the budget")]
    assert len(stop) == 1 and stop[0][len("error: "):] in said[-1], logs[-3000:]
    assert re.search(r"\[job\] budget: \$[\d.,]+ of --max-cost \$[\d.,]+ spent \(\d+%\)", logs), logs[-3000:]
    kept = re.search(r"checkpoint (checkpoint-epoch\d+(-step\d+)?\.pt) written", stop[0]).group(1)
    assert on_host(home, f"{run}/{kept}").exists()
    assert re.search(r"stopped after step \d+ \(epoch \d+\): budget reached", logs), logs[-3000:]
    assert json.loads(on_host(home, f"{run}/budget.json").read_text())["state"] == "stopped"
    status = launch(home, "status", "--cluster", "local").stdout  # spent against the cap
    assert re.search(rf"budget of job {job_id} \(failed\): \$[\d.,]+ of --max-cost \$[\d.,]+ spent \(1\d\d%\), "
                     r"stopped at the cap", status), status[-2000:]
    assert "cost so far as --max-cost counts it: $" in status and "priced as the same shape on AWS" in status

    again = launch(home, "train", "--data", SHARDS, "--epochs", epochs, *TINY, "--resume", "--max-cost", cap_in(60),
                   "--output", run)
    assert again.returncode == 1 and f"resuming from {kept}: " in again.stdout, again.stdout[-3000:]
    newer = re.search(r"checkpoint (checkpoint-epoch\d+(-step\d+)?\.pt) written", again.stderr).group(1)
    from training.checkpoint import name_order

    assert name_order(newer) > name_order(kept)  # it trained on from the checkpoint, and stopped at its cap again


def test_unknown_job_and_bad_ids_are_one_line(home):
    assert_one_line_error(launch(home, "logs", "9999", "--cluster", "local"), "no job 9999")
    bad = launch(home, "cancel", "abc", "--cluster", "local")
    assert_one_line_error(bad, "ID must be a job id as `launch jobs` lists them", "got 'abc'")
    assert bad.returncode == 2  # a usage error, said before the head node is asked


def test_a_failure_the_trainer_names_is_not_requeued(home):
    run = node_run("bad-data")
    proc = launch(home, "train", "--data", "/fsx/scaletrain/nothing-here", "--epochs", "1", *TINY, "--output", run)
    assert_one_line_error(proc, "no manifest.json in /fsx/scaletrain/nothing-here")
    # The trainer itself refuses an option at start: the job fails with its line, once.
    proc = launch(home, "train", "--data", SHARDS, "--epochs", "1", *TINY, "--max-restarts", "2", "--output",
                  node_run("bad-option"), "--", "--log-every", "0")
    assert_one_line_error(proc, "failed", "--log-every must be >= 1, got 0", "not retried")
    failed = [j for j in jobs(home) if j["output"] == node_run("bad-option")]
    assert failed and failed[0]["state"] == "failed" and failed[0]["restarts"] == 0, failed


@pytest.mark.parametrize("engine", ["ddp", "reducer"])
def test_ddp_and_reducer_runs_are_slurm_jobs_too(home, engine):
    """--engine ddp and --reducers 1: the rendezvous is the allocation's first node, exported by the job's step; the
    reducer tier's allocation holds the reducer node too, and the step names it in the MPMD line."""
    run = node_run(engine)
    how = ["--engine", "ddp"] if engine == "ddp" else ["--reducers", "1"]
    proc = launch(home, "train", "--data", SHARDS, "--epochs", "1", *TINY, *how, "--output", run)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "job " in proc.stdout and "run finished: resnet18 on 2 node(s) / 2 rank(s)" in proc.stdout, proc.stdout
    batch = on_host(home, f"{run}/job.sbatch").read_text()
    assert "--rendezvous-port 29500" in batch and "-x MASTER_ADDR " in batch
    # the workers in the allocation's order (the order the nodes registered: they boot at once; mpirun lays ranks out
    # in it under Slurm, so the rendezvous is its first node), the reducer last
    hostfile = on_host(home, f"{run}/hostfile").read_text().splitlines()
    assert sorted(hostfile[:2]) == ["node0 slots=1", "node1 slots=1"]
    assert hostfile[2:] == (["reducer0 slots=1"] if engine == "reducer" else [])


# A script written for torchrun that knows nothing of scaletrain: the torchrun variables and a gloo all-reduce.
TORCHRUN_SCRIPT = """\
import os, socket, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env:// : MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
print(f"host={socket.gethostname()} rank={dist.get_rank()} world={dist.get_world_size()} "
      f"local={os.environ['LOCAL_RANK']}/{os.environ['LOCAL_WORLD_SIZE']} node={os.environ['NODE_RANK']} "
      f"sum={t.item():g} args={sys.argv[1:]}", flush=True)
dist.destroy_process_group()
"""


def test_a_torchrun_script_runs_unchanged_on_two_nodes(home, tmp_path):
    """The issue's "done when": `launch run --workdir . -- python script.py` from the script's directory: world size
    2 on two machines, each rank's output streamed; a second run sends only what changed."""
    work = tmp_path / "proj"
    (work / "data").mkdir(parents=True)
    (work / "script.py").write_text(TORCHRUN_SCRIPT)
    (work / "old.py").write_text("")
    (work / "data/big.bin").write_bytes(b"x" * 100_000)  # left out by the directory's own ignore file
    (work / ".scaletrainignore").write_text("data/\n")
    (work / "__pycache__").mkdir()
    (work / "__pycache__/script.cpython-311.pyc").write_bytes(b"\0")
    proc = launch(home, "run", "--cluster", "local", "--workdir", ".", "--", "python", "script.py", "--lr", "0.1",
                  cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 file(s) sent" in proc.stdout and "0 unchanged" in proc.stdout, proc.stdout
    ranks = sorted(ln for ln in proc.stdout.splitlines() if ln.startswith("[rank ") and "host=" in ln)
    # rank 0 on the allocation's first node, whichever registered first (the nodes boot at once)
    first, second = re.search(r"attempt 1 \(at most 1\), on (\w+), (\w+)", proc.stdout).groups()
    assert sorted([first, second]) == ["node0", "node1"], proc.stdout
    assert ranks == [f"[rank 0] host={first} rank=0 world=2 local=0/1 node=0 sum=3 args=['--lr', '0.1']",
                     f"[rank 1] host={second} rank=1 world=2 local=0/1 node=1 sum=3 args=['--lr', '0.1']"], proc.stdout
    job_id = next(ln.split()[1].rstrip(":") for ln in proc.stdout.splitlines() if ln.startswith("job "))
    listed = job(home, job_id)
    assert listed["state"] == "succeeded" and listed["name"] == "run-python", listed
    synced = next(ln for ln in proc.stdout.splitlines() if ln.startswith("synced "))
    copy = synced.split(" to ", 1)[1].split(":", 1)[0]
    assert not on_host(home, f"{copy}/data").exists() and not on_host(home, f"{copy}/__pycache__").exists()
    # Again, with one file changed and one gone: only those travel.
    (work / "script.py").write_text(TORCHRUN_SCRIPT.replace("flush=True", "flush=True)  # v2\nprint('v2'"))
    (work / "old.py").unlink()
    (work / "notes.txt").write_text("n")
    again = launch(home, "run", "--cluster", "local", "--workdir", str(work), "--", "python", "script.py", cwd=work)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"synced {work} to {copy}: 2 file(s) sent" in again.stdout, again.stdout
    assert "1 unchanged, 1 removed" in again.stdout and not on_host(home, f"{copy}/old.py").exists(), again.stdout
    assert sum(ln == "[rank 0] v2" or ln == "[rank 1] v2" for ln in again.stdout.splitlines()) == 2, again.stdout


def test_a_horovod_script_and_a_failing_command_under_launch_run(home, tmp_path):
    work = tmp_path / "hvd"
    work.mkdir()
    (work / "hvd_script.py").write_text(
        "import horovod.torch as hvd, torch\nhvd.init()\n"
        "s = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)\n"
        "print(f'hvd rank={hvd.rank()} size={hvd.size()} sum={s.item():g}', flush=True)\n")
    (work / "bad.py").write_text("import sys\nprint('about to fail', flush=True)\nsys.exit(4)\n")
    proc = launch(home, "run", "--cluster", "local", "--workdir", str(work), "--engine", "horovod", "--",
                  "python", "hvd_script.py")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] hvd rank=0 size=2 sum=2" in proc.stdout and "[rank 1] hvd rank=1 size=2 sum=2" in proc.stdout
    failed = launch(home, "run", "--cluster", "local", "--workdir", str(work), "--max-restarts", "1", "--",
                    "python", "bad.py")
    assert_one_line_error(failed, "failed", "exited with code 4", "not retried")
    assert "[rank 0] about to fail" in failed.stdout
    # A script on the project's engines (training.distributed), the reducer tier on the reducer node.
    (work / "tier.py").write_text(
        "import torch\nfrom training import distributed\ndistributed.init()\n"
        "net = torch.nn.Linear(4, 1)\nmodel, opt = distributed.wrap(net, torch.optim.SGD(net.parameters(), 0.1))\n"
        "g = distributed.allreduce(torch.tensor([float(distributed.rank() + 1)]), op='sum')\n"
        "print(f'{distributed.engine_name()} rank={distributed.rank()} size={distributed.size()} sum={g.item():g}')\n"
        "distributed.shutdown()\n")
    tier = launch(home, "run", "--cluster", "local", "--workdir", str(work), "--reducers", "1", "--",
                  "python", "tier.py")
    assert tier.returncode == 0, tier.stdout + tier.stderr
    assert "1 reducer node(s)" in tier.stdout, tier.stdout
    on = re.search(r"attempt 1 \(at most 1\), on (.*)", tier.stdout).group(1)
    assert sorted(on.split(", ")) == ["node0", "node1", "reducer0"], tier.stdout
    assert "[rank 0] reducer rank=0 size=2 sum=3" in tier.stdout, tier.stdout
    assert "[rank 1] reducer rank=1 size=2 sum=3" in tier.stdout, tier.stdout
    for args, said in ((["--procs-per-node", "2"], "--procs-per-node 2 is more than the 1 vCPU(s) of node0"),
                       (["--workdir", str(work / "nope")], "--workdir must be a directory"),
                       ([], "needs a command after --")):
        assert_one_line_error(launch(home, "run", "--cluster", "local", *args, *(["--", "true"] if args else [])),
                              said)



def test_the_bert_example_trains_through_launch_run_with_each_engine(home):
    """examples/bert/pretrain.py from its own directory: training.distributed takes the engine `launch run` names
    (SCALETRAIN_ENGINE), 2 ranks on two machines, the reducer tier on the reducer node, the loss falling
    (docs/your-code.md)."""
    for engine in ("ddp", "horovod", "reducer"):
        how = ["--reducers", "1"] if engine == "reducer" else ["--engine", engine]
        proc = launch(home, "run", "--cluster", "local", "--workdir", str(ROOT / "examples" / "bert"), *how,
                      "--", "python", "pretrain.py", "--steps", "20", "--log-every", "10")
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert f"[rank 0] pretraining BERT-tiny (0.2M parameters) on 2 rank(s) ({engine})" in proc.stdout, proc.stdout
        first, last = map(float, re.search(rf"^\[rank 0\] summary: BERT-tiny 2 ranks \({engine}\), loss ([\d.]+) -> "
                                           rf"([\d.]+)", proc.stdout, flags=re.M).groups())
        assert last < first - 0.3, proc.stdout


def test_a_node_that_fails_its_health_check_drains_itself_and_a_replacement_returns(home):
    """The doctor's node checks as Slurm's HealthCheckProgram: run here as slurmd runs it. node1 loses its shared
    storage, drains itself with the reason; a replacement instance returns to service as it registers."""
    from launcher.plans import slurm

    config = str(home / "clusters/local/ssh_config")

    def on(node: str, command: str) -> subprocess.CompletedProcess:
        return subprocess.run(["ssh", "-F", config, node, command], capture_output=True, text=True, timeout=300)

    def state(node: str) -> str:
        return on("head", f"sinfo --noheader -n {node} -o %T").stdout.strip()

    def settled():
        """the earlier tests' jobs have left node1"""
        return state("node1") == "idle"

    try:
        wait_for(settled, 120)
    except AssertionError:
        raise AssertionError(on("head", "squeue; sinfo -N; scontrol show job").stdout) from None
    well = on("node1", slurm.HEALTH_CHECK)
    assert well.returncode == 0 and state("node1") == "idle", well.stdout + well.stderr
    broken = on("node1", f"umount -l /fsx && {slurm.HEALTH_CHECK}")
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert broken.stdout.startswith("scaletrain health: shared storage: nothing mounted at /fsx")
    assert state("node1") == "drained"
    reasons = on("head", "sinfo -R --noheader -o '%n|%E'").stdout
    assert "node1|scaletrain health: shared storage" in reasons, reasons
    before = cluster_state(home)["nodes"][1]["address"]
    launch(home, "local", "kill", "node1", check=True)  # as an Auto Scaling group replaces an unhealthy instance
    # back in service as its user data resumes it, and reachable once the keeper has recorded the new instance
    wait_for(lambda: state("node1") == "idle" and cluster_state(home)["nodes"][1]["address"] != before, 120)
    again = on("node1", slurm.HEALTH_CHECK)
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_controller_that_does_not_answer_is_one_line(home):
    ssh = ["ssh", "-F", str(home / "clusters/local/ssh_config"), "head"]
    subprocess.run([*ssh, "systemctl stop slurmctld"], check=True, capture_output=True, timeout=60)
    try:
        assert_one_line_error(launch(home, "jobs", "--cluster", "local"), "does not answer")
        assert_one_line_error(launch(home, "logs", "1", "--cluster", "local"), "does not answer")
    finally:  # the controller's state (StateSaveLocation) brings the jobs back
        subprocess.run([*ssh, "systemctl start slurmctld"], check=True, capture_output=True, timeout=60)
    wait_for(lambda: launch(home, "jobs", "--cluster", "local").returncode == 0, 60)
    assert any(j["state"] == "succeeded" for j in jobs(home))


def test_teardown_is_the_clusters_own_when_the_job_ends(home):
    """Last in the module: --teardown's job ends, its epilog on the head node moves the cluster's TTL parameter to
    now in the account (the stack's own epilog, its SSM call reaching the moto server), and the keeper takes the
    cluster down with no launcher involved (the launcher only says so)."""
    state = cluster_state(home)
    keeper = json.loads((home / "clusters/local/rehearsal.json").read_text())["keeper"]
    proc = launch(home, "train", "--data", SHARDS, "--epochs", "1", *TINY, "--teardown", "--output",
                  node_run("teardown"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    assert "takes itself down" in proc.stdout and "run finished" in proc.stdout
    # Its record came to this machine before the cluster went (as after any followed run).
    assert json.loads((home / "runs/local/teardown/summary.json").read_text())["epochs"] == 1
    wait_for(lambda: not (home / "clusters/local").exists(), 120)
    wait_for(lambda: not alive(keeper), 30)  # it exits once the cluster is down (a zombie counts as gone)
    netns = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
    assert not netns & set(state["rehearsal"]["netns"].values())
    assert not any(n.endswith(("-services", "-storage")) and state["rehearsal"]["bridge"][2:7] in n for n in netns)
    from launcher.local import rehearsal_nodes

    assert not any((rehearsal_nodes.cgroup_root() / "scaletrain" / ns).exists()
                   for ns in state["rehearsal"]["netns"].values())
