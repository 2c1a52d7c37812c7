"""What `launch status` (with --extend-ttl) and `launch ssh` print, through the real CLI, against a stack in moto; and
that no command offers a way in other than SSM. `launch ssh` on rehearsal nodes: tests/test_rehearsal_cluster.py."""

from __future__ import annotations

import boto3
import pytest
from test_aws_moto import deploy, env, stack_exists  # noqa: F401 -- env is the moto fixture

from infra import ttl
from launcher import cli
from launcher import cluster as clusters
from launcher.cluster.aws import api as aws


@pytest.fixture
def no_console(monkeypatch):
    monkeypatch.setattr(aws.ConsoleReader, "__call__", lambda self, iid: [])


def test_status_on_aws_lists_every_node_with_cost_and_ttl(env, no_console, capsys):  # noqa: F811
    deploy(workers=2, reducers=1)
    assert cli.main(["status", "--cluster", "c1"]) == 0
    out = capsys.readouterr().out
    assert "cluster 'c1' (aws, us-east-1, p4d.24xlarge)" in out
    c = clusters.load("c1")
    for n in c.nodes:
        row = next(line for line in out.splitlines() if f" {n.name} " in line)
        assert n.role in row and n.instance_id in row and n.address in row and "running" in row
    assert "cost so far: $" in out and "(on-demand prices)" in out
    assert "left (deletes itself from 2030-01-01T00:00:00Z)" in out


def test_status_extend_ttl_moves_the_deadline_it_then_shows(env, no_console, capsys):  # noqa: F811
    deploy(workers=1)
    assert cli.main(["status", "--cluster", "c1", "--extend-ttl", "6"]) == 0
    out = capsys.readouterr().out
    assert "TTL extended: the stack deletes itself from 2030-01-01 06:00:00 UTC" in out
    assert "deletes itself from 2030-01-01T06:00:00Z" in out  # the table's TTL line reads the new deadline
    got = boto3.client("ssm").get_parameter(Name=ttl.parameter_name("c1"))["Parameter"]["Value"]
    assert got == "2030-01-01T06:00:00Z"  # where the cost guard reads its expiry


def test_status_extend_ttl_bad_input_is_one_line(env, no_console, capsys):  # noqa: F811
    deploy(workers=1)
    assert cli.main(["status", "--cluster", "c1", "--extend-ttl", "-3"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "-3" in err[0], err


def test_status_on_a_stopped_node_exits_non_zero(env, no_console, capsys):  # noqa: F811
    deploy(workers=2)
    assert cli.main(["status", "--cluster", "c1"]) == 0
    boto3.client("ec2").stop_instances(InstanceIds=[clusters.load("c1").nodes[1].instance_id])
    capsys.readouterr()
    assert cli.main(["status", "--cluster", "c1"]) == 1
    row = next(line for line in capsys.readouterr().out.splitlines() if " node1 " in line)
    assert "stopp" in row


def test_status_names_a_replacement_instance_not_yet_discovered(env, no_console, capsys):  # noqa: F811
    deploy(workers=2)
    assert cli.main(["status", "--cluster", "c1"]) == 0
    gone = clusters.load("c1").nodes[1].instance_id
    boto3.client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=gone, ShouldDecrementDesiredCapacity=False)
    capsys.readouterr()
    assert cli.main(["status", "--cluster", "c1"]) == 1  # node1 as saved is gone
    out = capsys.readouterr().out
    assert "terminated" in next(line for line in out.splitlines() if " node1 " in line)
    new = [i.instance_id for i in aws.cluster_instances(aws.session(), "c1") if i.instance_id != gone
           and i.instance_id != clusters.load("c1").nodes[0].instance_id]
    assert len(new) == 1
    assert f"1 instance(s) of this cluster not discovered yet: {new[0]} (worker, running); `launch discover`" in out
    # After a discovery the replacement is a node like any other.
    aws.discover_cluster(aws.session(), "c1", console=lambda iid: [])
    capsys.readouterr()
    assert cli.main(["status", "--cluster", "c1"]) == 0
    assert "not discovered yet" not in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["discover"], ["train", "--nodes", "2"], ["status"], ["doctor"], ["down"],
                                  ["exec"], ["ssh"]])
def test_bastion_is_no_option_anywhere_and_asking_for_it_is_one_line(env, argv, capsys):  # noqa: F811
    """The node subnet has no internet gateway, so a bastion outside the VPC could never reach a node: SSM Session
    Manager is the one way in, and no command offers another."""
    deploy(workers=1)
    assert cli.main([argv[0], "--bastion", "ec2-user@bastion.example.com", *argv[1:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: No such option") and "--bastion" in err[0], err
    assert stack_exists()  # nothing ran


def test_no_help_mentions_a_bastion(capsys):
    for command in ("discover", "train", "ssh", "status", "doctor"):
        with pytest.raises(SystemExit):
            cli.app([command, "--help"], prog_name="launch")
        assert "bastion" not in capsys.readouterr().out.lower()
