"""`--on-straggler drain` on the job's step (launcher/execute/stragglerdrain.py, jobstep.main), without a cluster: the
fake scontrol and the allocation of tests/test_jobstep_main.py, and a stub mpirun that writes two ranks' progress as
the trainer does (training/progress.py), node1's local time 3x node0's, then runs until it is stopped. Its launch
options (`launch train/run --on-straggler`) are refused before anything starts when they are bad."""

from __future__ import annotations

import json
import os
import time

import pytest
from test_jobstep_main import JOB, Allocation

from launcher import cli
from launcher.execute import progresswatch, stragglerdrain
from launcher.plans import restarts
from launcher.plans.stragglers import Straggler

# Two ranks' steps, node1 2.8x slower (data and forward: 0.31 s against 0.11 s), then the run goes on until it is
# stopped (or, with "finish", ends by itself). Each rank writes its own file, as training/progress.py does.
STRAGGLING_MPIRUN = r"""#!/usr/bin/env bash
printf '%s\n' "$@" >"$STATE/mpirun.argv"
out="$STATE/../run"
mkdir -p "$out/progress"
echo "[1,0]<stdout>:model resnet50, 2 ranks, 100 steps/epoch"
now=$(date +%s)
for step in $(seq 0 11); do
  printf '%s\t%s\t0.01\t0.10\t0.05\t0.01\n' "$step" "$now" >>"$out/progress/rank-0@node0.tsv"
  printf '%s\t%s\t0.01\t0.30\t0.05\t0.01\n' "$step" "$now" >>"$out/progress/rank-1@node1.tsv"
done
echo "[1,0]<stdout>:epoch 0 step 12 loss 6.9"
case "$(cat "$STATE/mpirun-mode")" in
  finish) sleep 7; exit 0 ;;
  *) exec sleep 120 ;;
esac
"""


@pytest.fixture
def alloc(tmp_path, monkeypatch):
    a = Allocation(tmp_path, monkeypatch)
    (tmp_path / "bin" / "mpirun").write_text(STRAGGLING_MPIRUN)
    monkeypatch.setattr(progresswatch, "EVERY_S", 1.0)
    yield a
    a.close()


def drained(alloc: Allocation) -> list[str]:
    return [c for c in alloc.calls() if " State=DRAIN " in c]


def test_drain_drains_the_straggler_stops_the_run_and_requeues_the_job(alloc, monkeypatch, capsys):
    started = time.monotonic()
    code = alloc.run(monkeypatch, restart=0, max_restarts=1, extra=("--on-straggler", "drain"))
    out = capsys.readouterr().out
    assert code == 1 and time.monotonic() - started < 60, out    # stopped, not left to its 120 s
    assert drained(alloc) == ["scontrol update NodeName=node1 State=DRAIN Reason=scaletrain straggler: node1 2.8x "
                              "slower than the other nodes in forward (compute) since step 4"], alloc.calls()
    assert f"scontrol requeue {JOB}" in alloc.calls()
    assert "[job] straggler: draining node1 (" in out and "[job] node1 drained as a straggler; stopped" in out
    history = json.loads((alloc.output / restarts.RECORD_FILE).read_text())["history"]
    assert [(h["attempt"], h["lost"]) for h in history] == [(1, ["node1"])]
    assert history[0]["why"] == drained(alloc)[0].split("Reason=", 1)[1]


def test_warn_names_the_straggler_and_drains_nothing(alloc, monkeypatch, capsys):
    alloc.set(mode="finish")
    assert alloc.run(monkeypatch, restart=0, max_restarts=1) == 0
    out = capsys.readouterr().out
    assert "[job] straggler: node1 (rank 1) is 2.8x slower" in out and "draining" not in out
    assert drained(alloc) == [] and f"scontrol requeue {JOB}" not in alloc.calls()


def test_drain_with_no_restart_left_names_it_once_and_the_run_goes_on(alloc, monkeypatch, capsys):
    alloc.set(mode="finish")
    assert alloc.run(monkeypatch, restart=1, max_restarts=1, extra=("--on-straggler", "drain")) == 0
    out = capsys.readouterr().out
    assert out.count("[job] straggler: node1 not drained: no restart left (--max-restarts 1, 1 done)") == 1, out
    assert drained(alloc) == [] and f"scontrol requeue {JOB}" not in alloc.calls()


def test_a_restarted_attempt_sets_the_last_attempts_progress_aside(tmp_path):
    (tmp_path / "progress").mkdir()
    (tmp_path / "progress" / "rank-1@node1.tsv").write_text("0\t1.0\t0.1\t0.1\t0.1\t0.1\n")
    stragglerdrain.set_aside_progress(tmp_path, 0)          # the first attempt: nothing to set aside
    assert (tmp_path / "progress").is_dir()
    stragglerdrain.set_aside_progress(tmp_path, 1)
    assert not (tmp_path / "progress").exists()
    assert (tmp_path / "progress.attempt-1" / "rank-1@node1.tsv").exists()


def drainer(tmp_path, say=print) -> stragglerdrain.Drainer:
    return stragglerdrain.Drainer(policy="drain", output=tmp_path, job_id=JOB, restart=0, max_restarts=1,
                                  checkpoints=True, say=say)


def test_the_run_stops_at_the_next_checkpoint(alloc, tmp_path):
    run = tmp_path / "run"
    old = run / "checkpoint-epoch000.pt"
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 300, time.time() - 300))       # 300 s of work since: a 100 s wait at 3x
    d = drainer(run)
    d.on_found([Straggler("node1", (1,), 3.0, 40, "forward")], 2)
    assert d.halt() is None
    (run / "checkpoint-epoch001-step00000150.pt").write_bytes(b"x")
    assert d.halt() == "node1 drained as a straggler; stopped after checkpoint checkpoint-epoch001-step00000150.pt"


def test_the_wait_for_a_checkpoint_ends_when_repeating_the_work_would_cost_less(alloc, tmp_path, monkeypatch):
    run = tmp_path / "run"
    old = run / "checkpoint-epoch000.pt"
    old.write_bytes(b"x")
    os.utime(old, (time.time() - 300, time.time() - 300))
    d = drainer(run)
    d.on_found([Straggler("node1", (1,), 3.0, 40, "forward")], 2)
    now = time.monotonic()
    monkeypatch.setattr(stragglerdrain.time, "monotonic", lambda: now + 98)
    assert d.halt() is None                                       # inside 100 s
    monkeypatch.setattr(stragglerdrain.time, "monotonic", lambda: now + 101)
    assert d.halt() == "node1 drained as a straggler; stopped"


def test_one_drain_per_attempt_whatever_is_named_after(alloc, tmp_path):
    d = drainer(tmp_path / "run", say=lambda line: None)
    d.on_found([Straggler("node1", (1,), 3.0, 40, "forward")], 3)
    d.on_found([Straggler("node2", (2,), 4.0, 48, "data")], 3)
    assert [c.split()[2] for c in drained(alloc)] == ["NodeName=node1"]


def launch(tmp_path, monkeypatch, capsys, *args: str) -> tuple[int, str]:
    monkeypatch.setenv("SCALETRAIN_HOME", str(tmp_path / "home"))
    for key in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    code = cli.main(list(args))
    return code, capsys.readouterr().err


@pytest.mark.parametrize("command", [["train"], ["run", "--workdir", "."]])
@pytest.mark.parametrize(("args", "said"), [
    (["--on-straggler", "kill"], "error: --on-straggler must be warn or drain, got 'kill'"),
    (["--on-straggler", "Drain", "--max-restarts", "1"], "error: --on-straggler must be warn or drain, got 'Drain'"),
    (["--on-straggler", "drain"], "error: --on-straggler drain requeues the job without the straggler, a restart: "
                                  "it needs --max-restarts 1 or more, got 0"),
])
def test_bad_on_straggler_is_one_line_exit_2_before_anything_starts(command, args, said, tmp_path, monkeypatch,
                                                                    capsys):
    code, err = launch(tmp_path, monkeypatch, capsys, *command, *args, *(["--", "true"] if command[0] == "run"
                                                                         else []))
    assert code == 2 and err == f"{said} (see `launch {command[0]} --help`)\n", err


@pytest.mark.parametrize("command", [["train"], ["run", "--workdir", "."]])
@pytest.mark.parametrize("args", [["--on-straggler", "warn"], ["--on-straggler", "drain", "--max-restarts", "1"]])
def test_good_on_straggler_passes_to_finding_the_cluster(command, args, tmp_path, monkeypatch, capsys):
    """Past the checks the next answer is the cluster's (none here: AWS's stack cannot be read without
    credentials)."""
    code, err = launch(tmp_path, monkeypatch, capsys, *command, *args, *(["--", "true"] if command[0] == "run"
                                                                         else []))
    assert code == 1 and "on-straggler" not in err, err


def test_a_drained_aws_node_has_its_own_instance_marked_unhealthy(tmp_path, monkeypatch, capsys):
    """launcher/doctor/health.mark_unhealthy: its id and region from IMDSv2 (a token first, then the token on every
    request), then the AWS CLI's set-instance-health for that instance (a stub here records its argv)."""
    import http.server
    import threading

    from ami import paths
    from launcher.doctor import health
    from launcher.plans import imds

    asked: list[tuple[str, str | None]] = []

    class Imds(http.server.BaseHTTPRequestHandler):
        def do_PUT(self):
            asked.append(("PUT " + self.path, self.headers.get(imds.TTL_HEADER)))
            self._answer("token-1")

        def do_GET(self):
            asked.append(("GET " + self.path, self.headers.get(imds.TOKEN_HEADER)))
            self._answer({"/latest/meta-data/instance-id": "i-0abc",
                          "/latest/meta-data/placement/region": "eu-west-1"}[self.path])

        def _answer(self, text: str) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(text.encode())

        def log_message(self, *_):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Imds)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    aws = tmp_path / "aws"
    aws.write_text(f"#!/bin/sh\necho \"$@\" >{tmp_path / 'argv'}\n")
    aws.chmod(0o755)
    monkeypatch.setattr(health, "IMDS", f"http://127.0.0.1:{server.server_port}/latest")
    monkeypatch.setattr(paths, "AWS_CLI", str(aws))
    try:
        health.mark_unhealthy("node1", time.monotonic() + 10)
    finally:
        server.shutdown()
    assert asked == [("PUT /latest/api/token", "60"), ("GET /latest/meta-data/instance-id", "token-1"),
                     ("GET /latest/meta-data/placement/region", "token-1")]
    assert (tmp_path / "argv").read_text().split() == [
        "autoscaling", "set-instance-health", "--instance-id", "i-0abc", "--health-status", "Unhealthy",
        "--no-should-respect-grace-period", "--region", "eu-west-1"]
    assert "node1 (i-0abc) is drained for replacement; marked Unhealthy" in capsys.readouterr().out


def test_drain_on_a_run_from_this_machine_is_refused_with_one_line():
    """A cluster without a head node that answers runs mpirun from the launcher: no job's step to drain and requeue."""
    import types

    from launcher.cli.train import _checked, _on_local
    from launcher.errors import LaunchError

    kw = dict(nodes=None, data=None, model="resnet18", image_size=32, epochs=2, batch_per_gpu=2, warmup_epochs=None,
              workers=None, engine="ddp", reducers=0, out=None, output=None, resume=False, teardown=False,
              region=None, profile=None, ready_timeout=0, probe_interval=15, probe_misses=4, stall_timeout=0,
              max_restarts=1, checkpoint_to=None)
    with pytest.raises(LaunchError, match=r"^--on-straggler drain is the job's step's .* and cluster 'local' has no "
                                          r"head node that answers; leave it out"):
        _on_local(types.SimpleNamespace(name="local"), _checked(None, **kw, on_straggler="drain"))
