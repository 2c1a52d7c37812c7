"""Bad input on the command line, said one way by every command: one `error:` line naming the option the user typed
(never a Python field, never pydantic's sentence) and exit 2, as click's own usage errors (launcher/cli/common.py)."""

from __future__ import annotations

import click
import pytest
from pydantic import BaseModel, Field, ValidationError

from launcher import cli
from launcher.cli import common


class _Model(BaseModel):
    gpu_throughput: float = Field(1.0, gt=0)
    batch_per_gpu: int = Field(1, ge=1, le=4096)


def _first_error(**values) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        _Model(**values)
    return info.value


@pytest.mark.parametrize(("values", "said"), [
    ({"gpu_throughput": 0}, "--gpu-throughput must be > 0, got 0"),
    ({"gpu_throughput": -1.5}, "--gpu-throughput must be > 0, got -1.5"),
    ({"batch_per_gpu": 0}, "--batch-per-gpu must be >= 1, got 0"),
    ({"batch_per_gpu": 4097}, "--batch-per-gpu must be <= 4096, got 4097"),
    ({"batch_per_gpu": "x"}, "--batch-per-gpu must be a whole number, got 'x'"),
])
def test_validation_errors_name_the_option_in_our_words(values, said):
    e = common.validation_error(_first_error(**values))
    assert isinstance(e, click.UsageError) and e.format_message() == said
    assert "Input should" not in e.format_message() and "_" not in e.format_message().split()[0]


def test_field_names_in_a_message_become_the_options_of_the_running_command():
    flags = {"gpu_throughput": "--gpu-throughput", "nodes": "--nodes"}
    assert common.option_names("gpu_throughput must be a positive number; nodes too", flags) == \
        "--gpu-throughput must be a positive number; nodes too"  # a plain word stays a word
    assert common.option_names("--gpu-throughput is fine", flags) == "--gpu-throughput is fine"


def test_a_usage_error_inside_a_command_exits_2_with_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path))
    assert cli.main(["cost", "--reducers-per-worker", "-1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --reducers-per-worker must be > 0, got -1 (see `launch cost --help`)"]


@pytest.mark.parametrize(("argv", "commands"), [
    ([], "exec, doctor, status"),
    (["data"], "sample, convert"),
    (["local"], "up, build, down, kill, reboot, replace"),
])
def test_a_group_without_its_command_shows_help_then_one_line_exit_2(tmp_path, monkeypatch, capsys, argv, commands):
    """Every group alike, as click's no_args_is_help does (help, exit 2), with a line saying why: never an empty
    `error:  (see ...)`, never exit 0."""
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path))
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert "Usage: launch" in out and "Commands" in out
    path = " ".join(["launch", *argv])
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: missing command; choose one of: {commands}")
    assert lines[0].endswith(f"(see `{path} --help`)")


def test_a_group_with_its_command_or_help_is_not_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path))
    assert cli.main(["data", "--help"]) == 0
    assert capsys.readouterr().err == ""


_AWS_COMMANDS = [["status"], ["down"], ["preflight"], ["discover"], ["ssh", "{opt}", "{value}", "node0"], ["doctor"],
                 ["exec", "{opt}", "{value}", "--", "true"]]


def _no_aws(tmp_path, monkeypatch) -> None:
    """No cluster, no credentials, no instance metadata: a command that gets past its checks fails on AWS, exit 1."""
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)


def _argv(command: list[str], opt: str, value: str) -> list[str]:
    if "{opt}" in command:  # ssh and exec take their options before the node or the command
        return [a.format(opt=opt, value=value) for a in command]
    return [*command, opt, value]


@pytest.mark.parametrize("command", _AWS_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize(("opt", "value", "said"), [
    ("--region", "", "error: --region needs a region name such as us-east-1, got ''"),
    ("--region", " ", "error: --region needs a region name such as us-east-1, got ' '"),
    ("--profile", "", "error: --profile needs a profile name (as in ~/.aws/config), got ''"),
])
def test_an_empty_region_or_profile_is_refused_not_the_default(command, opt, value, said, tmp_path, monkeypatch,
                                                               capsys):
    """`status --region ''` and `preflight --region ''` quietly meant the default region."""
    _no_aws(tmp_path, monkeypatch)
    assert cli.main(_argv(command, opt, value)) == 2
    err = capsys.readouterr().err
    assert err.startswith(said) and err.count("\n") == 1, err


@pytest.mark.parametrize("command", _AWS_COMMANDS, ids=lambda c: c[0])
def test_a_named_region_passes_the_check(command, tmp_path, monkeypatch, capsys):
    _no_aws(tmp_path, monkeypatch)
    code = cli.main(_argv(command, "--region", "us-east-1"))
    err = capsys.readouterr().err
    assert code == 1 and "needs a region name" not in err and err.count("\n") == 1, err  # AWS's answer, not ours
