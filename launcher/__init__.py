"""scaletrain launcher: the `launch` CLI."""
