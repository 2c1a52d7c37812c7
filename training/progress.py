"""Each rank's progress, per step, for the job's step to read (launcher/plans/stragglers.py decides from it): the
step's number, when it began, and the seconds spent waiting for data, in forward, in backward and in the optimizer.

It adds no collective and nothing on the hot path but clock reads: a step's record goes into a buffer, and the buffer
to the rank's file at most once a second (one write; the file is on the run's storage, which the job's step reads).
The trainer writes into its run directory (progress_path); a script of one's own, with Progress.from_env(), into
SCALETRAIN_PROGRESS_DIR, and without it nothing, so a script run by hand pays nothing. The file is the rank's own:
``rank-<RANK>@<node>.tsv``, one line per step (stragglers.FIELDS), appended, so a requeued attempt continues it.

    progress = Progress.from_env()
    for step, batch in enumerate(loader):      # progress.phase("data") around next() when the loop is explicit
        with progress.phase("forward"): ...
        with progress.phase("backward"): ...
        with progress.phase("optimizer"): ...
        progress.step_done(step)
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from training.options import launch_rank

ENV = "SCALETRAIN_PROGRESS_DIR"
PHASES = ("data", "forward", "backward", "optimizer")
FLUSH_EVERY_S = 1.0


def progress_path(run_dir: Path, rank: int) -> Path:
    """The rank's file in the run directory: ``progress/rank-<RANK>@<node>.tsv``, the node its short host name."""
    import socket

    return run_dir / "progress" / f"rank-{rank}@{socket.gethostname().split('.')[0]}.tsv"


class Progress:
    def __init__(self, path: Path | None, *, flush_every_s: float = FLUSH_EVERY_S) -> None:
        self.path = path
        self.flush_every_s = flush_every_s
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - closed by close()
        self._spent = dict.fromkeys(PHASES, 0.0)
        self._start = time.time()
        self._flushed = float("-inf")  # the first step goes at once: the job sees the rank has started

    @classmethod
    def from_env(cls) -> Progress:
        d = os.environ.get(ENV)
        return cls(Path(d) / progress_path(Path(d), launch_rank()).name if d else None)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self._spent[name] += time.perf_counter() - t0

    def add(self, name: str, seconds: float) -> None:
        self._spent[name] += seconds

    def step_done(self, step: int) -> None:
        """Record the step just finished and start timing the next."""
        if self._file is not None:
            s = self._spent
            self._file.write(f"{step}\t{self._start:.3f}\t{s['data']:.6f}\t{s['forward']:.6f}\t"
                             f"{s['backward']:.6f}\t{s['optimizer']:.6f}\n")
            now = time.monotonic()
            if now - self._flushed >= self.flush_every_s:
                self._flush()
                self._flushed = now
        self._spent = dict.fromkeys(PHASES, 0.0)
        self._start = time.time()

    def _flush(self) -> None:
        with contextlib.suppress(OSError):  # the run's storage full or gone: progress is advice, never the run's end
            assert self._file is not None
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._flush()
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
