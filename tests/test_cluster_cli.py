"""The commands about a cluster (status, ssh, doctor, exec, jobs, down, train) choose the cluster and the AWS region
in one place (launcher/cli/common.py resolve and aws_session, launcher/cluster/aws/api.session), so each gives the
same answer: AWS_REGION honoured as the AWS CLI honours it, one line for a cluster nobody knows, --region/--profile
wherever a command may talk to AWS. Against moto, through the real CLI."""

from __future__ import annotations

import os

import pytest
from test_aws_moto import deploy, env  # noqa: F401 -- env is the moto fixture

from launcher import cli
from launcher.cli import cluster as cluster_cli
from launcher.cluster.aws import api as aws


@pytest.fixture
def no_console(monkeypatch):
    monkeypatch.setattr(aws.ConsoleReader, "__call__", lambda self, iid: [])


def test_region_from_the_environment_as_the_aws_cli_reads_it():
    assert aws.region_from({"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-1"}) == "eu-west-1"
    assert aws.region_from({"AWS_DEFAULT_REGION": "us-east-1"}) is None  # boto3 reads this one itself
    assert aws.region_from({"AWS_REGION": " "}) is None


@pytest.mark.parametrize(("environ", "found"), [
    ({"AWS_REGION": "us-east-1"}, True),                                      # the issue: said "no AWS region"
    ({"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "eu-west-1"}, True),   # AWS_REGION wins, as in the AWS CLI
    ({"AWS_DEFAULT_REGION": "us-east-1"}, True),
    ({"AWS_REGION": "eu-west-1", "AWS_DEFAULT_REGION": "us-east-1"}, False),  # ...so it is looked for in eu-west-1
])
def test_status_finds_the_stack_in_the_region_the_environment_names(environ, found, env, no_console,  # noqa: F811
                                                                     monkeypatch, capsys):
    deploy(workers=1)  # in us-east-1; not yet discovered on this machine
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    code = cli.main(["status", "--cluster", "c1"])
    out, err = capsys.readouterr()
    if found:
        assert code == 0, err
        assert "cluster 'c1' (aws, us-east-1, p4d.24xlarge)" in out
    else:
        assert code == 1 and err.count("\n") == 1 and "no stack 'c1' in eu-west-1" in err, err


def test_the_profiles_region_counts_when_the_environment_names_none(env, no_console, monkeypatch,  # noqa: F811
                                                                    capsys):
    deploy(workers=1)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    (env / "no-config").write_text("[default]\nregion = us-east-1\n")  # AWS_CONFIG_FILE of the env fixture
    assert cli.main(["status", "--cluster", "c1"]) == 0, capsys.readouterr().err
    assert "(aws, us-east-1," in capsys.readouterr().out


def test_no_region_anywhere_is_one_line_naming_every_way_to_give_one(env, monkeypatch, capsys):  # noqa: F811
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert cli.main(["status", "--cluster", "c1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --region, set AWS_REGION or AWS_DEFAULT_REGION" in err, err


@pytest.mark.parametrize("argv", [["status"], ["ssh", "--cluster", "nosuch", "node0"], ["doctor"],
                                  ["exec", "--cluster", "nosuch", "--", "true"], ["jobs"], ["logs", "--cluster",
                                                                                           "nosuch", "1"]])
def test_an_unknown_cluster_gets_one_answer_from_every_command(argv, env, capsys):  # noqa: F811
    """status, ssh and doctor said three different things; now each says what this machine knows and what AWS
    said, in the same line."""
    if "--cluster" not in argv:
        argv = [*argv, "--cluster", "nosuch"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err == ("error: unknown cluster 'nosuch'; known clusters: none; on AWS: no stack 'nosuch' in us-east-1 "
                   "(wrong region? pass --region); deploy one with `npx cdk deploy -c cluster_name=nosuch`\n")


@pytest.mark.parametrize("command", ["ssh", "doctor", "exec"])
def test_ssh_doctor_and_exec_take_region_and_profile(command, capsys):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "--region" in out and "--profile" in out


def test_ssh_reaches_a_stack_in_the_region_given_with_region(env, no_console, monkeypatch, capsys):  # noqa: F811
    deploy(workers=2)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")  # the environment points elsewhere; --region wins
    ran: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda file, argv: ran.append(argv))
    assert cli.main(["ssh", "--cluster", "c1", "--region", "us-east-1", "node1", "hostname"]) == 0, \
        capsys.readouterr().err
    assert ran and ran[0][-2:] == ["node1", "hostname"] and ran[0][:2] == ["ssh", "-F"]
    assert cluster_cli.clusters.load("c1").aws.region == "us-east-1"


def test_cluster_help_says_the_aws_fallback(capsys):
    for command in ("status", "down", "exec", "doctor"):
        assert cli.main([command, "--help"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "defaults to the only cluster there is" not in out
        assert "$SCALETRAIN_STACK" in out, command
