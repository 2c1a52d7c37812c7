"""`python -m launcher` and the `launch` console script (pyproject.toml): the CLI, with a Ctrl-C that comes while its
libraries are still loading (about a second: typer, rich, pydantic) said in one line, as at any later moment."""

import sys


def run() -> int:
    try:
        from launcher.cli import main
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    raise SystemExit(run())
