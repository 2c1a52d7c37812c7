"""scaletrain training code: runs on the nodes."""
