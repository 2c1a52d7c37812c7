"""The image test's torch check: ``python -m launcher.doctor.torchprobe --need 7.0 [--need ...]``.

Runs launcher.doctor.gpuarch's probe with this interpreter (the image's training venv), in a child so that a crash
or a hang in CUDA cannot take the test down silently, and prints gpuarch's verdict: whether torch's arch list serves
every compute capability the image's build is published for (``--need``: ami/render.py gives the catalog's, for the
build's kernel modules), and whether a kernel runs on every GPU of the instance it runs on. Exit 0, or 1 with the
verdict's one line on stderr.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from launcher.doctor import gpuarch
from launcher.doctor.probes import Probe

TIMEOUT_S = 600  # the import and a CUDA context per GPU; the image test itself has 120 minutes


def capability(text: str) -> tuple[int, int]:
    major, sep, minor = text.partition(".")
    if not (sep and major.isdigit() and minor.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected a compute capability such as 7.0")
    return int(major), int(minor)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.doctor.torchprobe")
    p.add_argument("--need", type=capability, action="append", required=True,
                   help="a compute capability the build must serve, e.g. 7.0 (repeat for several)")
    p.add_argument("--what", default="", help="what needs them, for the line printed")
    a = p.parse_args(argv)
    try:
        done = subprocess.run([sys.executable, "-c", gpuarch.TORCH_ARCH_PY], capture_output=True, text=True,
                              timeout=TIMEOUT_S)
        probe = Probe(done.stdout + done.stderr, done.returncode)
    except subprocess.TimeoutExpired:
        probe = Probe(f"the torch probe did not answer in {TIMEOUT_S} s\n", 124)
    check = gpuarch.check_torch_arch(probe, a.need, what=a.what)
    print(f"{check.name}: {check.status}: {check.detail}", file=sys.stdout if check.status == "ok" else sys.stderr)
    return 1 if check.failed else 0


if __name__ == "__main__":
    sys.exit(main())
