"""Loading a library with Ctrl-C held back until it is in.

A KeyboardInterrupt raised while a module loads is not a clean stop: inside a C extension's initialisation it
surfaces as `ImportError: initialization failed` (matplotlib's ft2font, measured) or aborts the interpreter (status
-6), and inside exec() of source text (dataclasses, pydantic) it leaves CPython's mark of an unhandled interrupt set,
so that under `python -m` the process kills itself with SIGINT at exit (bpo-1054041). While a `held_back()` block
runs, a Ctrl-C is only recorded; at its end Python's own handler is back and a recorded Ctrl-C is raised there, where
the command ends it as any other (one line, status 130).

It uses _signal, the built-in module `signal` wraps: importing `signal` first loads enum, long enough for a Ctrl-C
to land in it. Only where Python's own handler is in place (not where SIGINT was inherited ignored, or a caller set
its own), and only on the main thread, which alone receives signals.
"""

from __future__ import annotations

import _signal
import contextlib
import threading
from collections.abc import Iterator


def _pythons_own(handler) -> bool:
    """Whether SIGINT's handler is Python's own, on the main thread (the one signals reach): only then is it ours
    to change for a while."""
    return handler is _signal.default_int_handler and threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def held_back() -> Iterator[None]:
    """Ctrl-C recorded, not raised, while the block runs; raised as KeyboardInterrupt once it has run."""
    came: list[int] = []
    previous = _signal.getsignal(_signal.SIGINT)
    ours = _pythons_own(previous)
    if ours:
        _signal.signal(_signal.SIGINT, lambda signum, frame: came.append(signum))
    try:
        yield
    finally:
        if ours:
            _signal.signal(_signal.SIGINT, previous)
    if came:
        raise KeyboardInterrupt


_NOTED: list[int] = []


def _noting(signum, frame) -> None:
    _NOTED.append(signum)
    _signal.default_int_handler(signum, frame)


@contextlib.contextmanager
def noting_interrupts() -> Iterator[None]:
    """Python's own Ctrl-C (a KeyboardInterrupt where the program is) while the block runs, also counted: one raised
    inside a C extension's call back into Python may come out as the extension's own error, the interrupt gone
    (matplotlib's Agg renderer drawing `launch cost`'s plots: `ValueError: Invalid bounding box`, a fresh clone's
    Ctrl-C test, 2026-11-28), and the command must still end as interrupted (:func:`interrupts`). Only where Python's
    own handler is in place, on the main thread; the caller's handler is back after the block."""
    previous = _signal.getsignal(_signal.SIGINT)
    ours = _pythons_own(previous)
    if ours:
        _signal.signal(_signal.SIGINT, _noting)
    try:
        yield
    finally:
        if ours:
            _signal.signal(_signal.SIGINT, previous)


def interrupts() -> int:
    """How many Ctrl-Cs came inside :func:`noting_interrupts` blocks."""
    return len(_NOTED)
