"""The trainer, run as a rank is run (python -m training.train, torch.distributed over loopback), on inputs that lie
(issue 33 items 5-7): each ends before the first step, or at the shard that lies, in one line with its exit status;
Ctrl-C ends every rank with one line and 130, leaving no half-written file.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from training.convert import convert
from training.sample import make_sample

ROOT = Path(__file__).resolve().parent.parent
WNIDS = ("n01440764", "n01443537", "n01484850", "n01491361")
TINY = ["--engine", "ddp", "--model", "resnet18", "--image-size", "16", "--batch-per-gpu", "4", "--workers", "0",
        "--threads", "1", "--no-tensorboard", "--warmup-epochs", "0", "--epochs", "1"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(rank: int, world: int, port: int) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
            "GLOO_SOCKET_IFNAME": "lo"}


def start(*args: str, ranks: int = 1) -> list[subprocess.Popen]:
    """The ranks, each with Python's own SIGINT handling (the test runner may have been started with it ignored)."""
    port = free_port()
    return [subprocess.Popen([sys.executable, "-m", "training.train", *TINY, *args], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=ROOT, env=rank_env(r, ranks, port),
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
            for r in range(ranks)]


def finish(procs: list[subprocess.Popen], timeout: float = 240) -> list[tuple[int, str, str]]:
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
        return [(p.returncode, out, err) for p, (out, err) in zip(procs, outs, strict=True)]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def run(*args: str, ranks: int = 1) -> list[tuple[int, str, str]]:
    return finish(start(*args, ranks=ranks))


def one_line(results: list[tuple[int, str, str]], status: int) -> str:
    """Every rank ended with `status`, and all of them together said exactly one line (on stderr)."""
    report = "\n".join(f"rc {rc}\n{out[-1500:]}\n{err[-1500:]}" for rc, out, err in results)
    lines = [line for _, _, err in results for line in err.splitlines() if line.strip()]
    assert [rc for rc, _, _ in results] == [status] * len(results), report
    assert len(lines) == 1 and lines[0].startswith("error: "), report
    return lines[0]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    """4 classes, 16 training and 8 validation images, in shards of 4."""
    root = tmp_path_factory.mktemp("inputs")
    make_sample(root / "src", classes=4, per_class=4, val_per_class=2, seed=0)
    convert(root / "src", root / "out", shard_size=4, seed=0)
    return root / "out"


@pytest.fixture(scope="module")
def finished(shards, tmp_path_factory) -> Path:
    """A finished 1-epoch run directory: its checkpoint-epoch000.pt is the one to resume from."""
    out = tmp_path_factory.mktemp("finished") / "run"
    results = run("--data", str(shards), "--output", str(out))
    assert results[0][0] == 0, results
    return out


def test_an_output_that_is_a_file_and_data_that_is_a_file_stop_every_rank_with_2(shards, tmp_path):
    (tmp_path / "file").write_text("x")
    line = one_line(run("--data", str(shards), "--output", str(tmp_path / "file"), ranks=2), 2)
    assert line == f"error: --output {tmp_path / 'file'} is a file, not a directory; name a run directory"
    line = one_line(run("--data", str(tmp_path / "file"), "--output", str(tmp_path / "r")), 2)
    assert line.startswith(f"error: --data {tmp_path / 'file'} is a file")
    assert not (tmp_path / "r").exists()


def test_a_manifest_with_one_class_stops_before_the_first_step(shards, tmp_path):
    data = Path(shutil.copytree(shards, tmp_path / "data"))
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["classes"] = manifest["classes"][:1]
    (data / "manifest.json").write_text(json.dumps(manifest))
    line = one_line(run("--data", str(data), "--output", str(tmp_path / "r"), ranks=2), 2)
    assert line.endswith("classes: 1 class(es); training needs at least 2 (launch data sample --classes 2)")
    assert not (tmp_path / "r" / "metrics.jsonl").exists()


def test_a_label_outside_the_class_list_stops_the_rank_that_reads_it(shards, tmp_path):
    """Labels go up to 3 here; a manifest of 3 classes makes label 3 one the loss would index out of range."""
    data = Path(shutil.copytree(shards, tmp_path / "data"))
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["classes"] = manifest["classes"][:3]
    (data / "manifest.json").write_text(json.dumps(manifest))
    line = one_line(run("--data", str(data), "--output", str(tmp_path / "r")), 1)
    assert line.startswith("error: rank 0: ") and ".cls is 3, outside the manifest's 3 classes (0 to 2)" in line


@pytest.mark.parametrize("delta", [1, -1])
def test_a_shard_count_that_is_not_what_the_shard_holds_is_named(shards, tmp_path, delta):
    data = Path(shutil.copytree(shards, tmp_path / "data"))
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["shards"][0]["count"] += delta
    (data / "manifest.json").write_text(json.dumps(manifest))
    line = one_line(run("--data", str(data), "--output", str(tmp_path / "r")), 1)
    assert line == (f"error: rank 0: train-000000.tar: holds 4 samples where the manifest says {4 + delta}; "
                    f"convert the data again")


def resume(shards: Path, finished: Path, run_dir: Path, *extra: str, ranks: int = 1) -> list[tuple[int, str, str]]:
    shutil.copytree(finished, run_dir)
    return run("--data", str(shards), "--output", str(run_dir), "--epochs", "2", "--resume", *extra, ranks=ranks)


def test_resume_from_a_whole_checkpoint_continues(shards, finished, tmp_path):
    results = resume(shards, finished, tmp_path / "run")
    assert results[0][0] == 0 and "resuming from checkpoint-epoch000.pt: epoch 1" in results[0][1], results


@pytest.mark.parametrize(("damage", "said"), [
    (lambda b: b[: len(b) // 2], "error: checkpoint checkpoint-epoch000.pt cannot be read ("),
    (lambda b: b"garbage, not a checkpoint", "error: checkpoint checkpoint-epoch000.pt cannot be read ("),
])
def test_resume_from_a_truncated_or_garbage_checkpoint_is_an_error_not_a_fresh_start(shards, finished, tmp_path,
                                                                                    damage, said):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    ckpt = run_dir / "checkpoint-epoch000.pt"
    ckpt.write_bytes(damage(ckpt.read_bytes()))
    results = run("--data", str(shards), "--output", str(run_dir), "--epochs", "2", "--resume", ranks=2)
    line = one_line(results, 2)
    assert line.startswith(said) and line.endswith(f"move it out of {run_dir} to resume from the one before, or use "
                                                   f"another --output"), line
    assert "starting from scratch" not in results[0][1]


def test_resume_with_another_class_count_is_an_error(shards, finished, tmp_path):
    data = Path(shutil.copytree(shards, tmp_path / "data"))
    manifest = json.loads((data / "manifest.json").read_text())
    manifest["classes"] = [*manifest["classes"], "n01494475"]  # 5 classes now; the checkpoint's fc has 4
    (data / "manifest.json").write_text(json.dumps(manifest))
    shutil.copytree(finished, tmp_path / "run")
    results = run("--data", str(data), "--output", str(tmp_path / "run"), "--epochs", "2", "--resume")
    assert one_line(results, 2) == ("error: checkpoint checkpoint-epoch000.pt holds fc.weight of shape 4x512, this "
                                    "run's model has 5x512 (5 classes): it was made for other data; use another "
                                    "--output")


def test_resume_with_a_checkpoint_of_another_model_is_an_error(shards, finished, tmp_path):
    results = resume(shards, finished, tmp_path / "run", "--model", "resnet34")
    assert one_line(results, 2) == ("error: checkpoint checkpoint-epoch000.pt was made by resnet18, not resnet34; use "
                                    "another --output or the same --model")


LONG_RUN = ("--synthetic", "--epochs", "50", "--steps-per-epoch", "3", "--log-every", "1", "--num-classes", "4")


def signalled_after_a_checkpoint(out: Path, sig: int) -> list[tuple[int, str, str]]:
    """Two ranks of a long synthetic run, sent `sig` each once the first checkpoint is written; how they ended. What
    they wrote must be whole: every metrics line parses, no temporary checkpoint is left."""
    procs = start(*LONG_RUN, "--output", str(out), ranks=2)
    deadline = time.monotonic() + 180
    while not list(out.glob("checkpoint-epoch*.pt")) and time.monotonic() < deadline and procs[0].poll() is None:
        time.sleep(0.05)
    assert procs[0].poll() is None, finish(procs)
    for p in procs:
        p.send_signal(sig)
    results = finish(procs, timeout=120)
    assert not list(out.glob(".*tmp")), list(out.iterdir())
    assert all(json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines())
    return results


def test_ctrl_c_is_one_line_130_on_every_rank_and_leaves_no_half_file(tmp_path):
    """Ctrl-C in a terminal reaches every rank at once (its process group): rank 0 says it, both end with 130, and
    what they wrote is whole."""
    out = tmp_path / "run"
    assert one_line(signalled_after_a_checkpoint(out, signal.SIGINT), 130) == "error: interrupted"
    for ckpt in out.glob("checkpoint-epoch*.pt"):
        assert torch.load(ckpt, weights_only=False)["config"]["model"] == "resnet18"
