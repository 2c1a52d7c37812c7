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
    (["local"], "up, build, down, kill, replace"),
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
