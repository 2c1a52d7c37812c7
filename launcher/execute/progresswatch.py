"""The job's step reads the ranks' progress while the run goes on (training/progress.py writes it to the run
directory, ``progress/rank-<R>@<node>.tsv``) and says, once each, which node straggles and in which phase
(launcher/plans/stragglers.py decides). What it found is also kept in ``stragglers.json`` in the run directory,
which `launch jobs` and `launch logs` read. It reads only what was appended since its last look, every few seconds,
on the first node: the ranks do nothing for it."""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from launcher.files import write_atomic
from launcher.plans import stragglers

EVERY_S = 5.0
KEEP = 4 * stragglers.WINDOW
RECORD = stragglers.RECORD
_NAME = re.compile(r"rank-(\d+)@([^/]+)\.tsv")


class Watcher:
    def __init__(self, output: Path, say: Callable[[str], None], *, every_s: float | None = None,
                 factor: float = stragglers.FACTOR, window: int = stragglers.WINDOW,
                 on_found: Callable[[list[stragglers.Straggler], int], None] | None = None) -> None:
        """``on_found``: called after every look with the stragglers found and how many nodes were compared (the
        job step's --on-straggler drain, launcher/execute/stragglerdrain.py)."""
        self.dir = output / "progress"
        self.record = output / RECORD
        self.say = say
        self.on_found = on_found
        # EVERY_S read now, not bound when the class was defined, so that setting it (a test's shorter look) counts
        self.every_s = EVERY_S if every_s is None else every_s
        self.factor, self.window = factor, window
        self.times: dict[int, deque[stragglers.StepTime]] = {}
        self.nodes: dict[int, str] = {}
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self.named: dict[str, stragglers.Straggler] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="progress-watch")

    def start(self) -> Watcher:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop looking, after a last look: a run shorter than the period is judged too."""
        self._stop.set()
        self._thread.join(timeout=self.every_s + 5)
        with contextlib.suppress(OSError):
            self.look()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            with contextlib.suppress(OSError):  # the run's storage hiccuped: look again next time
                self.look()

    def read_new(self) -> None:
        with self._lock:
            self._read_new()

    def _read_new(self) -> None:
        """Append what each rank wrote since the last look (a torn last line waits for its end); under the lock:
        the thread's looks and the step's last_steps() share the offsets and the steps."""
        if not self.dir.is_dir():
            return
        for path in sorted(self.dir.iterdir()):
            m = _NAME.fullmatch(path.name)
            if not m:
                continue
            rank, node = int(m.group(1)), m.group(2)
            self.nodes[rank] = node
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
                self._offsets[path] = f.tell()
            text = self._partial.pop(path, "") + chunk.decode("utf-8", "replace")
            lines = text.split("\n")
            if lines[-1]:
                self._partial[path] = lines[-1]
            got = self.times.setdefault(rank, deque(maxlen=KEEP))
            for line in lines[:-1]:
                t = stragglers.parse(line)
                if t is not None:
                    if got and t.step <= got[-1].step:  # a requeued attempt starts again: its steps replace these
                        got.clear()
                    got.append(t)

    def look(self) -> list[stragglers.Straggler]:
        with self._lock:
            self._read_new()
            found = stragglers.find(self.times, self.nodes, factor=self.factor, window=self.window)
            compared = len({self.nodes[r] for r in self.times if self.times[r]})
        for s in found:
            if s.node not in self.named:
                self.say(s.line())
        # Every node ever named stays in the record; it is written again only when that changes.
        merged = {**self.named, **{s.node: s for s in found}}
        if merged != self.named:
            self.named = merged
            write_atomic(self.record, json.dumps({"stragglers": [
                {"node": s.node, "ranks": list(s.ranks), "ratio": round(s.ratio, 2), "since_step": s.since_step,
                 "phase": s.phase, "line": s.line(), "seen_at": time.time()} for s in self.named.values()]},
                indent=1) + "\n")
        if self.on_found is not None and found:
            self.on_found(found, compared)
        return found

    def last_steps(self) -> dict[int, int | None]:
        """Each rank's last recorded step (for locating a stall)."""
        with self._lock:
            self._read_new()
            return {r: (ts[-1].step if ts else None) for r, ts in self.times.items()}
