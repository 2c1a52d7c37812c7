"""A node whose health check keeps failing is replaced, and a shared fault replaces nothing (issue 47 item 3):
plans/draining.health_replacement decides, launcher/doctor/health.py's main counts the failures in a row across its
runs (as slurmd runs it every HealthCheckInterval) and marks the instance Unhealthy. The node's tools are stood in
for at the main's own seams: its probes and checks, scontrol, and the call that marks the instance."""

from __future__ import annotations

import pytest

from launcher.doctor import checks, health
from launcher.plans import draining, slurm

N = draining.HEALTH_FAILS_TO_REPLACE


def test_a_pass_resets_the_failures_in_a_row():
    assert draining.health_fails(0, True) == 1 and draining.health_fails(2, True) == 3
    assert draining.health_fails(2, False) == 0


@pytest.mark.parametrize(("fails", "drained", "nodes", "replaced"), [
    (N - 1, 1, 8, False),      # one check short
    (N, 1, 8, True),
    (N, 2, 8, True),           # a quarter of the cluster: still one node's fault
    (N, 3, 8, False),          # more than a quarter at once: shared
    (N, 1, 2, True),           # at least one node may always be replaced
    (N, 2, 2, False),
    (N, 1, 1, True),
])
def test_replaced_after_enough_failures_in_a_row_unless_the_fault_is_shared(fails, drained, nodes, replaced):
    replace, line = draining.health_replacement(fails, drained, nodes)
    assert replace is replaced
    if fails < N:
        assert line is None
    elif replaced:
        assert line == f"failed {fails} health checks in a row ({drained} of {nodes} nodes drained by the health " \
                       "check): replaced"
    else:
        assert "a fault they share, which a replacement would not fix; not replaced" in line


def _record(name: str, drained: bool) -> str:
    state, reason = ("IDLE+DRAIN", f"{slurm.DRAIN_PREFIX}gpus: nvidia-smi failed") if drained else ("IDLE", "(null)")
    return f"NodeName={name} Arch=x86_64 State={state} Reason={reason}"


@pytest.fixture
def node(tmp_path, monkeypatch):
    """A p4d node whose GPU check fails while ``state["failing"]``; ``state["drained"]``: how many of its 8-node
    cluster the health check has drained (this one first)."""
    state = {"failing": True, "drained": 1, "marked": [], "updates": []}

    def evaluate(a, probes):
        return [checks.fail("gpus", "nvidia-smi failed: No devices were found")] if state["failing"] else []

    def scontrol(args, until):
        if args[:3] == ["--oneliner", "show", "nodes"]:
            return "\n".join(_record(f"node{i}", i < state["drained"]) for i in range(8)) + "\n"
        if args[:3] == ["--oneliner", "show", "node"]:
            return _record(args[3], state["failing"]) + "\n"
        state["updates"].append(args)
        return ""

    monkeypatch.setattr(health, "run_probes", lambda probes, limits, prefix="": {})
    monkeypatch.setattr(health, "evaluate", evaluate)
    monkeypatch.setattr(health, "scontrol", scontrol)
    monkeypatch.setattr(health, "mark_unhealthy", lambda node, until, why="": state["marked"].append(why))
    monkeypatch.setattr(health, "cuda_driver_version", lambda: checks.Probe("CUDA Version: 12.8\n", 0))
    args = ["--backend", "aws", "--python", "/opt/venv/bin/python", "--mpirun", "/opt/mpi/bin/mpirun",
            "--instance-type", "p4d.24xlarge", "--storage", "none", "--efa-devices", "4",
            "--state-dir", str(tmp_path / "run")]
    state["check"] = lambda: health.main(args)
    return state


def test_the_third_failed_check_in_a_row_marks_the_instance_and_not_before(node):
    for _ in range(N - 1):
        assert node["check"]() == 1
    assert node["marked"] == [] and len(node["updates"]) == N - 1          # drained each time, not replaced
    assert node["check"]() == 1
    assert node["marked"] == [f"failed {N} health checks in a row (1 of 8 nodes drained by the health check): "
                              "replaced"]


def test_a_check_that_passes_between_failures_never_replaces(node):
    for _ in range(3):
        for failing in [True] * (N - 1) + [False]:
            node["failing"] = failing
            node["check"]()
    assert node["marked"] == []


def test_a_fault_most_nodes_share_replaces_none(node, capsys):
    node["drained"] = 3
    for _ in range(N + 1):
        node["check"]()
    assert node["marked"] == []
    assert "3 of 8 nodes drained by the health check (more than 25%): a fault they share" in capsys.readouterr().out


def test_the_rehearsals_local_check_never_marks_an_instance(node, tmp_path):
    local = ["--backend", "local", "--python", "/opt/venv/bin/python", "--mpirun", "/opt/mpi/bin/mpirun",
             "--state-dir", str(tmp_path / "local")]
    for _ in range(N + 1):
        assert health.main(local) == 1
    assert node["marked"] == [] and len(node["updates"]) == N + 1
