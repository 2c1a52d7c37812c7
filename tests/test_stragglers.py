"""Stragglers and stalls named from each rank's per-step times (launcher/plans/stragglers.py), at their boundaries:
a node just over and just under the factor, for one step short of the window and for the window; the phase that is
slow; ranks that stopped moving. And the ranks' side (training/progress.py): what it writes is what the job reads."""

from __future__ import annotations

import json
import subprocess

import pytest

from launcher.plans import stragglers as sg
from training import progress as pr

NODES = {0: "node0", 1: "node0", 2: "node1", 3: "node1", 4: "node2", 5: "node2"}


def steps(n: int, *, data: float = 0.01, forward: float = 0.1, first: int = 0) -> list[sg.StepTime]:
    return [sg.StepTime(step=first + i, start=1000.0 + i, data=data, forward=forward, backward=0.2, optimizer=0.05)
            for i in range(n)]


def times(slow: dict[int, list[sg.StepTime]] | None = None, n: int = sg.WINDOW) -> dict[int, list[sg.StepTime]]:
    base = {r: steps(n) for r in NODES}
    return {**base, **(slow or {})}


def test_a_node_over_the_factor_for_the_whole_window_is_named_with_its_phase():
    slow = times({2: steps(sg.WINDOW, forward=0.1 * 1.6 - 0.01 * 0.6), 3: steps(sg.WINDOW, forward=0.2)})
    found = sg.find(slow, NODES)
    assert [(s.node, s.ranks, s.phase, s.since_step) for s in found] == [("node1", (2, 3), "forward", 0)]
    assert found[0].line().startswith("straggler: node1 (rank 2,3) is ") and "in forward (compute) since step 0" in \
        found[0].line()


def test_at_the_factor_or_under_it_no_one_is_named():
    # the node's median local time exactly FACTOR x the others': not over it
    exact = sg.FACTOR * 0.11 - 0.01
    assert sg.find(times({2: steps(sg.WINDOW, forward=exact), 3: steps(sg.WINDOW, forward=exact)}), NODES) == []
    assert sg.find(times({2: steps(sg.WINDOW, forward=exact + 0.001),
                          3: steps(sg.WINDOW, forward=exact + 0.001)}), NODES)[0].node == "node1"


def test_one_step_short_of_the_window_names_no_one_and_one_fast_step_in_it_clears_it():
    short = {r: steps(sg.WINDOW - 1, forward=0.5 if NODES[r] == "node2" else 0.1) for r in NODES}
    assert sg.find(short, NODES) == []
    full = {r: steps(sg.WINDOW, forward=0.5 if NODES[r] == "node2" else 0.1) for r in NODES}
    assert [s.node for s in sg.find(full, NODES)] == ["node2"]
    for r in (4, 5):  # one step in the window at the others' pace (another node's own slow step): still named
        full[r][3] = steps(1, first=3)[0]
    assert [s.node for s in sg.find(full, NODES)] == ["node2"] and sg.TOLERATED == 1
    for r in (4, 5):  # two such steps: not over the factor "for WINDOW steps in a row" but one
        full[r][6] = steps(1, first=6)[0]
    assert sg.find(full, NODES) == []


def test_a_node_slow_in_its_data_is_named_for_data():
    slow = times({4: steps(sg.WINDOW, data=0.3), 5: steps(sg.WINDOW, data=0.3)})
    assert [(s.node, s.phase) for s in sg.find(slow, NODES)] == [("node2", "data")]


def test_the_reduction_wait_names_no_one():
    # everyone leaves the step together: the fast ranks' wait is in backward (DDP) or the optimizer (Horovod)
    waiting = {r: [sg.StepTime(i, 0, 0.01, 0.1, 5.0 if NODES[r] != "node1" else 0.1, 0.05) for i in range(20)]
               for r in NODES}
    assert sg.find(waiting, NODES) == []


def test_one_node_or_missing_steps_name_no_one():
    assert sg.find({0: steps(20, forward=9), 1: steps(20)}, {0: "node0", 1: "node0"}) == []
    ragged = times({2: steps(sg.WINDOW, forward=0.9), 3: steps(sg.WINDOW, forward=0.9)})
    ragged[0] = ragged[0][:-1]  # rank 0 has not written its last step yet: only steps every rank has count
    assert sg.find(ragged, NODES) == []
    assert sg.find({**ragged, 0: steps(sg.WINDOW + 1)}, NODES)[0].node == "node1"


def test_a_stall_names_the_ranks_behind():
    s = sg.stall({0: 41, 1: 41, 2: 40, 3: 41, 4: None})
    assert s.behind == {2: 40, 4: -1} and s.ahead == (0, 1, 3) and s.step == 41
    assert sg.stall({0: 5, 1: 5}).behind == {}
    assert sg.ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and sg.ranges([]) == "" and sg.ranges([3]) == "3"


@pytest.mark.parametrize("line", ["", "1\t2\t3", "x\t1\t1\t1\t1\t1", "1\t1\t1\t1\t1\tnan", "-1\t1\t1\t1\t1\t1",
                                  "1\t1\t1\t1\t1\t-0.5", "1\t1\t1\t1\t1\t1\t1"])
def test_torn_or_foreign_lines_are_skipped(line):
    assert sg.parse(line) is None


def test_what_a_rank_writes_is_what_the_job_reads(tmp_path, monkeypatch):
    monkeypatch.setenv(pr.ENV, str(tmp_path / "progress"))
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    p = pr.Progress.from_env()
    import socket

    assert p.enabled and p.path == tmp_path / "progress" / f"rank-3@{socket.gethostname().split('.')[0]}.tsv"
    for step in range(3):
        p.add("data", 0.25)
        with p.phase("forward"):
            pass
        p.add("optimizer", 1.5)
        p.step_done(step)
    p.close()
    got = [sg.parse(ln) for ln in p.path.read_text().splitlines()]
    assert [t.step for t in got] == [0, 1, 2] and all(t.data == 0.25 and t.optimizer == 1.5 for t in got)
    assert all(sg.format_line(t) and sg.parse(sg.format_line(t)) == t for t in got)


def test_without_the_directory_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.delenv(pr.ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    p = pr.Progress.from_env()
    p.step_done(0)
    p.close()
    assert not p.enabled and list(tmp_path.iterdir()) == []


def test_a_step_reaches_the_file_within_the_flush_period(tmp_path):
    p = pr.Progress(tmp_path / "rank-0.tsv", flush_every_s=0.0)
    p.step_done(7)
    assert (tmp_path / "rank-0.tsv").read_text().startswith("7\t")  # flushed now: the job's step sees it
    slow = pr.Progress(tmp_path / "rank-1.tsv", flush_every_s=3600)
    slow.step_done(0)
    slow.step_done(1)
    assert (tmp_path / "rank-1.tsv").read_text().startswith("0\t")  # the first step goes at once ...
    assert (tmp_path / "rank-1.tsv").read_text().count("\n") == 1  # ... then once a period
    slow.close()
    assert len((tmp_path / "rank-1.tsv").read_text().splitlines()) == 2


class FakeGpu:
    """CUDA events as the GPU would answer them: an event is passed once the fake GPU has run that far (`run_to`),
    and the time between two events is what the GPU spent between them, not what the host did."""

    def __init__(self):
        self.clock_ms, self.recorded, self.passed = 0.0, 0, 0
        self.synchronized = 0

    def event(self):
        gpu = self

        class Event:
            def record(self):
                gpu.recorded += 1
                self.n, self.at = gpu.recorded, gpu.clock_ms

            def query(self):
                return self.n <= gpu.passed

            def synchronize(self):
                gpu.synchronized += 1
                gpu.passed = max(gpu.passed, self.n)

            def elapsed_time(self, end):
                return end.at - self.at

        return Event()


def test_on_a_gpu_a_phase_is_its_gpu_time_written_once_the_gpu_has_passed_it(tmp_path, monkeypatch):
    gpu = FakeGpu()
    p = pr.Progress(tmp_path / "rank-0.tsv", flush_every_s=0.0, device=type("D", (), {"type": "cuda"})())
    monkeypatch.setattr(p, "_event", gpu.event)
    for step in range(2):
        p.add("data", 0.5)                 # the host's wait for a batch: its own clock, as on a CPU
        with p.phase("forward"):
            gpu.clock_ms += 300.0          # kernels queued: the GPU will spend 300 ms here, the host none
        with p.phase("optimizer"):
            gpu.clock_ms += 20.0
        p.step_done(step)
    assert (tmp_path / "rank-0.tsv").read_text() == ""  # the GPU has passed neither step: nothing written yet
    gpu.passed = 4                                          # the first step's four events
    p.step_done(2)                                          # an empty step, still pending
    first = [sg.parse(ln) for ln in (tmp_path / "rank-0.tsv").read_text().splitlines()]
    assert [(t.step, t.data, t.forward, t.optimizer) for t in first] == [(0, 0.5, 0.3, 0.02)]
    assert gpu.synchronized == 0                            # no wait on the hot path
    p.close()                                               # the rest waited for, in order
    got = [sg.parse(ln) for ln in (tmp_path / "rank-0.tsv").read_text().splitlines()]
    assert [(t.step, t.forward) for t in got] == [(0, 0.3), (1, 0.3), (2, 0.0)]


def test_a_gpu_far_behind_the_host_is_waited_for_at_the_bound(tmp_path, monkeypatch):
    gpu = FakeGpu()
    p = pr.Progress(tmp_path / "rank-0.tsv", device=type("D", (), {"type": "cuda"})())
    monkeypatch.setattr(p, "_event", gpu.event)
    for step in range(pr.MAX_PENDING):
        with p.phase("forward"):
            gpu.clock_ms += 1.0
        p.step_done(step)
    assert gpu.synchronized == 0 and len(p._pending) == pr.MAX_PENDING
    with p.phase("forward"):
        gpu.clock_ms += 1.0
    p.step_done(pr.MAX_PENDING)
    assert gpu.synchronized == 1 and len(p._pending) == pr.MAX_PENDING
    p.close()


def _write(d, rank, node, ts, *, tail=""):
    with open(d / f"rank-{rank}@{node}.tsv", "a") as f:
        f.write("".join(sg.format_line(t) for t in ts) + tail)


def test_the_job_names_a_straggler_once_and_keeps_it_for_jobs_and_logs(tmp_path):
    import json

    from launcher.execute import progresswatch

    d = tmp_path / "progress"
    d.mkdir()
    said: list[str] = []
    w = progresswatch.Watcher(tmp_path, said.append)
    for r, node in NODES.items():
        _write(d, r, node, steps(sg.WINDOW - 1, forward=0.4 if node == "node2" else 0.1))
    # rank 4's next line is half written: it is not a step yet
    _write(d, 4, "node2", [], tail="7\t1007.000\t0.01")
    assert w.look() == [] and said == [] and not (tmp_path / progresswatch.RECORD).exists()
    for r, node in NODES.items():
        if r == 4:
            _write(d, r, node, [], tail="0000\t0.400000\t0.200000\t0.050000\n")
        else:
            _write(d, r, node, steps(1, first=sg.WINDOW - 1, forward=0.4 if node == "node2" else 0.1))
    assert [s.node for s in w.look()] == ["node2"]
    assert said == ["straggler: node2 (rank 4,5) is 3.7x slower than the other nodes in forward (compute) since "
                    "step 0"]
    w.look()
    assert len(said) == 1  # said once
    kept = json.loads((tmp_path / progresswatch.RECORD).read_text())["stragglers"]
    assert [(k["node"], k["ranks"], k["phase"]) for k in kept] == [("node2", [4, 5], "forward")]
    assert w.last_steps() == dict.fromkeys(NODES, sg.WINDOW - 1)


def test_a_requeued_attempts_steps_replace_the_old_ones(tmp_path):
    from launcher.execute import progresswatch

    d = tmp_path / "progress"
    d.mkdir()
    w = progresswatch.Watcher(tmp_path, lambda line: None)
    _write(d, 0, "node0", steps(20))
    w.read_new()
    _write(d, 0, "node0", steps(3, first=10))  # resumed from a checkpoint at step 10
    w.read_new()
    assert [t.step for t in w.times[0]] == [10, 11, 12]


def test_launch_jobs_reads_each_run_directorys_record_in_one_command(tmp_path):
    """records_query, run by a shell as the head node runs it, prints each record after its directory's mark;
    parse_records takes them apart: a missing record, a torn one and one of another shape name no one."""
    good, torn, foreign, missing = (tmp_path / n for n in ("good run", "torn", "foreign", "missing"))
    for d in (good, torn, foreign):
        d.mkdir()
    named = {"node": "node2", "ranks": [2], "ratio": 2.04, "since_step": 40, "phase": "data", "line": "x",
             "seen_at": 1.0}
    (good / sg.RECORD).write_text(json.dumps({"stragglers": [named]}))
    (torn / sg.RECORD).write_text('{"stragglers": [{"node": "no')
    (foreign / sg.RECORD).write_text(json.dumps({"stragglers": [{"node": "node1"}]}))
    dirs = [str(good), str(torn), str(foreign), str(missing) + "/"]
    text = subprocess.run(["sh", "-c", sg.records_query(dirs)], capture_output=True, text=True).stdout
    found = sg.parse_records(text)
    assert found == {str(good): [{"node": "node2", "ranks": [2], "ratio": 2.04, "since_step": 40, "phase": "data"}]}
    assert sg.summary(found[str(good)]) == "node2 2.0x data from step 40"
    assert sg.summary([]) == "-"
    assert sg.records_query([]) == "true"
