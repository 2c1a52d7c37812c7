"""`python -m launcher` and the `launch` console script (pyproject.toml): the CLI, with a Ctrl-C that comes while its
libraries are still loading (about a second: typer, rich, pydantic) said in one line, as at any later moment.

A reader that stops early (`launch cost | head -1`) ends every command here, one way: quietly, status 141 (128 +
SIGPIPE), as `git log | head -1` and coreutils' `seq 1000000 | head -1` end. Python ignores SIGPIPE, so a write to
the closed pipe raises BrokenPipeError instead of killing the process (Python's docs, "Note on SIGPIPE", in the
signal module's page): the command unwinds through its cleanup as it would for any error, then stdout is pointed at
/dev/null so the interpreter's last flush cannot fail again."""

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


def run(argv: list[str] | None = None) -> int:
    try:
        _rich_raises_broken_pipe()
        from launcher.cli import main
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    try:
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


if __name__ == "__main__":
    raise SystemExit(run())
