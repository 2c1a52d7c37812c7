"""The one error type the CLI turns into `error: <message>` and a non-zero exit, never a traceback."""


class LaunchError(Exception):
    """A problem the user can fix; the message is one line naming what was wrong and what is allowed."""
