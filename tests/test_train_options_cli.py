"""`launch train`'s options are checked before any cluster is looked for: a bad one is a usage error (one line, exit
2, as click's own), the warmup agrees with `launch plan` and the trainer, and the run directory is --out as for
`launch data` and `launch cost` (--output, its old name, still works but is no longer shown)."""

from __future__ import annotations

import pytest

from launcher import cli


def train(tmp_path, monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    code = cli.main(["train", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("args", "said"), [
    (["--warmup-epochs", "200"], "error: --warmup-epochs 200 reaches the end of the 90-epoch run"),
    (["--epochs", "15", "--warmup-epochs", "15"], "error: --warmup-epochs 15 reaches the end of the 15-epoch run"),
    (["--warmup-epochs", "-0.5"], "error: --warmup-epochs must be >= 0, got -0.5"),
    (["--out", ""], "error: --out needs a directory name, got ''"),
    (["--out", "a", "--output", "b"], "error: --out a and --output b name two run directories; pass --out only"),
    (["--resume"], "error: --resume needs --out: the run directory holding the checkpoints"),
    (["--epochs", "0"], "error: --epochs must be >= 1, got 0"),
    (["--epochs", "10001"], "error: --epochs must be <= 10000, got 10001"),
    (["--engine", "mpi"], "error: --engine must be one of:"),
    (["--model", "vgg"], "error: unknown model"),
    (["--workers", "-1"], "error: --workers must be >= 0, got -1"),
    (["--cluster", ""], "error: --cluster needs a name, got ''"),
    # Each of these asked AWS first ("stack 'scaletrain': no AWS credentials", exit 1).
    (["--nodes", "0"], "error: --nodes must be >= 1, got 0"),
    (["--nodes", "-1"], "error: --nodes must be >= 1, got -1"),
    (["--ready-timeout", "-1"], "error: --ready-timeout must be a number of seconds >= 0, got -1"),  # as discover
    (["--ready-timeout", "nan"], "error: --ready-timeout must be a number of seconds >= 0, got nan"),
    (["--ready-timeout", "inf"], "error: --ready-timeout must be a finite number of seconds >= 0, got inf"),
    (["--probe-interval", "0"], "error: --probe-interval must be a number of seconds > 0, got 0"),
    (["--probe-interval", "inf"], "error: --probe-interval must be a finite number of seconds > 0, got inf"),
    (["--data", ""], "error: --data needs a shards directory or s3://BUCKET/PREFIX (leave it out for sample data), "
                     "got ''"),  # it quietly meant "make sample data"
    (["--region", ""], "error: --region needs a region name such as us-east-1, got ''"),
    (["--profile", ""], "error: --profile needs a profile name (as in ~/.aws/config), got ''"),
])
def test_bad_options_are_usage_errors_before_any_cluster_is_sought(args, said, tmp_path, monkeypatch, capsys):
    code, err = train(tmp_path, monkeypatch, capsys, *args)
    assert code == 2 and err.startswith(said) and err.count("\n") == 1, err


@pytest.mark.parametrize("args", [["--epochs", "15", "--warmup-epochs", "14.5"], ["--out", "r", "--resume"],
                                  ["--output", "r", "--resume"], ["--out", "r", "--output", "r", "--resume"],
                                  ["--nodes", "1"], ["--ready-timeout", "0"], ["--probe-interval", "0.5"],
                                  ["--ready-timeout", "1e9"], ["--data", "shards"], ["--region", "us-east-1"],
                                  ["--epochs", "10000", "--warmup-epochs", "10"]])
def test_good_options_pass_to_finding_the_cluster(args, tmp_path, monkeypatch, capsys):
    """Past the checks the next answer is the cluster's (none here; AWS's stack 'scaletrain' cannot be read without
    credentials): the options themselves were accepted."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    code, err = train(tmp_path, monkeypatch, capsys, *args)
    assert code == 1 and err.count("\n") == 1 and "no AWS credentials" in err, err


def test_help_shows_out_and_not_the_old_name(capsys):
    assert cli.main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--out " in out and "--output" not in out


@pytest.mark.parametrize(("epochs", "warmup", "code"), [("2", "2", 2), ("2", "1.99", 0)])
def test_the_trainer_refuses_a_warmup_that_reaches_the_end_too(epochs, warmup, code, tmp_path):
    """The trainer started without the launcher (a user's own mpirun line) keeps the same rule, on both sides."""
    import subprocess
    import sys

    from training.train import parse_args

    if code == 0:
        assert parse_args(["--output", str(tmp_path), "--synthetic", "--epochs", epochs,
                           "--warmup-epochs", warmup]).warmup_epochs == float(warmup)
        return
    proc = subprocess.run([sys.executable, "-m", "training.train", "--output", str(tmp_path), "--synthetic",
                           "--epochs", epochs, "--warmup-epochs", warmup], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("error: --warmup-epochs 2 reaches the end of the 2-epoch run")
