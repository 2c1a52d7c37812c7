"""Readiness waits for the EFA devices each node group really gets, as the stack's NodeGroups output says (moto):
reducers beside P4d/P5 are on TCP, and an `-c efa=false` stack has no EFA device anywhere. Before, both waited
out --ready-timeout for devices the nodes never get."""

from __future__ import annotations

import pytest
from test_aws_moto import deploy as deploy_stack
from test_aws_moto import env  # noqa: F401  (the moto fixture)
from test_aws_plans import node_groups

from infra import catalog
from infra.spec import ClusterSpec
from launcher.cluster.aws import api as aws
from launcher.errors import LaunchError
from launcher.execute import awsrun
from launcher.plans import efa


def deploy(spec: ClusterSpec) -> None:
    """A stack whose Auto Scaling groups launch real (moto) instances, with the outputs infra/stack.py writes for
    ``spec``: NodeGroups from the spec's interfaces and transports."""
    deploy_stack(spec.cluster_name, reducers=spec.reducers, instance_type=spec.instance_type,
                 groups=node_groups(spec))


def what_nodes_show(spec: ClusterSpec):
    """The probe's answer from each node as EC2 builds it from the launch template: the type's GPUs, and one EFA
    device per EFA interface of its group (none on a plain interface, whatever the type could have)."""
    shows = {g["role"]: (catalog.get(g["instance_type"]).gpus,
                         sum(1 for i in g["efa_devices"] if i["interface_type"] != "interface"))
             for g in node_groups(spec)}

    def probe(c, nodes):
        return {n.name: (True, f"cloud_init=done\ngpus={shows[n.role][0]}\nefa={shows[n.role][1]}\n", "")
                for n in nodes}
    return probe


def connect(spec: ClusterSpec):
    """Deploy ``spec``, then launch train's first step: discover, wait until every node is ready (a fake clock)."""
    deploy(spec)
    now = [0.0]
    return awsrun.connect_ready(aws.session(), spec.cluster_name, timeout_s=600, interval_s=60,
                                console=lambda iid: [], agent=set, probe=what_nodes_show(spec),
                                clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                                on_progress=None)


@pytest.mark.usefixtures("env")
def test_c5n_reducers_beside_p4d_are_ready_without_efa():
    spec = ClusterSpec(cluster_name="c1", instance_type="p4d.24xlarge", nodes=2, reducers=2,
                       reducer_type="c5n.18xlarge", ami="ami-0123456789abcdef0")
    assert spec.reducer_transport == "tcp"  # EFA traffic does not cross P4d and other families
    c = connect(spec)
    assert [(n.role, n.transport, n.efa_devices) for n in c.nodes] == [
        ("worker", "efa", 4), ("worker", "efa", 4), ("reducer", "tcp", 0), ("reducer", "tcp", 0)]
    fabric, _ = efa.for_cluster(c)
    assert fabric == {"FI_EFA_USE_HUGE_PAGE": "0"}  # the workers' only; plan.mpmd gives reducers none


@pytest.mark.usefixtures("env")
def test_an_efa_false_stack_is_ready_without_efa_and_gets_no_efa_env():
    spec = ClusterSpec(cluster_name="c1", instance_type="p4d.24xlarge", nodes=2, efa=False,
                       ami="ami-0123456789abcdef0")
    c = connect(spec)
    assert {(n.transport, n.efa_devices) for n in c.nodes} == {("tcp", 0)}
    assert efa.for_cluster(c) == ({}, [])


@pytest.mark.usefixtures("env")
def test_a_worker_missing_an_efa_device_still_times_out():
    spec = ClusterSpec(cluster_name="c1", instance_type="p4d.24xlarge", nodes=2, ami="ami-0123456789abcdef0")
    deploy(spec)
    broken = what_nodes_show(spec)

    def probe(c, nodes):
        found = broken(c, nodes)
        found["node1"] = (True, "cloud_init=done\ngpus=8\nefa=3\n", "")
        return found

    now = [0.0]
    with pytest.raises(LaunchError, match=r"1 of 2 node\(s\) not ready after 600 s: node1 \(3 of 4 EFA devices"):
        awsrun.connect_ready(aws.session(), "c1", timeout_s=600, interval_s=60, console=lambda iid: [], agent=set,
                             probe=probe, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
                             on_progress=None)

