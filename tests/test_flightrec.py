"""NCCL's flight recorder beside a stalled rank's stack (launcher/plans/flightrec.py, launcher/execute/stacks.py):
what the GPU ranks are given, how a dump is read (plain data only), what the summary says, and the pipe protocol
against a process that keeps a pipe and a dump as torch's ProcessGroupNCCL does (DumpPipe: a FIFO
``<stem><rank>.pipe`` opened O_RDONLY|O_NONBLOCK, a read of more than nothing dumps the recorder to the temp file).
The torch side itself runs only on a GPU: tests/test_gpu.py."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import time

import pytest

from launcher.execute import stacks
from launcher.plans import flightrec, hangs

DUMP = {"version": "2.4", "pg_config": {}, "entries": [
    {"record_id": 10, "collective_seq_id": 11, "profiling_name": "nccl:all_reduce", "state": "completed"},
    {"record_id": 11, "collective_seq_id": 12, "profiling_name": "nccl:all_reduce", "state": "started"},
    {"record_id": 9, "collective_seq_id": 10, "profiling_name": "nccl:broadcast", "state": "completed"},
]}


def test_gpu_ranks_keep_the_recorder_and_its_pipe_in_tmp():
    env = flightrec.ENV
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "2000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert flightrec.ENV["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"].startswith("/tmp/")
    assert flightrec.pipe_path("/tmp/fr-", 3) == "/tmp/fr-3.pipe" and flightrec.dump_path("/tmp/fr-", 3) == "/tmp/fr-3"


@pytest.mark.parametrize(("state", "said"), [("started", "started, not completed"),
                                             ("scheduled", "scheduled, not started"), ("completed", "completed")])
def test_the_summary_is_the_newest_collective_and_its_state(state, said):
    dump = {**DUMP, "entries": [*DUMP["entries"][:1], {**DUMP["entries"][1], "state": state}, DUMP["entries"][2]]}
    assert flightrec.summary(flightrec.load(pickle.dumps(dump, protocol=2))) == f"NCCL: nccl:all_reduce #12 {said}"
    assert flightrec.summary({"entries": []}) == "NCCL: no collective recorded" and flightrec.summary(None) is None


def test_a_dump_is_plain_data_or_nothing():
    import json

    assert flightrec.load(json.dumps(DUMP).encode()) == DUMP
    assert flightrec.load(pickle.dumps(os.getcwd)) is None        # names a function: refused, never called
    assert flightrec.load(b"\x80\x05garbage") is None and flightrec.load(pickle.dumps([1, 2])) is None


def test_ranks_at_different_collectives_are_told_apart_though_their_stacks_agree():
    stack = 'Process 7: python\nThread 7 (idle): "MainThread"\n    allreduce (training/engine.py:10)\n'
    ranks = {0: hangs.Rank(0, "node0", stack, 41, "NCCL: nccl:all_reduce #12 started, not completed"),
             1: hangs.Rank(1, "node1", stack, 41, "NCCL: nccl:all_reduce #11 completed")}
    lines = hangs.summary(ranks)
    assert len(lines) == 2 and any("rank 1 on node1" in ln and "#11 completed" in ln for ln in lines), lines


FAKE_RANK = r"""
import os, pickle, select, sys
stem, rank = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"], os.environ["OMPI_COMM_WORLD_RANK"]
pipe = f"{stem}{rank}.pipe"
try:
    os.unlink(pipe)
except FileNotFoundError:
    pass
os.mkfifo(pipe)
fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
print("ready", flush=True)
while True:
    select.select([fd], [], [], 1.0)
    try:
        got = os.read(fd, 128)
    except BlockingIOError:
        continue
    if got:
        with open(os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + rank, "wb") as f:
            pickle.dump(pickle.loads(bytes.fromhex(sys.argv[1])), f)
"""


def test_a_rank_asked_through_its_pipe_dumps_and_the_summary_reads_it(tmp_path):
    stem = str(tmp_path / "fr-rank")
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "3", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem,
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": stem}
    proc = subprocess.Popen([sys.executable, "-c", FAKE_RANK, pickle.dumps(DUMP, protocol=2).hex()], env=env,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        poked = stacks.poke_recorder(proc.pid, 3)
        assert poked == (f"{stem}3", 0.0)
        assert stacks.recorder_dump(poked, time.monotonic() + 10) == "NCCL: nccl:all_reduce #12 started, not completed"
        assert stacks.poke_recorder(os.getpid(), 3) is None       # a process without the recorder's variables
    finally:
        proc.kill()
        proc.wait()
    assert stacks.poke_recorder(proc.pid, 3) is None              # gone: no environment to read


def test_a_pipe_with_no_reader_is_not_waited_on(tmp_path):
    """The rank's watchdog gone (its pipe left behind): the write fails at once (ENXIO), nothing is asked."""
    stem = str(tmp_path / "fr-rank")
    os.mkfifo(f"{stem}5.pipe")
    env = {**os.environ, "OMPI_COMM_WORLD_RANK": "5", "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": stem,
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": stem}
    proc = subprocess.Popen([sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(60)"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        started = time.monotonic()
        assert stacks.poke_recorder(proc.pid, 5) is None and time.monotonic() - started < 1
    finally:
        proc.kill()
        proc.wait()
    assert stacks.recorder_dump((f"{stem}5", 0.0), time.monotonic() + 0.3) == "NCCL: no dump within the time"


def test_only_gpu_workers_on_aws_keep_the_recorder():
    from test_aws_plans import cluster

    assert flightrec.for_cluster(cluster("p4d.24xlarge")) == flightrec.ENV
    assert flightrec.for_cluster(cluster("p4d.24xlarge", efa=False)) == flightrec.ENV  # NCCL over TCP: still NCCL
    local = cluster("p4d.24xlarge").model_copy(update={"backend": "local", "instance_type": None})
    assert flightrec.for_cluster(local) == {}
