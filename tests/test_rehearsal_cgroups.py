"""Removing a stopped node's cgroups (launcher/local/rehearsal_nodes.py): the kernel removes a cgroup on its own once
its last process is reaped, so a tree listed a moment ago may lose branches while it is walked; `launch local down`
of 64 nodes printed a traceback for one."""

from __future__ import annotations

import os
from pathlib import Path

from launcher.local import rehearsal_nodes as nodes


def test_the_tree_is_listed_deepest_first(tmp_path: Path) -> None:
    for d in ("a/b/c", "a/d", "e"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "a" / "cpu.stat").write_text("usage_usec 1\n")  # a cgroup's files are not cgroups
    found = [p.relative_to(tmp_path).as_posix() for p in nodes.cgroup_tree(tmp_path)]
    assert sorted(found) == ["a", "a/b", "a/b/c", "a/d", "e"]
    assert found.index("a/b/c") < found.index("a/b") < found.index("a")
    (tmp_path / "a" / "cpu.stat").unlink()  # cgroupfs's own files do not keep a cgroup from rmdir; a tmpdir's do
    for p in nodes.cgroup_tree(tmp_path):
        p.rmdir()  # deepest first: every rmdir finds its directory empty
    assert not any(tmp_path.iterdir())


def test_a_branch_that_goes_away_while_the_tree_is_walked_is_skipped(tmp_path: Path, monkeypatch) -> None:
    for d in ("system.slice/modprobe.slice/a", "system.slice/ssh.service"):
        (tmp_path / d).mkdir(parents=True)
    scandir = os.scandir

    def vanishing(path):
        if str(path).endswith("modprobe.slice"):
            (tmp_path / "system.slice/modprobe.slice/a").rmdir()
            (tmp_path / "system.slice/modprobe.slice").rmdir()
        return scandir(path)

    monkeypatch.setattr(nodes.os, "scandir", vanishing)
    found = {p.relative_to(tmp_path).as_posix() for p in nodes.cgroup_tree(tmp_path)}
    assert {"system.slice", "system.slice/ssh.service"} <= found
    assert "system.slice/modprobe.slice/a" not in found
