"""The Slurm head node of an AWS stack, as the launcher sees it: discovery (the HeadNode output, the instance tagged
scaletrain:role=head), access (the SSM ssh_config, the pinned host key, the launcher's key over SSM), readiness
(SSM and cloud-init, no GPU), the head node's storage mount, and the decisions of whether a run is a Slurm job and
who ends the stack after --teardown. Pure functions without AWS; the rest against moto (tests/test_aws_moto.py's
stack, with a head node).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import test_aws_moto as moto_stack
from test_aws_moto import RECORDED, deploy, fake_time, live_instances
from test_aws_plans import instances, outputs

from infra import catalog
from launcher import cluster as clusters
from launcher.cluster.aws import api as aws
from launcher.cluster.aws import discover, lifecycle, readiness
from launcher.errors import LaunchError
from launcher.execute import awsrun
from launcher.plans import storage

HEAD_ID = "i-0123456789abcdef0"
env, ssm_agents = moto_stack.env, moto_stack.ssm_agents  # the fixtures: moto's in-process AWS, SSM's agents


def head_instance(state: str = "running", iid: str = HEAD_ID, ip: str | None = "10.0.0.5") -> discover.Instance:
    return discover.Instance(instance_id=iid, state=state, private_ip=ip, instance_type="m5.large", role="head",
                             group_name=None, launch_time="2026-11-17T08:55:00Z", image_id="ami-0abc")


def with_head(storage_kind: str = "fsx", **head) -> discover.StackOutputs:
    return outputs("p4d.24xlarge", storage_kind=storage_kind).model_copy(update={"head": discover.HeadNode(
        **({"instance_id": HEAD_ID, "private_ip": "10.0.0.5"} | head))})


def build(out: discover.StackOutputs, found: list[discover.Instance]) -> clusters.Cluster:
    return discover.build_cluster(out, found, stack="c1", region="us-east-1", profile=None, ssh_config="/x/ssh_config",
                                  known_hosts="/x/known_hosts", software={})


# --- Discovery, pure ---------------------------------------------------------------------------------------------

def test_the_head_node_output_is_read_when_present_and_none_without_it():
    values = {"ClusterName": "c1", "InstanceType": "p4d.24xlarge", "NodeGroups": "[]", "Storage": "none",
              "StorageMount": "{}"}
    rows = [{"OutputKey": k, "OutputValue": v} for k, v in values.items()]
    assert discover.parse_outputs("c1", rows).head is None
    head = ('{"instance_id": "i-0123456789abcdef0", "private_ip": "10.0.0.5", "host_name": "ip-10-0-0-5", '
            '"instance_type": "m5.large", "slurmctld_port": 6817}')
    got = discover.parse_outputs("c1", [*rows, {"OutputKey": "HeadNode", "OutputValue": head}]).head
    assert got == discover.HeadNode(instance_id=HEAD_ID, private_ip="10.0.0.5", host_name="ip-10-0-0-5",
                                    instance_type="m5.large", slurmctld_port=6817)
    with pytest.raises(LaunchError, match="unreadable outputs"):
        discover.parse_outputs("c1", [*rows, {"OutputKey": "HeadNode", "OutputValue": '{"private_ip": "10.0.0.5"}'}])


def test_the_head_node_is_the_clusters_head_and_no_node():
    c = build(with_head(), [*instances("p4d.24xlarge", 4), head_instance()])
    assert c.head == clusters.Node(name="head", address="10.0.0.5", role="head", slots=0, cpus=2,
                                   workdir="/home/ubuntu/scaletrain", instance_id=HEAD_ID, instance_type="m5.large",
                                   launched_at="2026-11-17T08:55:00Z")
    # Named as without it: 10.0.0.5 sorts before every worker's address, and takes no node's name or slot.
    assert [(n.name, n.address) for n in c.nodes] == [
        ("node0", "10.0.0.9"), ("node1", "10.0.0.10"), ("node2", "10.0.0.33"), ("node3", "10.0.1.2")]
    assert c.machines == [*c.nodes, c.head] and HEAD_ID not in {n.instance_id for n in c.nodes}
    assert clusters.Cluster.model_validate_json(c.model_dump_json()) == c  # saved and loaded with it


def test_without_the_output_a_tagged_head_instance_is_not_the_head():
    """An older stack has no HeadNode output: no head, whatever is tagged; everything as before."""
    c = build(outputs("p4d.24xlarge"), [*instances("p4d.24xlarge", 2), head_instance()])
    assert c.head is None and c.machines == c.nodes and c.names() == ["node0", "node1"]


@pytest.mark.parametrize("state", ["pending", "running"])
def test_a_pending_or_running_head_instance_is_the_head(state):
    assert build(with_head(), [*instances("p4d.24xlarge", 2), head_instance(state)]).head.instance_id == HEAD_ID


@pytest.mark.parametrize("found", [[head_instance("stopped")], [head_instance(iid="i-0fffffffffffffff0")], []],
                         ids=["stopped", "another-instance", "gone"])
def test_a_head_node_output_without_its_live_instance_is_one_line(found):
    with pytest.raises(LaunchError) as e:
        build(with_head(), [*instances("p4d.24xlarge", 2), *found])
    assert str(e.value) == (f"stack 'c1' in us-east-1: its Slurm head node {HEAD_ID} (HeadNode output) is not running; "
                            f"start it if it is stopped (`aws ec2 start-instances --region us-east-1 --instance-ids "
                            f"{HEAD_ID}`), else delete the stack (`launch down --cluster c1`) and deploy it again")


def test_instances_of_every_role_are_read_and_the_head_is_never_an_undiscovered_node():
    tagged = [{"Instances": [{"InstanceId": f"i-{role}", "State": {"Name": "running"}, "PrivateIpAddress": "10.0.0.5",
                              "InstanceType": "m5.large", "LaunchTime": "2026-11-17T08:55:00Z",
                              "Tags": [{"Key": "scaletrain:role", "Value": role}]}]} for role in ("head", "other")]
    assert [i.role for i in discover.instances_from_response(tagged)] == ["head"]  # so teardown's check sees it
    assert lifecycle.undiscovered({"i-1"}, [("i-1", "worker", "running"), ("i-9", "head", "running")]) is None
    assert "i-9 (worker, running)" in lifecycle.undiscovered({"i-1"}, [("i-9", "worker", "running")])


# --- Readiness and storage, pure ----------------------------------------------------------------------------------

def test_the_head_node_is_waited_for_but_asked_no_gpu_or_efa():
    c = build(with_head(), [*instances("p4d.24xlarge", 2), head_instance()])
    expected = readiness.expected_devices(c)
    assert expected == {"node0": (8, 4), "node1": (8, 4), "head": (0, 0)}

    def facts(**kw):
        return readiness.NodeFacts(**({"name": "head", "state": "running", "agent_online": True, "ssh_ok": True,
                                       "cloud_init": "done", "gpus": 0, "efa": 0} | kw))

    assert readiness.verdict(facts(), gpus=0, efa=0).ready  # no GPU, no EFA device: ready
    assert readiness.verdict(facts(agent_online=False), gpus=0, efa=0).stage == "agent"
    assert readiness.verdict(facts(cloud_init="running"), gpus=0, efa=0).stage == "cloud-init"
    assert readiness.verdict(facts(cloud_init="error"), gpus=0, efa=0).stage == "cloud-init"


def test_the_head_node_mounts_fsx_as_the_nodes_do():
    c = build(with_head("fsx"), [*instances("p4d.24xlarge", 2), head_instance()])
    [phase] = storage.head_storage_plan(c, secret="s")
    assert list(phase.scripts) == ["head"]
    assert "mount -t lustre" in phase.scripts["head"] and " /fsx" in phase.scripts["head"]


@pytest.mark.parametrize("reducers", [0, 1])
def test_the_head_node_is_a_beegfs_client_and_runs_no_server(reducers):
    from launcher.plans import storage

    out = outputs("p4d.24xlarge", reducers=reducers).model_copy(update={"head": discover.HeadNode(
        instance_id=HEAD_ID, private_ip="10.0.0.5")})
    c = build(out, [*instances("p4d.24xlarge", 2, reducers), head_instance()])
    phases = storage.head_storage_plan(c, secret="s3cr3t")
    assert [(p.name, list(p.scripts)) for p in phases] == [("ramdisk and auth", ["head"]), ("clients", ["head"])]
    nodes = storage.storage_plan(c.aws.storage, c.workers, c.reducers, secret="s3cr3t")
    client = next(p for p in nodes if p.name == "clients").scripts["node1"]
    assert phases[1].scripts["head"] == client  # the nodes' client set-up, with the same management node
    assert "tmpfs" not in phases[0].scripts["head"] and "s3cr3t" in phases[0].scripts["head"]
    assert all("head" not in p.scripts for p in nodes)  # the nodes' own plan is unchanged


def test_no_head_node_or_no_storage_mounts_nothing_on_a_head():
    assert storage.head_storage_plan(build(outputs("p4d.24xlarge"), instances("p4d.24xlarge", 2)), secret="s") == []
    c = build(with_head("fsx"), [*instances("p4d.24xlarge", 2), head_instance()])
    bare = c.model_copy(update={"aws": c.aws.model_copy(update={"storage": {"type": "none"}})})
    assert storage.head_storage_plan(bare, secret="s") == []


# --- Which path a run takes, who ends the stack ------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["fsx", "beegfs"])
def test_a_stack_with_a_head_node_and_shared_storage_runs_a_slurm_job(kind):
    c = build(with_head(kind), [*instances("p4d.24xlarge", 2), head_instance()])
    assert lifecycle.run_path(c, engine="horovod", reducers=0) == lifecycle.RunPath(slurm=True)


def test_without_shared_storage_a_head_node_stack_runs_mpirun_and_says_why():
    c = build(with_head("beegfs"), [*instances("p4d.24xlarge", 2), head_instance()])
    bare = c.model_copy(update={"aws": c.aws.model_copy(update={"storage": {"type": "none"}})})
    path = lifecycle.run_path(bare, engine="horovod", reducers=0)
    assert not path.slurm and "`-c storage=fsx` or `-c storage=beegfs`" in path.note and "\n" not in path.note


def test_without_a_head_node_nothing_changes_and_nothing_is_said():
    c = build(outputs("p4d.24xlarge", storage_kind="fsx"), instances("p4d.24xlarge", 2))
    assert lifecycle.run_path(c, engine="horovod", reducers=0) == lifecycle.RunPath(slurm=False, note=None)


@pytest.mark.parametrize(("engine", "reducers"), [("horovod", 0), ("ddp", 0), ("reducer", 2)])
def test_every_engine_is_a_slurm_job(engine, reducers):
    c = build(with_head("fsx"), [*instances("p4d.24xlarge", 2), head_instance()])
    assert lifecycle.run_path(c, engine=engine, reducers=reducers) == lifecycle.RunPath(slurm=True)


def test_a_new_job_for_the_run_directory_is_found_and_older_ones_are_not():
    out = "/fsx/scaletrain/runs/r1"
    assert lifecycle.new_job(set(), [], out) is None
    assert lifecycle.new_job(set(), [("7", out)], out) == "7"
    assert lifecycle.new_job(set(), [("7", out + "/")], out) == "7"
    assert lifecycle.new_job({"7"}, [("7", out)], out) is None          # --resume: the earlier job of the same run
    assert lifecycle.new_job({"7"}, [("7", out), ("9", out)], out) == "9"
    assert lifecycle.new_job(set(), [("8", "/fsx/scaletrain/runs/r2"), ("9", None)], out) is None


# --- Against moto: discovery, access, readiness, keys -------------------------------------------------------------

def test_discovery_of_a_stack_with_a_head_node(env):
    deploy(workers=2, head=True)
    c = aws.discover_cluster(aws.session(), "c1", console=lambda iid: aws.access.host_keys_from_console(RECORDED))
    assert c.head is not None and c.head.role == "head" and c.head.instance_type == "m5.large"
    assert c.names() == ["node0", "node1"] and c.head.instance_id not in {n.instance_id for n in c.nodes}
    assert c.head.address and c.head.address not in {n.address for n in c.nodes}
    # The launcher reaches it as the nodes: through SSM, by instance id, its host key pinned from its console.
    config = Path(c.ssh_config).read_text()
    block = config[config.index("Host head"):]
    assert f"HostName {c.head.instance_id}" in block.splitlines()[1]
    assert "ProxyCommand" in config and "AWS-StartSSHSession" in config
    known = Path(c.known_hosts).read_text().splitlines()
    assert len(known) == 2 * 3 and sum(line.startswith(c.head.instance_id + " ") for line in known) == 2
    # The nodes' own files (what mpirun between nodes uses) do not list it; teardown's check would see it left over.
    assert "head" not in (Path(c.ssh_config).parent / "node_ssh_config").read_text().split()
    assert c.head.instance_id in live_instances()
    assert clusters.load("c1").head == c.head


def test_status_counts_the_head_nodes_cost_too(env):
    import datetime as dt

    deploy(workers=2, head=True)
    sess = aws.session()
    c = aws.discover_cluster(sess, "c1", console=lambda iid: [])
    launched = dt.datetime.fromisoformat(c.head.launched_at.replace("Z", "+00:00"))
    rows = aws.status(sess, c, launched + dt.timedelta(hours=2))
    assert [r.node for r in rows] == ["node0", "node1", "head"]
    assert rows[-1].state == "running"
    assert rows[-1].cost_usd == pytest.approx(2 * catalog.get("m5.large").price_usd_per_hour, rel=1e-2)


def test_discovery_of_a_stack_without_the_output_has_no_head(env):
    deploy(workers=2)
    c = aws.discover_cluster(aws.session(), "c1", console=lambda iid: [])
    assert c.head is None and c.names() == ["node0", "node1"]
    assert "Host head" not in Path(c.ssh_config).read_text()


def probe_by_role(asked):
    def probe(c, nodes):
        asked.append(sorted(n.name for n in nodes))
        return {n.name: (True, "cloud_init=done\ngpus=0\nefa=0\n" if n.role == "head" else
                         "cloud_init=done\ngpus=8\nefa=4\n", "") for n in nodes}
    return probe


def test_readiness_waits_for_the_head_nodes_agent(env):
    deploy(workers=2, head=True)
    sess = aws.session()
    head_id = aws.discover_cluster(sess, "c1", console=lambda iid: []).head.instance_id
    now, slept, clock, sleep = fake_time()
    with pytest.raises(LaunchError) as e:
        awsrun.connect_ready(sess, "c1", timeout_s=60, interval_s=30, console=lambda iid: [],
                             agent=lambda ids: set(ids) - {head_id}, probe=probe_by_role([]), clock=clock,
                             sleep=sleep, on_progress=None)
    assert str(e.value) == "1 of 3 node(s) not ready after 60 s: head (SSM agent not online yet)"


def test_readiness_waits_for_the_head_nodes_cloud_init_and_then_is_ready_with_no_gpu(env):
    deploy(workers=2, head=True)
    sess = aws.session()
    booting = [True]

    def probe(c, nodes):  # the head's boot (munge key, slurmctld) ends a round later than the nodes'
        answers = probe_by_role([])(c, nodes)
        if booting[0]:
            answers["head"] = (True, "cloud_init=running\ngpus=0\nefa=0\n", "")
            booting[0] = False
        return answers

    seen = []
    now, slept, clock, sleep = fake_time()
    c = awsrun.connect_ready(sess, "c1", timeout_s=600, interval_s=15, console=lambda iid: [],
                             agent=lambda ids: set(ids), probe=probe, clock=clock, sleep=sleep,
                             on_progress=lambda verdicts: seen.append({v.node: v.stage for v in verdicts}))
    assert seen == [{"node0": "ready", "node1": "ready", "head": "cloud-init"},
                    {"node0": "ready", "node1": "ready", "head": "ready"}]
    assert c.head is not None and slept == [15]


def test_the_launchers_key_reaches_the_head_node_over_ssm(env, ssm_agents):
    deploy(workers=2, head=True)
    sess = aws.session()
    c = aws.discover_cluster(sess, "c1", console=lambda iid: [])
    every = {n.instance_id for n in c.machines}
    ssm_agents.registered |= every
    now, slept, clock, sleep = fake_time()
    assert aws.install_keys(sess, c, online=every, clock=clock, sleep=sleep) == ["node0", "node1", "head"]
    assert ssm_agents.sent == [sorted(every)] and aws.keys_installed(c) == every
    # A head whose agent is not online yet is sent nothing, and gets the keys once it is.
    fresh = c.model_copy(update={"ssh_config": str(Path(c.ssh_config).parent / "again" / "ssh_config")})
    (Path(fresh.ssh_config).parent).mkdir()
    for name in ("id_ed25519.pub", "node_ed25519.pub"):
        (Path(fresh.ssh_config).parent / name).write_text((Path(c.ssh_config).parent / name).read_text())
    assert aws.install_keys(sess, fresh, online=every - {c.head.instance_id}, clock=clock, sleep=sleep) == [
        "node0", "node1"]
    assert aws.install_keys(sess, fresh, online=every, clock=clock, sleep=sleep) == ["head"]
    assert ssm_agents.sent[-1] == [c.head.instance_id]


def test_launch_status_lists_the_head_node_with_its_cost(env, monkeypatch, capsys):
    from launcher import cli

    monkeypatch.setattr(aws.ConsoleReader, "__call__", lambda self, iid: [])
    deploy(workers=2, head=True)
    assert cli.main(["status", "--cluster", "c1"]) == 0
    out = capsys.readouterr().out
    rows = [line.split("│")[1].strip() for line in out.splitlines() if line.startswith("│") and "running" in line]
    assert rows == ["node0", "node1", "head"], out
