"""`launch local kill` on loopback nodes (the rehearsal nodes' case is in test_rehearsal_cluster.py): every process
of the node at once, the others untouched, bad input one line."""

from __future__ import annotations

import pytest
from clusterutil import alive, assert_one_line_error, cluster_state, launch

pytestmark = pytest.mark.cluster


def test_kill_ends_the_node_and_everything_under_it_and_nothing_else(tmp_path):
    home = tmp_path / "home"
    launch(home, "local", "up", "--loopback", "--nodes", "2", check=True)  # loopback: the mode under test
    try:
        state = cluster_state(home)
        node1, node0 = state["processes"]["node1"], state["processes"]["node0"]
        proc = launch(home, "local", "kill", "node1")
        assert proc.returncode == 0, proc.stderr
        assert not alive(node1) and alive(node0)
        assert_one_line_error(launch(home, "exec", "--", "true"), "failed on 1 of 2 node(s): node1")
        assert_one_line_error(launch(home, "local", "kill", "node1"), "node1 of cluster 'local' is not running")
        assert_one_line_error(launch(home, "local", "kill", "node7"), "node7")
    finally:
        launch(home, "local", "down")
