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


def test_with_no_region_named_the_stacks_own_is_used_as_preflight_and_cdk_deploy_use_it(env, no_console,  # noqa: F811
                                                                                          monkeypatch, capsys):
    """cdk.json's region is where `npx cdk deploy` (and so `launch preflight`/`up`) put the stack: status, discover
    and down look there too when neither --region, the environment nor the profile names one."""
    from launcher.cli import common

    deploy(workers=1)
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert common.cdk_region() == "us-east-1"
    assert cli.main(["status", "--cluster", "c1"]) == 0, capsys.readouterr().err
    assert "(aws, us-east-1," in capsys.readouterr().out


def test_no_region_anywhere_is_one_line_naming_every_way_to_give_one(env, monkeypatch, capsys):  # noqa: F811
    from launcher.cli import common

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setattr(common, "cdk_region", lambda: None)  # no cdk.json either
    assert cli.main(["status", "--cluster", "c1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pass --region, set AWS_REGION or AWS_DEFAULT_REGION" in err, err


@pytest.mark.parametrize("argv", [["status"], ["ssh", "--cluster", "nosuch", "node0"], ["doctor"],
                                  ["exec", "--cluster", "nosuch", "--", "true"], ["jobs"], ["logs", "--cluster",
                                                                                           "nosuch", "1"],
                                  ["cancel", "--cluster", "nosuch", "1"], ["run", "--cluster", "nosuch", "--", "true"],
                                  ["train"], ["down"]])
def test_an_unknown_cluster_gets_one_answer_from_every_command(argv, env, capsys):  # noqa: F811
    """status, ssh and doctor said three different things; now each says what this machine knows and what AWS
    said, in the same line (run and train too: they said 'no AWS region' and "stack 'nosuch': ...")."""
    if "--cluster" not in argv:
        argv = [*argv, "--cluster", "nosuch"]
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert err == ("error: unknown cluster 'nosuch'; known clusters: none; on AWS: no stack 'nosuch' in us-east-1 "
                   "(wrong region? pass --region); deploy one with `npx cdk deploy -c cluster_name=nosuch`\n")


def test_down_of_a_name_nobody_knows_says_so_where_no_region_is_named(env, monkeypatch, capsys):  # noqa: F811
    """It said "no cluster is up" (the line for no name at all) when the region was what AWS lacked."""
    from launcher.cli import common

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    monkeypatch.setattr(common, "cdk_region", lambda: None)
    (env / "home" / "clusters" / "mine").mkdir(parents=True)
    (env / "home" / "clusters" / "mine" / "cluster.json").write_text("{}")
    assert cli.main(["down", "--cluster", "nosuch"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: unknown cluster 'nosuch'; known clusters: mine; on AWS: ") and \
        err.count("\n") == 1, err


def test_down_deletes_a_stack_that_is_there(env, capsys):  # noqa: F811
    deploy("c2", workers=1)
    assert cli.main(["down", "--cluster", "c2"]) == 0, capsys.readouterr().err
    assert "stack 'c2' is deleted" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["ssh", "doctor", "exec", "jobs", "logs", "cancel", "run", "train"])
def test_ssh_doctor_and_exec_take_region_and_profile(command, capsys):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert "--region" in out and "--profile" in out


@pytest.mark.parametrize("argv", [["status"], ["jobs"], ["logs", "1"], ["cancel", "1"], ["run", "--", "true"],
                                  ["train"]])
def test_with_no_region_named_every_command_looks_where_the_stack_is(argv, env, monkeypatch, capsys):  # noqa: F811
    """No cluster known, no region in the environment: run said 'no AWS region' where status and train look in
    cdk.json's region (where `npx cdk deploy` puts the stack), as every command now does."""
    from launcher.cli import common

    monkeypatch.delenv("AWS_DEFAULT_REGION")
    assert common.cdk_region() == "us-east-1"
    assert cli.main(argv) == 1
    assert capsys.readouterr().err == (
        "error: no cluster is up; start one with `launch local up --nodes 2` (or deploy one with `npx cdk deploy`); "
        "on AWS: no stack 'scaletrain' in us-east-1 (wrong region? pass --region); deploy one with `npx cdk deploy "
        "-c cluster_name=scaletrain`\n")


@pytest.mark.parametrize("argv", [["jobs"], ["logs", "1"], ["cancel", "1"]])
def test_jobs_logs_and_cancel_look_in_the_region_given(argv, env, capsys):  # noqa: F811
    assert cli.main([*argv, "--cluster", "nosuch", "--region", "eu-west-1"]) == 1
    assert "on AWS: no stack 'nosuch' in eu-west-1 " in capsys.readouterr().err


def test_ssh_reaches_a_stack_in_the_region_given_with_region(env, no_console, monkeypatch, capsys,  # noqa: F811
                                                             ssm_plugin):
    """A stack this machine has not seen is made reachable first, as `launch discover` makes it (nodes ready, the
    launcher's key sent over SSM, the nodes' access files), then ssh runs; --region wins over the environment."""
    from launcher.execute import awsrun

    deploy(workers=2)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    monkeypatch.setattr(aws, "ssm_online", lambda sess, ids: set(ids))
    keys_sent: list[str] = []
    monkeypatch.setattr(aws, "install_keys", lambda sess, c, **kw: keys_sent.extend(n.name for n in c.nodes) or [])
    monkeypatch.setattr(awsrun, "ssh_probe", lambda c, nodes: {
        n.name: (True, f"cloud_init=done\ngpus={n.gpus}\nefa={n.efa_devices}\n", "") for n in nodes})
    accessed: list[str] = []
    monkeypatch.setattr(awsrun, "install_node_access", lambda c: accessed.append(c.name))
    ran: list[list[str]] = []
    monkeypatch.setattr(os, "execvp", lambda file, argv: ran.append(argv))
    assert cli.main(["ssh", "--cluster", "c1", "--region", "us-east-1", "node1", "hostname"]) == 0, \
        capsys.readouterr().err
    assert ran and ran[0][-2:] == ["node1", "hostname"] and ran[0][:2] == ["ssh", "-F"]
    assert cluster_cli.clusters.load("c1").aws.region == "us-east-1"
    assert set(keys_sent) >= {"node0", "node1"} and accessed == ["c1"]


def test_cluster_help_says_the_aws_fallback(capsys):
    for command in ("status", "down", "exec", "doctor"):
        assert cli.main([command, "--help"]) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert "defaults to the only cluster there is" not in out
        assert "$SCALETRAIN_STACK" in out, command


ID_LINE = "error: ID must be a job id as `launch jobs` lists them, a whole number from 1 to 4,294,967,295"


@pytest.mark.parametrize(("argv", "said"), [
    # The one node limit of plan and cost (infra.catalog.MAX_NODES), refused before AWS is asked.
    (["preflight", "-c", "nodes=4097"], "error: nodes='4097': allowed: 1 to 4096 worker nodes"),
    (["preflight", "-c", "nodes=100000"], "error: nodes='100000': allowed: 1 to 4096 worker nodes"),
    # pydantic's sentences ("input should be a valid integer, unable to parse string as an integer") reworded.
    (["preflight", "-c", "nodes=abc"], "error: nodes='abc': must be a whole number"),
    (["preflight", "-c", "spot=maybe"], "error: spot='maybe': must be true or false"),
    (["status", "--extend-ttl", "-3"], "error: --extend-ttl must be more than 0 and at most 720 hours, got -3"),
    (["status", "--extend-ttl", "721"], "error: --extend-ttl must be more than 0 and at most 720 hours, got 721"),
    (["discover", "--ready-timeout", "-1"], "error: --ready-timeout must be a number of seconds >= 0, got -1"),
    (["doctor", "--storage", "nfs"], "error: --storage must be one of: auto, fsx, beegfs, none; got 'nfs'"),
    (["local", "up", "--nodes", "0"], "error: --nodes must be >= 1, got 0"),
    (["status", "--cluster", ""], "error: --cluster needs a name, got ''"),  # it quietly meant the default
    (["down", "--cluster", " "], "error: --cluster needs a name, got ' '"),
    (["discover", "--cluster", ""], "error: --cluster needs a stack name, got ''"),
    (["local", "up", "--nodes", "60", "--reducers", "5"], "error: --nodes + --reducers must be at most 64"),
    (["discover", "--ready-timeout", "inf"], "error: --ready-timeout must be a finite number of seconds >= 0, got inf"),
    # launch run: exit 1 for each before, and only after asking AWS for a region.
    (["run", "--procs-per-node", "0", "--", "true"], "error: --procs-per-node must be >= 1, got 0"),
    (["run", "--engine", "foo", "--", "true"], "error: --engine must be one of: horovod, ddp, reducer; got 'foo'"),
    (["run", "--reducers", "-1", "--", "true"], "error: --reducers must be >= 0, got -1"),
    (["run", "--engine", "horovod", "--reducers", "1", "--", "true"],
     "error: --reducers uses the reducer engine; leave out --engine horovod"),
    (["run", "--engine", "reducer", "--", "true"], "error: --engine reducer needs --reducers K"),
    (["run", "--stall-timeout", "nan", "--", "true"], "error: --stall-timeout must be a number of seconds >= 0 (0: "
                                                      "never), got nan"),
    (["run", "--stall-timeout", "-1", "--", "true"], "error: --stall-timeout must be a number of seconds >= 0"),
    (["run", "--max-restarts", "-1", "--", "true"], "error: --max-restarts must be >= 0, got -1"),
    (["run", "--nodes", "0", "--", "true"], "error: --nodes must be >= 1, got 0"),
    (["run", "--workdir", "", "--", "true"], "error: --workdir needs a directory, got ''"),  # Path('') is '.'
    (["run", "--workdir", "/etc/hostname", "--", "true"], "error: --workdir must be a directory; /etc/hostname is "
                                                          "not one"),
    (["run", "--workdir", "/no/such/dir", "--", "true"], "error: --workdir must be a directory; /no/such/dir"),
    (["run", "--", ""], "error: launch run needs a command after --, e.g. `launch run -- python train.py`; got ''"),
    (["run"], "error: launch run needs a command after --"),
    (["run", "--checkpoint-to", "/tmp/x", "--", "true"], "error: --checkpoint-to must be s3://BUCKET/PREFIX"),
    (["run", "--region", "", "--", "true"], "error: --region needs a region name such as us-east-1, got ''"),
    (["run", "--profile", " ", "--", "true"], "error: --profile needs a profile name (as in ~/.aws/config), got ' '"),
    # jobs, logs, cancel: the id is checked before the cluster is asked (it was after reaching the nodes).
    (["logs", "abc"], ID_LINE + "; got 'abc'"),
    (["logs", "12_3"], ID_LINE + "; got '12_3'"),
    (["logs", "0"], ID_LINE + "; got '0'"),
    (["cancel", ""], ID_LINE + "; got ''"),
    (["cancel", "1.5"], ID_LINE + "; got '1.5'"),
    (["jobs", "--region", ""], "error: --region needs a region name such as us-east-1, got ''"),
    (["logs", "1", "--profile", ""], "error: --profile needs a profile name"),
    (["cancel", "1", "--region", " "], "error: --region needs a region name such as us-east-1, got ' '"),
    # Slurm's ids are 32-bit: 2**32 went to the head node; 5,000 digits were int()'s own ValueError.
    (["logs", str(2**32)], "error: ID must be a job id as `launch jobs` lists them, a whole number from 1 to "
                           "4,294,967,295; got '4294967296'"),
    (["cancel", "9" * 5000], "error: ID must be a job id as `launch jobs` lists them"),
    # exec and ssh: nothing to run, or no node; each went on to the cluster.
    (["exec", "--", ""], "error: launch exec needs a command after --, e.g. `launch exec -- nvidia-smi`; got ''"),
    (["exec", "--", " ", ""], "error: launch exec needs a command after --"),
    (["ssh", ""], "error: NODE needs a node's name (node0, reducer0, ..., head), got ''"),
    # up waited for ever.
    (["up", "--capacity-wait", "inf"], "error: --capacity-wait must be a finite number of seconds >= 0, got inf"),
    # local: a path for a name (down looked for, and would remove, ~/.scaletrain/x).
    (["local", "down", "--cluster", "../x"], "error: --cluster must be a cluster's name, not a path; got '../x'"),
    (["local", "kill", "node0", "--cluster", ".."], "error: --cluster must be a cluster's name, not a path"),
    (["local", "replace", "--cluster", "a/b"], "error: --cluster must be a cluster's name, not a path"),
    (["local", "reboot", "node0", "--cluster", "/tmp"], "error: --cluster must be a cluster's name, not a path"),
    # local: an empty --cluster (exit 1 before) and a --name that is no plain name (a path, or the clusters dir).
    (["local", "replace", "--cluster", ""], "error: --cluster needs a name, got ''"),
    (["local", "down", "--cluster", ""], "error: --cluster needs a name, got ''"),
    (["local", "kill", "--cluster", " ", "node1"], "error: --cluster needs a name, got ' '"),
    (["local", "up", "--name", ""], "error: --name must be a plain cluster name: letters, digits, - and _, starting "
                                    "with a letter or digit, at most 64 characters; got ''"),
    (["local", "up", "--name", "../x"], "error: --name must be a plain cluster name: letters, digits, - and _"),
    (["local", "up", "--name", "-x"], "error: --name must be a plain cluster name"),
    (["local", "up", "--name", "a.b"], "error: --name must be a plain cluster name"),
    (["local", "up", "--name", "a" * 65], "error: --name must be a plain cluster name"),
    # up: what would have gone on to AWS.
    (["up", "--fallback-reservation", ""], "error: --fallback-reservation must be a capacity reservation id such as "
                                           "cr-0123456789abcdef0, got ''"),
    (["up", "--fallback-reservation", "cr-1"], "error: --fallback-reservation must be a capacity reservation id"),
    (["up", "--region", ""], "error: --region needs a region name such as us-east-1, got ''"),
    (["up", "--profile", ""], "error: --profile needs a profile name"),
])
def test_bad_options_are_usage_errors_in_every_command(argv, said, tmp_path, monkeypatch, capsys):
    """Exit 2 and one line, before any cluster or AWS call, as click's own usage errors (they exited 1 or 2)."""
    from launcher.local import backend, rehearsal_cluster

    # A check that moved after start-up would bring up real nodes here (and leave them running): fail instead.
    for module, starts in ((rehearsal_cluster, "up"), (backend, "_check_tools")):
        monkeypatch.setattr(module, starts, lambda *a, **kw: pytest.fail(f"{argv} started a local cluster"))
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1 and "nput should" not in err, err


def test_the_last_node_count_reaches_aws(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    assert cli.main(["preflight", "-c", "nodes=4096"]) == 1  # accepted; what stops it is AWS (no credentials)
    assert "no AWS credentials" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "said"), [
    # The other side of each limit above: accepted, so what stops the command is the cluster (none here) or AWS.
    (["run", "--procs-per-node", "1", "--reducers", "0", "--stall-timeout", "0", "--max-restarts", "0", "--nodes",
      "1", "--", "true"], "no AWS credentials"),
    (["run", "--engine", "reducer", "--reducers", "1", "--stall-timeout", "1e9", "--", "true"], "no AWS credentials"),
    (["run", "--workdir", "WORKDIR", "--region", "us-east-1", "--profile", "p", "--", "true"], "AWS session"),
    (["discover", "--ready-timeout", "0"], "no AWS credentials"),
    (["logs", "1"], "no AWS credentials"),
    (["cancel", "007"], "no AWS credentials"),
    (["logs", str(2**32 - 1)], "no AWS credentials"),
    (["exec", "--", "true"], "no AWS credentials"),
    (["ssh", "node0"], "no AWS credentials"),
    (["up", "--capacity-wait", "1e9"], "no AWS credentials"),
    (["local", "down", "--cluster", "x.y"], "unknown cluster 'x.y'"),
    (["jobs", "--region", "eu-west-1"], "no AWS credentials"),
    (["up", "--fallback-reservation", "cr-0123456789abcdef0"], "no AWS credentials"),
    (["local", "replace", "--cluster", "x"], "unknown cluster 'x'"),
])
def test_the_allowed_side_of_each_limit_goes_on(argv, said, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(key, raising=False)
    assert cli.main([str(tmp_path) if a == "WORKDIR" else a for a in argv]) == 1
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1, err


@pytest.mark.parametrize("name", ["a", "A-b_9", "7" * 64])
def test_a_plain_local_cluster_name_passes_the_name_check(name, tmp_path, monkeypatch, capsys):
    """--nodes is checked after --name: its line shows the name was accepted (nothing starts with --nodes 0)."""
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    assert cli.main(["local", "up", "--name", name, "--nodes", "0"]) == 2
    assert capsys.readouterr().err.startswith("error: --nodes must be >= 1, got 0")


def test_local_replace_help_says_which_nodes_get_a_new_port(capsys):
    assert cli.main(["local", "replace", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())
    assert "(new port, new host key)" not in out and "a --loopback node gets a new port" in out


@pytest.mark.parametrize(("words", "given", "command"), [
    (["--cluster", "X", "hostname", "-f"], {"--cluster": "X"}, ["hostname", "-f"]),
    (["--cluster=X", "--region", "eu-west-1", "--", "-v"], {"--cluster": "X", "--region": "eu-west-1"}, ["-v"]),
    (["ls", "--cluster", "X"], {}, ["ls", "--cluster", "X"]),  # after the command, the command's own words
    (["--", "--cluster"], {}, ["--cluster"]),
    ([], {}, []),
])
def test_options_after_the_node_are_the_launchers_until_the_command(words, given, command):
    assert cluster_cli.options_after_node(words) == (given, command)


@pytest.mark.parametrize(("argv", "said"), [
    (["ssh", "node0", "-L", "8080:localhost:80"], "error: -L after NODE is not an option of launch ssh (it takes "
                                                  "--cluster, --region, --profile); a command that starts with - "
                                                  "goes after --: launch ssh NODE -- -L ..."),
    (["ssh", "node0", "--cluster"], "error: --cluster needs a value"),
    (["ssh", "--cluster", "a", "node0", "--cluster", "b"], "error: --cluster is given twice ('a' before NODE, 'b' "
                                                           "after); give it once"),
    (["ssh", "node0", "--region", ""], "error: --region needs a region name such as us-east-1, got ''"),
])
def test_ssh_refuses_what_it_cannot_tell_in_one_line(argv, said, monkeypatch, capsys):
    monkeypatch.setattr(cluster_cli, "resolve", lambda *a, **kw: pytest.fail("reached the cluster"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


def test_ssh_understands_its_options_after_the_node(monkeypatch, capsys):
    """`launch ssh node0 --cluster X hostname` handed `--cluster X hostname` to ssh, which printed its usage."""
    from launcher.errors import LaunchError

    asked = []

    def resolve(cluster, region, profile, **kw):
        asked.append((cluster, region, profile))
        raise LaunchError("stop here")

    monkeypatch.setattr(cluster_cli, "resolve", resolve)
    assert cli.main(["ssh", "node0", "--cluster", "X", "--profile=p", "hostname"]) == 1
    assert asked == [("X", None, "p")]
    assert cli.main(["ssh", "node0", "--help"]) == 0 and "--cluster" in capsys.readouterr().out
    assert cluster_cli.ssh_argv("cfg", "node0", ["-v"]) == ["ssh", "-F", "cfg", "--", "node0", "-v"]
    assert cluster_cli.ssh_argv("cfg", "node0", []) == ["ssh", "-F", "cfg", "-t", "--", "node0"]


@pytest.mark.parametrize(("extra", "said"), [
    (["--node-index", "1", "--node-count", "2"], "error: --cluster chooses the nodes itself; leave out --node-index "
                                                 "and --node-count"),
    (["--out", "relative"], "error: --out relative must be an absolute path as the nodes see it with --cluster"),
])
def test_data_convert_with_cluster_refuses_what_the_cluster_decides_as_usage_errors(extra, said, tmp_path,
                                                                                    monkeypatch, capsys):
    """Exit 1 before (a LaunchError), where every other bad option of the command is 2."""
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "src" / "train").mkdir(parents=True)
    argv = ["data", "convert", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--cluster", "x", *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


@pytest.mark.parametrize(("argv", "said"), [
    (["ssh", "node9", "--cluster", "loc"], "error: no node 'node9' in cluster 'loc'; nodes: node0, node1"),
    (["local", "kill", "node9", "--cluster", "loc"], "error: no node 'node9' in cluster 'loc'; nodes: node0, node1"),
    (["local", "replace", "node0", "node9", "--cluster", "loc"], "error: no node 'node9' in cluster 'loc'"),
])
def test_a_node_the_cluster_has_not_is_a_bad_argument_as_local_reboot_says_it(argv, said, tmp_path, monkeypatch,
                                                                             capsys):
    """Exit 1 before, where `launch local reboot node9` said the same line with 2."""
    from launcher.cluster import Cluster, Node, cluster_dir, save
    from launcher.local import backend

    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    for name in ("kill", "replace"):
        monkeypatch.setattr(backend, name, lambda *a, **kw: pytest.fail("reached the nodes"))
    cluster_dir("loc").mkdir(parents=True)
    save(Cluster(name="loc", backend="local", user="u", ssh_config="/s", known_hosts="/k", python="python",
                 nodes=[Node(name=f"node{i}", address="127.0.0.1", port=1, role="worker", slots=1, cpus=1,
                             workdir=f"/w{i}") for i in range(2)]))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err
