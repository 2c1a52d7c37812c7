"""`python -m launcher` and the `launch` console script (pyproject.toml): the CLI, with a Ctrl-C that comes while its
libraries are still loading (about a second: typer, rich, pydantic) said in one line, as at any later moment.

A KeyboardInterrupt must not be raised inside those imports: caught or not, one raised there (40 Ctrl-Cs sent 50 ms
to 1.2 s after start, measured) ended the process 5 times by SIGINT itself (status -2: the interpreter marks an
interrupt that went through a module's execution as unhandled and, at exit, kills itself with SIGINT, bpo-1054041),
once with an uncaught traceback, and once aborted in finalization. So while they load, a Ctrl-C is only recorded;
once they are in, Python's own handler is back and a recorded one ends the command like any other.

A reader that stops early (`launch cost | head -1`) ends every command here, one way: quietly, status 141 (128 +
SIGPIPE), as `git log | head -1` and coreutils' `seq 1000000 | head -1` end. Python ignores SIGPIPE, so a write to
the closed pipe raises BrokenPipeError instead of killing the process (Python's docs, "Note on SIGPIPE", in the
signal module's page): the command unwinds through its cleanup as it would for any error, then stdout is pointed at
/dev/null so the interpreter's last flush cannot fail again."""

# Nothing here changes a signal handler at import: a test that imports this module keeps its own Ctrl-C (run()
# holds it back only while it loads the CLI: launcher/loading.py).
import errno
import os
import sys

SIGPIPE_STATUS = 141  # 128 + SIGPIPE (13): what a shell reports for a writer the closed pipe killed


def _closed(stream) -> bool:
    """Whether ``stream`` is a pipe whose reader has gone: poll(2) reports POLLERR for the write end of such a pipe
    (Linux's poll(2) man page), so a BrokenPipeError from anywhere else (an SSH channel, a child's stdin) is not
    mistaken for it."""
    import select

    try:
        poller = select.poll()
        poller.register(stream.fileno(), 0)
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _rich_raises_broken_pipe() -> None:
    """rich's consoles (ours and typer's help) answer a broken pipe with SystemExit(1), which no caller can tell from
    any other exit 1 (rich's Console.on_broken_pipe, which its docs say to override): let it raise the error itself,
    so that it reaches run() as every other write's does."""
    from rich.console import Console

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    Console.on_broken_pipe = on_broken_pipe  # type: ignore[method-assign]


def _broken_pipe(e: BaseException) -> bool:
    """Whether ``e`` is a write to a closed stdout or stderr: the BrokenPipeError itself, or the SystemExit(1) typer
    turns it into (typer's main catches an EPIPE OSError, in standalone mode or not, and exits 1)."""
    cause = e if isinstance(e, OSError) else e.__context__ if isinstance(e, SystemExit) and e.code == 1 else None
    return isinstance(cause, OSError) and cause.errno == errno.EPIPE and (_closed(sys.stdout) or _closed(sys.stderr))


def _load_cli():
    """launcher.cli's main, loaded with Ctrl-C held back meanwhile (launcher/loading.py); None when one came."""
    from launcher.loading import held_back

    try:
        with held_back():
            _rich_raises_broken_pipe()
            from launcher.cli import main
    except KeyboardInterrupt:  # raised by held_back once the CLI was in: plain code, no exec() around it
        return None
    return main


def run(argv: list[str] | None = None) -> int:
    main = _load_cli()
    if main is None:
        print("error: interrupted", file=sys.stderr)
        return 130
    from launcher.loading import noting_interrupts

    try:
        with noting_interrupts():
            code = main(argv)
        sys.stdout.flush()
    except (BrokenPipeError, SystemExit) as e:
        if not _broken_pipe(e):
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            if _closed(stream):
                os.dup2(devnull, stream.fileno())
        return SIGPIPE_STATUS
    return code


def _forget_caught_interrupts() -> None:
    """Under `python -m`, a KeyboardInterrupt that passed through exec() of source text (dataclasses, namedtuple and
    pydantic build their methods so, in every lazy import) leaves CPython's mark of an unhandled interrupt set even
    where it was caught: at exit the interpreter then kills itself with SIGINT (status -2, no 130), as it does for a
    Ctrl-C no one caught (bpo-1054041). Measured on 3.11: `exec` of a loop, Ctrl-C, caught, return 130: -2 under -m,
    130 as a script. Each exec() of source text clears the mark before it runs, so one that runs to its end leaves it
    clear. The `launch` console script exits through SystemExit's own path, which never looks at the mark."""
    exec("None")  # noqa: S102 - a constant: see above


if __name__ == "__main__":
    status = run()
    _forget_caught_interrupts()
    raise SystemExit(status)
