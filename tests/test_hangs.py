"""A stalled run's ranks located (launcher/plans/hangs.py, launcher/execute/stacks.py): py-spy's dump read as py-spy
prints it, the ranks grouped by where they wait and their last step, and on a node the rank processes told from
their loader workers and dumped for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from launcher.execute import stacks
from launcher.plans import hangs

IN_ALLREDUCE = textwrap.dedent('''\
    Process 4242: /opt/scaletrain/venv/bin/python -m training.train --data /fsx/shards
    Python v3.10.12 (/usr/bin/python3.10)

    Thread 4250 (idle): "Thread-3 (_pin_memory_loop)"
        select (selectors.py:416)
    Thread 4242 (idle): "MainThread"
        _allreduce_nocomplex (torch/distributed/distributed_c10d.py:2501)
        allreduce (training/engine.py:170)
        run_epoch (training/train.py:261)
        main (training/train.py:410)
        <module> (training/train.py:496)
    ''')
IN_LOADER = textwrap.dedent('''\
    Process 777: python -m training.train
    Python v3.10.12 (/usr/bin/python3.10)

    Thread 777 (idle): "MainThread"
        poll (multiprocessing/connection.py:440)
        _try_get_data (torch/utils/data/dataloader.py:1133)
        _next_data (torch/utils/data/dataloader.py:1295)
        __next__ (torch/utils/data/dataloader.py:733)
        run_epoch (training/train.py:240)
    ''')


def test_the_main_thread_innermost_first_and_what_it_is_doing():
    frames = hangs.main_thread(IN_ALLREDUCE)
    assert frames[0] == hangs.Frame("_allreduce_nocomplex", "torch/distributed/distributed_c10d.py", 2501)
    assert len(frames) == 5  # the pin-memory thread's frame is not the main thread's
    assert hangs.where(frames) == "in allreduce: _allreduce_nocomplex (distributed/distributed_c10d.py:2501)"
    assert hangs.where(hangs.main_thread(IN_LOADER)) == \
        "in the loader's next(): _try_get_data (data/dataloader.py:1133)"
    assert hangs.where(hangs.main_thread("Process 1: x\n")) == "no stack (the node or its ranks did not answer)"
    plain = "Thread 9 (active): \"MainThread\"\n    spin (mine.py:3)\n    <module> (mine.py:9)\n"
    assert hangs.where(hangs.main_thread(plain)) == "in spin (mine.py:3)"
    # py-spy names no thread in a forked process: the main thread is the one whose id is the process's
    unnamed = "Process 12: python x.py\n\nThread 13 (idle)\n    helper (x.py:1)\nThread 12 (idle)\n    spin (x.py:3)\n"
    assert hangs.main_thread(unnamed) == [hangs.Frame("spin", "x.py", 3)]


def test_ranks_are_grouped_by_place_and_step_the_ones_behind_first():
    ranks = {r: hangs.Rank(r, f"node{r // 2}", IN_ALLREDUCE, 1234) for r in (0, 1, 2, 4, 5, 6, 7)}
    ranks[3] = hangs.Rank(3, "node1", IN_LOADER, 1233)
    ranks[8] = hangs.Rank(8, "node4", None, None)
    assert hangs.summary(ranks) == [
        "rank 8 on node4: no stack (the node or its ranks did not answer), before its first step",
        "rank 3 on node1: in the loader's next(): _try_get_data (data/dataloader.py:1133), after step 1233",
        "ranks 0-2, 4-7 on node0, node1, node2, node3: in allreduce: _allreduce_nocomplex "
        "(distributed/distributed_c10d.py:2501), after step 1234",
    ]


@pytest.fixture
def a_rank(tmp_path):
    """A rank of Open MPI's making (OMPI_COMM_WORLD_RANK in its environment) waiting in a function of its own, with
    a loader worker (a child with the same environment)."""
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent('''\
        import os, sys, time
        def waiting_in_allreduce():
            time.sleep(120)
        if os.fork() == 0:
            time.sleep(120)
            os._exit(0)
        print("ready", flush=True)
        waiting_in_allreduce()
        '''))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "OMPI_COMM_WORLD_RANK": "97"}, start_new_session=True)
    assert proc.stdout.readline() == "ready\n"
    yield proc
    os.killpg(proc.pid, 9)
    proc.wait()


def test_a_rank_is_found_without_its_worker_and_py_spy_dumps_it(a_rank):
    found = stacks.ranks_here()
    assert found.get(97) == a_rank.pid
    tool = stacks.py_spy()
    assert tool is not None, "py-spy is part of the train extra (pyproject.toml)"
    text = stacks.dump(a_rank.pid, tool)
    assert text is not None and hangs.where(hangs.main_thread(text)).startswith("in allreduce: waiting_in_allreduce")


def test_a_frozen_rank_gives_no_stack_within_the_timeout(a_rank, monkeypatch):
    monkeypatch.setattr(stacks, "DUMP_TIMEOUT_S", 2)
    os.kill(a_rank.pid, 19)  # SIGSTOP: py-spy cannot read a stopped process's stack in time
    try:  # it returns (the dump's own timeout bounds it), with the stack or with none: never a traceback
        got = stacks.dump(a_rank.pid, stacks.py_spy() or "py-spy")
        assert got is None or "waiting_in_allreduce" in got
    finally:
        os.kill(a_rank.pid, 18)


def test_the_node_side_prints_one_json_line_per_rank(a_rank):
    out = subprocess.run([sys.executable, "-m", "launcher.execute.stacks"], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1], timeout=120)
    lines = [json.loads(ln) for ln in out.stdout.splitlines()]
    mine = [d for d in lines if d["rank"] == 97]
    assert len(mine) == 1 and "waiting_in_allreduce" in (mine[0]["dump"] or ""), out.stdout + out.stderr
