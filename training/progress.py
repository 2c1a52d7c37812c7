"""Each rank's progress, per step, for the job's step to read (launcher/plans/stragglers.py decides from it): the
step's number, when it began, and the seconds spent waiting for data, in forward, in backward and in the optimizer.

It adds no collective and nothing on the hot path but clock reads: a step's record goes into a buffer, and the buffer
to the rank's file at most once a second (one write; the file is on the run's storage, which the job's step reads).

On a GPU the clock cannot time a phase: CUDA runs kernels asynchronously, so forward() returns once its kernels are
queued and the host waits later, wherever something synchronises (GradScaler's inf check in the optimizer's step, a
.item()), and a slow GPU's time would fall there ("CUDA Semantics", Asynchronous execution:
https://docs.pytorch.org/docs/stable/notes/cuda.html#asynchronous-execution). There each phase is timed by a pair of
CUDA events recorded on the current stream, as those notes advise, and read once the GPU has passed them
(Event.query, never a synchronisation on the hot path): a step's line is written a few steps late, with its GPU time.
The data phase stays the host's wait for a batch, which is what a loader costs on any device.
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
MAX_PENDING = 64  # steps the GPU may run behind the host before step_done waits for the oldest: a bound on the
#                   events held and on how late a line is (the host mostly waits for the GPU every step anyway, in
#                   GradScaler's step; with a static loss scale or bf16, at the next logged loss)


def progress_path(run_dir: Path, rank: int) -> Path:
    """The rank's file in the run directory: ``progress/rank-<RANK>@<node>.tsv``, the node its short host name."""
    import socket

    return run_dir / "progress" / f"rank-{rank}@{socket.gethostname().split('.')[0]}.tsv"


class Progress:
    def __init__(self, path: Path | None, *, flush_every_s: float = FLUSH_EVERY_S, device=None) -> None:
        """`device`: the torch device the phases run on; a CUDA device times them with CUDA events."""
        self.path = path
        self.flush_every_s = flush_every_s
        self._file = None
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a", buffering=1 << 16)  # noqa: SIM115 - closed by close()
        self._spent = dict.fromkeys(PHASES, 0.0)
        self._start = time.time()
        self._flushed = float("-inf")  # the first step goes at once: the job sees the rank has started
        self._cuda = self._file is not None and getattr(device, "type", None) == "cuda"
        self._marks: list = []     # this step's (phase, start event, end event), on a GPU
        self._pending: list = []   # steps done on the host whose events the GPU has not passed yet
        self._spare_events: list = []
        self._open: tuple | None = None  # begin()'s phase and its start

    @classmethod
    def from_env(cls, device=None) -> Progress:
        """`device`: where the script's steps run (a CUDA device times phases with CUDA events; see above)."""
        d = os.environ.get(ENV)
        return cls(Path(d) / progress_path(Path(d), launch_rank()).name if d else None, device=device)

    @property
    def enabled(self) -> bool:
        return self._file is not None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.begin(name)
        try:
            yield
        finally:
            self.end(name)

    def begin(self, name: str) -> None:
        """A phase's start (`phase` holds one with `with`; where none can, module hooks: StepHooks); `end(name)`
        closes it. The phase open already, if any, ends here: one phase at a time."""
        if self._file is None:
            return
        self.end()
        if self._cuda:
            event = self._event()
            event.record()
            self._open = (name, event)
        else:
            self._open = (name, time.perf_counter())

    def end(self, name: str | None = None) -> None:
        """End the open phase (only if it is `name`, when given)."""
        if self._open is None or (name is not None and self._open[0] != name):
            return
        (phase, start), self._open = self._open, None
        if self._cuda:
            stop = self._event()
            stop.record()
            self._marks.append((phase, start, stop))
        else:
            self._spent[phase] += time.perf_counter() - start

    def _event(self):
        if self._spare_events:
            return self._spare_events.pop()
        import torch

        return torch.cuda.Event(enable_timing=True)

    def add(self, name: str, seconds: float) -> None:
        self._spent[name] += seconds

    def step_done(self, step: int) -> None:
        """Record the step just finished and start timing the next."""
        if self._file is not None:
            if self._cuda:
                self._pending.append((step, self._start, self._spent, self._marks))
                self._marks = []
                self._write_passed(wait=len(self._pending) > MAX_PENDING)
            else:
                self._write(step, self._start, self._spent)
            now = time.monotonic()
            if now - self._flushed >= self.flush_every_s:
                self._flush()
                self._flushed = now
        self._spent = dict.fromkeys(PHASES, 0.0)
        self._start = time.time()

    def _write(self, step: int, start: float, s: dict[str, float]) -> None:
        assert self._file is not None
        self._file.write(f"{step}\t{start:.3f}\t{s['data']:.6f}\t{s['forward']:.6f}\t"
                         f"{s['backward']:.6f}\t{s['optimizer']:.6f}\n")

    def _write_passed(self, *, wait: bool = False) -> None:
        """Write the pending steps whose events the GPU has passed, in order; with `wait`, the oldest in any case."""
        while self._pending:
            step, start, spent, marks = self._pending[0]
            if marks and not marks[-1][2].query():
                if not wait:
                    return
                marks[-1][2].synchronize()
            wait = False
            for name, begin, end in marks:
                spent[name] += begin.elapsed_time(end) / 1000.0  # milliseconds
                self._spare_events += (begin, end)
            self._pending.pop(0)
            self._write(step, start, spent)

    def _flush(self) -> None:
        with contextlib.suppress(OSError):  # the run's storage full or gone: progress is advice, never the run's end
            assert self._file is not None
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            while self._pending:
                self._write_passed(wait=True)
            self._flush()
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None


class StepHooks:
    """A script's steps recorded without a line of its own: what training.distributed does for `launch run` scripts.
    The model's forward hooks and the optimizer's step mark the phases (torch.nn.Module.register_forward_pre_hook,
    register_forward_hook: https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html): data is from the
    last step's end to the next forward, forward is the model's call, backward from its return to the optimizer's
    step (the loss, backward and, under DDP, the wait for the others' gradients), optimizer is the step (under
    Horovod, the wait for the others' gradients). Data and forward involve no other rank, which is what
    launcher/plans/stragglers.py compares. A forward between steps (an evaluation) counts in the next step's."""

    def __init__(self, progress: Progress):
        self.progress, self.steps = progress, 0
        progress.begin("data")

    def attach(self, model) -> None:
        if self.progress.enabled:
            model.register_forward_pre_hook(lambda *_: self.progress.begin("forward"))
            model.register_forward_hook(lambda *_: self.progress.begin("backward"))

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        self.progress.begin("optimizer")
        try:
            yield
        finally:
            self.progress.end("optimizer")
            self.progress.step_done(self.steps)
            self.steps += 1
            self.progress.begin("data")
