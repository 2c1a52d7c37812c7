"""The trainer's pure parts on the CPU: schedule, model, accuracy, transforms, rank split."""

from __future__ import annotations

import random

import pytest
import torch

from training.loader import rank_shards, steps_per_epoch
from training.model import Bottleneck, build_model, flops_per_image
from training.schedule import lr_at, peak_lr, schedule_by_epoch
from training.train import accuracy_counts, param_groups, parse_args
from training.transforms import center_crop_box, random_resized_crop_box


def test_seed_000_schedule_at_64_gpus_x_256():
    steps, epochs, peak = 78, 90, peak_lr(64 * 256)
    assert peak == pytest.approx(6.4)
    assert lr_at(0, steps, epochs, peak) == pytest.approx(0.001)          # warmup start
    assert lr_at(10 * steps, steps, epochs, peak) == pytest.approx(6.4)   # end of warmup = peak
    assert lr_at(50 * steps, steps, epochs, peak) == pytest.approx(6.4 * (1 - 40 / 80) ** 2)  # poly, power 2
    assert lr_at(90 * steps, steps, epochs, peak) == pytest.approx(0.0)
    # per-step, not per-epoch: halfway through warmup epoch 5 the LR is between its neighbours
    assert lr_at(5 * steps, steps, epochs, peak) < lr_at(5 * steps + 39, steps, epochs, peak) < lr_at(
        6 * steps, steps, epochs, peak)


def test_schedule_by_epoch_covers_epoch_0_to_last():
    sched = schedule_by_epoch(10, 90, 6.4)
    assert [e for e, _ in sched] == list(range(91))
    assert sched[0][1] == pytest.approx(0.001) and sched[-1][1] == pytest.approx(0.0)


def test_cosine_and_unknown_decay():
    assert lr_at(10, 10, 2, 1.0, warmup_epochs=1, decay="cosine") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="choose one of: poly, cosine"):
        lr_at(15, 10, 2, 1.0, warmup_epochs=1, decay="step")


@pytest.mark.parametrize("name,params", [("resnet18", 11_689_512), ("resnet50", 25_557_032)])
def test_parameter_counts_match_torchvision(name, params):
    assert sum(p.numel() for p in build_model(name, 1000).parameters()) == params


def test_resnet50_is_v1_5_and_zero_gamma():
    m = build_model("resnet50", 10)
    block = m.layer2[0]
    assert isinstance(block, Bottleneck)
    assert block.conv1.stride == (1, 1) and block.conv2.stride == (2, 2)  # v1.5: stride on the 3x3
    assert all(float(b.bn3.weight.detach().abs().sum()) == 0 for layer in (m.layer1, m.layer4) for b in layer)
    assert float(build_model("resnet50", 10, zero_init_residual=False).layer1[0].bn3.weight.detach().sum()) > 0


def test_model_runs_at_small_sizes_and_rejects_unknown():
    assert build_model("resnet18", 7)(torch.zeros(2, 3, 32, 32)).shape == (2, 7)
    with pytest.raises(ValueError, match="unknown model 'vgg'; choose one of: resnet18"):
        build_model("vgg", 10)


def test_flops_per_image():
    assert flops_per_image("resnet50", 224) == pytest.approx(4.09e9, rel=0.02)  # the usual 4.1 GMACs
    assert flops_per_image("resnet18", 224) == pytest.approx(1.82e9, rel=0.02)
    assert flops_per_image("resnet18", 32) < flops_per_image("resnet18", 224) / 40


def test_accuracy_counts():
    logits = torch.tensor([[0.1, 0.9, 0.0], [0.8, 0.1, 0.2], [0.3, 0.2, 0.5]])
    assert accuracy_counts(logits, torch.tensor([1, 2, 0]), ks=(1, 2)) == [1, 3]


def test_crop_boxes_stay_inside_and_are_seeded():
    for w, h in [(500, 375), (60, 400), (32, 32)]:
        a = [random_resized_crop_box(w, h, random.Random(s)) for s in range(50)]
        assert a == [random_resized_crop_box(w, h, random.Random(s)) for s in range(50)]
        for left, top, cw, ch in a:
            assert left >= 0 and top >= 0 and left + cw <= w and top + ch <= h and cw > 0 and ch > 0
    (rw, rh), box = center_crop_box(500, 375, 224)
    assert rh == 256 and box == ((rw - 224) // 2, 16, (rw - 224) // 2 + 224, 240)


def test_rank_split_and_equal_steps():
    shards = [{"name": f"train-{i:06d}.tar", "count": c} for i, c in enumerate([10, 10, 10, 4])]
    assert [s["name"] for s in rank_shards(shards, 1, 2)] == ["train-000001.tar", "train-000003.tar"]
    # rank 0 holds 20 samples, rank 1 holds 14: both run 14 // 4 = 3 steps
    assert steps_per_epoch(shards, 2, 4) == 3
    covered = sorted(s["name"] for r in range(3) for s in rank_shards(shards, r, 3))
    assert covered == sorted(s["name"] for s in shards)


def test_trainer_rejects_bad_options(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--output", "o", "--model", "vgg"])
    assert "invalid choice: 'vgg'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--data", "d", "--output", "o", "--epochs", "0"])


@pytest.mark.parametrize("argv,message", [
    (["--output", "o"], "error: --data is required"),
    (["--data", "d", "--output", "o", "--epochs", "10001"], "error: --epochs must be <= 10000, got 10001"),
    (["--data", "d", "--output", "o", "--epochs", "0"], "error: --epochs must be >= 1, got 0"),
    (["--data", "d", "--output", "o", "--loss-scale", "huge"], "error: --loss-scale must be 'dynamic' or a positive"),
    (["--data", "d", "--output", "o", "--batch-per-gpu", "10", "--backward-passes-per-step", "3"],
     "error: --batch-per-gpu 10 must be a multiple of --backward-passes-per-step 3"),
])
def test_bad_options_are_one_line_said_by_rank_0_only(argv, message, capsys, monkeypatch):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.splitlines()) == 1 and err.startswith(message)
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")  # every other rank exits 2 without a word
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert capsys.readouterr().err == ""


def test_no_weight_decay_on_bn_and_bias():
    model = build_model("resnet18", 10)
    decay, no_decay = param_groups(model, 1e-4, decay_bn_bias=False)
    assert decay["weight_decay"] == 1e-4 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim > 1 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    ids = {id(p) for p in no_decay["params"]}
    assert id(model.fc.bias) in ids and id(model.bn1.weight) in ids and id(model.fc.weight) not in ids
    assert [g["weight_decay"] for g in param_groups(model, 1e-4, decay_bn_bias=True)] == [1e-4]


def test_memory_format_and_compile_options(capsys):
    cfg = parse_args(["--synthetic", "--output", "o"])
    assert cfg.memory_format == "auto" and cfg.compile is False
    cfg = parse_args(["--synthetic", "--output", "o", "--memory-format", "contiguous", "--compile"])
    assert cfg.memory_format == "contiguous" and cfg.compile is True
    with pytest.raises(SystemExit):
        parse_args(["--synthetic", "--output", "o", "--memory-format", "nhwc"])
    err = capsys.readouterr().err
    assert "invalid choice: 'nhwc'" in err and "contiguous" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--compile, --no-compile torch.compile the model in place, before the engine wraps it" in help_text
    assert "--memory-format {auto,channels_last,contiguous} auto (channels_last on GPU, contiguous on CPU)" in help_text


# Issue 33 item 6: each real-valued hyperparameter at its boundary, on both sides. NaN passes no comparison, so every
# rule must be written as what the value must be; these all trained (or ended in a traceback) before.
@pytest.mark.parametrize(("flag", "bad", "good", "message"), [
    ("--lr-per-256", ["nan", "inf", "-1", "0"], ["1e-9", "0.1"], "--lr-per-256 must be"),
    ("--momentum", ["nan", "-1", "0", "1", "inf"], ["1e-6", "0.9", "0.999"], "--momentum must be"),
    ("--weight-decay", ["-1", "nan", "inf", "-0.000001"], ["0", "1e-4"], "--weight-decay must be"),
    ("--warmup-start", ["nan", "-1", "inf"], ["0", "0.001"], "--warmup-start must be"),
    ("--label-smoothing", ["2", "1", "-0.1", "nan"], ["0", "0.99"], "--label-smoothing must be"),
    ("--loss-scale", ["inf", "nan", "0", "-1", "huge"], ["1e30", "dynamic", "1024"], "--loss-scale must be"),
    ("--initial-loss-scale", ["nan", "inf", "0.5"], ["1", "65536"], "--initial-loss-scale must be"),
    ("--warmup-epochs", ["nan", "-0.5", "90"], ["0", "89.9"], "--warmup-epochs"),
])
def test_hyperparameters_out_of_range_are_one_line_before_the_first_step(flag, bad, good, message, capsys):
    base = ["--synthetic", "--output", "o", "--epochs", "90"]
    for value in good:
        assert parse_args([*base, flag, value]) is not None
    for value in bad:
        with pytest.raises(SystemExit) as exit_:
            parse_args([*base, flag, value])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith(f"error: {message}"), (value, err)


def test_an_empty_output_is_refused_not_the_current_directory(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(["--synthetic", "--output", ""])
    assert exit_.value.code == 2 and capsys.readouterr().err == "error: --output needs a run directory, got ''\n"
    assert parse_args(["--synthetic", "--output", "r"]).output == "r"


def test_data_and_output_paths_are_checked_as_this_rank_sees_them(tmp_path):
    from training.options import paths_problem

    (tmp_path / "file").write_text("x")
    (tmp_path / "shards").mkdir()
    check = lambda *argv: paths_problem(parse_args([*argv]))  # noqa: E731
    assert check("--data", str(tmp_path / "shards"), "--output", str(tmp_path / "new" / "run")) is None
    assert check("--data", str(tmp_path / "shards"), "--output", str(tmp_path / "shards")) is None  # a directory
    assert check("--data", str(tmp_path / "file"), "--output", str(tmp_path / "r")) == (
        f"--data {tmp_path / 'file'} is a file; name the directory that holds manifest.json and the shards")
    assert check("--synthetic", "--output", str(tmp_path / "file")) == (
        f"--output {tmp_path / 'file'} is a file, not a directory; name a run directory")
    assert check("--synthetic", "--output", str(tmp_path / "file" / "run")) == (
        f"--output {tmp_path / 'file' / 'run'}: {tmp_path / 'file'} is a file, not a directory")
