"""`launch train --max-restarts`: what runs between a lost node and the resumed run (the decisions are in
launcher/plans/restarts.py): the newest complete checkpoint, the run's restart record, and the replacement of the
lost nodes (locally the launcher replaces them itself; on AWS the Auto Scaling group does, and discovery pins the
new instance's key)."""

from __future__ import annotations

import shlex

from launcher.cluster import Cluster, Node
from launcher.execute import remote, results
from launcher.plans import restarts


def newest_checkpoint_epoch(c: Cluster, first: Node, out: str) -> int | None:
    """The epoch of the newest complete checkpoint in ``out`` (what --resume starts after), or None."""
    code, text = remote.check(c, first, f"cd {shlex.quote(out)} && {results.LISTING}", timeout_s=60)
    index = results.checkpoint_index(results.parse_listing(text)) if code == 0 else []
    return results.resumes_after(index)


def write_record(c: Cluster, first: Node, out: str, history: list[restarts.Restart]) -> None:
    """restarts.json in the run directory, written aside and renamed; fetched with the run's record."""
    remote.put_text(c, first, restarts.record(history), f"{out}/.{restarts.RECORD_FILE}.tmp", mode=0o644)
    remote.check(c, first, f"mv -f {shlex.quote(f'{out}/.{restarts.RECORD_FILE}.tmp')} "
                           f"{shlex.quote(f'{out}/{restarts.RECORD_FILE}')}")

