"""What the converter may read from SRC, and reading it without trusting it (issue 33).

Only regular files are inputs: a FIFO blocks its reader until a writer comes (for ever), and a device such as
/dev/zero never ends (fifo(7): https://man7.org/linux/man-pages/man7/fifo.7.html; null(4):
https://man7.org/linux/man-pages/man4/null.4.html). A symbolic link counts as what it points to (stat(2) follows
it). Nothing is read past a size limit, and a file is opened with O_NONBLOCK, so one swapped for a FIFO after it was
listed fails at once instead of blocking in open(2) ("O_NONBLOCK ... an open() for reading-only shall return
without delay", POSIX open: https://pubs.opengroup.org/onlinepubs/9699919799/functions/open.html).
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

# The largest input read as one image. ILSVRC2012's largest training JPEG is about 15 MB; a worker holds its input
# whole, one worker per core, so 64 workers at the limit hold 16 GiB. The manifest's options say the limit.
MAX_INPUT_BYTES = 256 << 20
# The largest labels file read: Kaggle's LOC_val_solution.csv is about 2 MB, the devkit's files smaller still.
MAX_LABELS_BYTES = 64 << 20
# The largest manifest or journal record read back: ImageNet's manifest is about 0.5 MB, 1.28M rejected inputs 200 MB.
MAX_MANIFEST_BYTES = 1 << 30

_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def file_kind(mode: int) -> str:
    """'a FIFO', 'a character device', ...: what a path that is not a regular file is."""
    return next((kind for test, kind in _KINDS if test(mode)), "not a regular file")


def follow(path: Path | str) -> tuple[os.stat_result | None, str | None]:
    """(what `path` names, after links, None) or (None, why it cannot be opened: a broken link, a loop of links)."""
    try:
        return os.stat(path), None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None, "symbolic link loop"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return None, f"broken symbolic link: {os.readlink(path)} does not exist"
        return None, f"unreadable: {exc.strerror or exc}"


def stat_problem(path: Path | str, limit: int | None = None) -> tuple[int, str | None]:
    """(size, None) for a regular file (after links) of at most `limit` bytes (MAX_INPUT_BYTES), else (size or 0,
    why it is not an input)."""
    limit = MAX_INPUT_BYTES if limit is None else limit
    st, problem = follow(path)
    if st is None:
        return 0, problem
    return (st.st_size, not_an_input(st, limit)) if stat.S_ISREG(st.st_mode) else (0, not_an_input(st, limit))


def not_an_input(st: os.stat_result, limit: int | None = None) -> str | None:
    """Why what `st` describes is not an input (not a regular file, over the limit), or None."""
    if not stat.S_ISREG(st.st_mode):
        return f"not a regular file ({file_kind(st.st_mode)})"
    return too_large(st.st_size, limit)


def too_large(size: int, limit: int | None = None) -> str | None:
    """Why an input of `size` bytes is not read (over `limit`, MAX_INPUT_BYTES), or None."""
    limit = MAX_INPUT_BYTES if limit is None else limit
    return f"too large: {size:,} bytes is over the {limit:,}-byte input limit" if size > limit else None


def open_regular(path: Path | str, buffering: int = -1):
    """The regular file at `path`, opened for reading in binary; OSError (its strerror says why) for anything else,
    without blocking on a FIFO."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, f"not a regular file ({file_kind(mode)})", str(path))
        return os.fdopen(fd, "rb", buffering=buffering)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path: Path | str, size: int) -> bytes:
    """A regular file's bytes, which must be `size` (as listed); OSError if it is not a regular file or its size
    changed. Reads at most size + 1 bytes."""
    with open_regular(path) as f:
        data = f.read(size + 1)
    if len(data) != size:
        raise OSError(0, f"changed since it was listed: {size:,} bytes then, "
                         f"{'more' if len(data) > size else f'{len(data):,}'} now")
    return data


def read_limited(path: Path, name: str, limit: int = MAX_LABELS_BYTES) -> bytes:
    """A small file the converter reads whole (a labels file), bounded by `limit`; ValueError (one line) naming
    `name` if it is not a regular file, is too large or cannot be read."""
    size, problem = stat_problem(path, limit)
    if problem is not None:
        raise ValueError(f"{name}: {problem}")
    try:
        return read_regular(path, size)
    except OSError as exc:
        raise ValueError(f"{name}: cannot read: {exc.strerror or exc}") from None


def regular_or_absent(path: Path, name: str) -> bool:
    """Is there a regular file at `path` (True) or nothing at all (False)? ValueError naming `name` when something
    else is there (a FIFO, a device, a broken link): the converter would otherwise skip a file the user put there,
    or block on it."""
    if not os.path.lexists(path):
        return False
    _, problem = stat_problem(path, limit=1 << 62)
    if problem is not None:
        raise ValueError(f"{name} is {problem.removeprefix('not a regular file (').rstrip(')')}, not a regular file"
                         if problem.startswith("not a regular") else f"{name}: {problem}")
    return True
