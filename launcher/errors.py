"""The one error type the CLI turns into `error: <message>` and a non-zero exit, never a traceback."""


class LaunchError(Exception):
    """A problem the user can fix; the message is one line naming what was wrong and what is allowed."""


class Detached(Exception):
    """The user pressed Ctrl-C while following a job the cluster owns: the launcher stops, the job does not. `main`
    exits 130 without an error line (what was said is already printed)."""
