"""The reducer tier's plan: one MPMD mpirun for workers and reducers, golden-tested; pure, no servers."""

from __future__ import annotations

import pytest
from golden import assert_golden
from test_plan import SPEC, local_cluster

from launcher.plans import job as plan


def reducer_spec(k: int) -> plan.TrainSpec:
    return SPEC.model_copy(update={"engine": "reducer", "reducers": k})


@pytest.mark.parametrize("n,k", [(2, 1), (4, 2)])
def test_mpmd_mpirun_argv(n, k):
    c = local_cluster(n, reducers=k)
    argv = plan.mpmd_mpirun_argv(c, c.workers, c.reducers, reducer_spec(k), "/runs/r1/hostfile")
    text = (f"# hostfile\n{plan.mpmd_hostfile(c.workers, c.reducers)}# mpirun, one argument per line\n"
            + "".join(f"{plan.command_line([a])}\n" for a in argv))
    assert_golden(f"mpirun-reducers-local-{n}-{k}.txt", text)


def test_workers_come_first_then_one_reducer_per_reducer_node():
    c = local_cluster(4, reducers=2)
    argv = plan.mpmd_mpirun_argv(c, c.workers, c.reducers, reducer_spec(2), "/h")
    workers, reducers = argv[:argv.index(":")], argv[argv.index(":") + 1:]
    assert workers[workers.index("-np") + 1] == "4" and reducers[:2] == ["-np", "2"]
    assert reducers[reducers.index("-host") + 1] == "reducer0:1,reducer1:1"
    assert workers[-4:] == ["--engine", "reducer", "--reducers", "2"]
    assert reducers[-5:] == [c.python, "-m", "training.reducer", "--workers", "4"]
    # Both programs meet at the same rendezvous; OpenMPI forwards -x per program, so each has its own.
    for part in (workers, reducers):
        assert "MASTER_ADDR=127.0.0.1" in part and f"MASTER_PORT={plan.DDP_PORT}" in part
    assert "OMP_NUM_THREADS=2" in reducers  # 16 cores over 6 local nodes


def test_mpmd_needs_the_reducer_engine_and_matching_counts():
    c = local_cluster(2, reducers=1)
    with pytest.raises(ValueError, match="engine 'reducer'"):
        plan.mpmd_mpirun_argv(c, c.workers, c.reducers, SPEC, "/h")
    with pytest.raises(ValueError, match="spec.reducers == 1"):
        plan.mpmd_mpirun_argv(c, c.workers, c.reducers, reducer_spec(2), "/h")


def test_specs_without_reducers_plan_as_before():
    c = local_cluster(2)
    assert "--reducers" not in plan.mpirun_argv(c, c.workers, SPEC, "/h")
    assert plan.engine_env(SPEC, c.workers) == {}
