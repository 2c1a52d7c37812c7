"""CPU time of one run of the node health check (launcher/doctor/health.py, what slurmd runs as HealthCheckProgram
on every node) against `python -c pass` with the same interpreter, median over runs.

Each run is a child process; its CPU time is user + sys of it and every process it waited for (os.wait4), so the
probes' subprocesses (mpirun --version, the Horovod/torch import, horovodrun, nvidia-smi) count. `scontrol` and
`nvidia-smi` are small fakes put first on PATH (this machine runs no slurmctld and has no GPU); everything else is
the real tool. Prints `ratio=` last: (CPU time of one check) / (CPU time of `python -c pass`).

    .venv/bin/python bench/healthcheck.py [--backend local|aws] [--runs 5]

``--backend local`` is a rehearsal node's check (64 of them share the machine's cores when slurmd starts);
``--backend aws`` a p4d.24xlarge's, with the GPU tools faked or absent (nvcc, fi_info: they fail fast here).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMI = """#!/bin/sh
for a in "$@"; do case "$a" in --query-gpu=*) q=1;; esac; done
if [ -n "$q" ]; then
  i=0; while [ $i -lt 8 ]; do echo "NVIDIA A100-SXM4-40GB, 570.172.08, 40960 MiB"; i=$((i+1)); done
else
  echo "| NVIDIA-SMI 570.172.08   Driver Version: 570.172.08   CUDA Version: 12.8 |"
fi
"""


def cpu_seconds(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(user + sys CPU seconds of the child and the processes it waited for, wall seconds)."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, _, usage = os.wait4(proc.pid, 0)
    proc.returncode = 0  # reaped here; keep Popen from waiting again
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=("local", "aws"), default="local")
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()

    python = sys.executable
    mpirun = shutil.which("mpirun") or "/usr/bin/mpirun"
    with tempfile.TemporaryDirectory(prefix="scaletrain-bench-health-") as tmp:
        fakes = Path(tmp)
        (fakes / "scontrol").write_text("#!/bin/sh\nexit 0\n")
        (fakes / "nvidia-smi").write_text(SMI)
        for f in fakes.iterdir():
            f.chmod(0o755)
        env = dict(os.environ, PATH=f"{fakes}{os.pathsep}{os.environ.get('PATH', '')}")
        check = [python, "-m", "launcher.doctor.health", "--backend", args.backend, "--python", python,
                 "--mpirun", mpirun]
        if args.backend == "aws":
            check += ["--instance-type", "p4d.24xlarge", "--storage", "none"]
        rows = {
            "python -c pass (baseline)": [python, "-c", "pass"],
            "python -c 'import launcher.doctor.health'": [python, "-c", "import launcher.doctor.health"],
            "python -c 'import horovod.torch'": [python, "-c", "import horovod.torch"],
            f"health check, --backend {args.backend}": check,
        }
        for argv in rows.values():  # warm-up: page cache, .pyc files
            cpu_seconds(argv, env)
        cpu: dict[str, list[float]] = {name: [] for name in rows}
        wall: dict[str, list[float]] = {name: [] for name in rows}
        for _ in range(args.runs):  # interleaved, so a busy moment hits every row alike
            for name, argv in rows.items():
                c, w = cpu_seconds(argv, env)
                cpu[name].append(c)
                wall[name].append(w)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; "
          f"median of {args.runs} runs")
    for name in rows:
        print(f"{name:48s} cpu {statistics.median(cpu[name]):6.3f} s   wall {statistics.median(wall[name]):6.3f} s")
    base = statistics.median(cpu["python -c pass (baseline)"])
    print(f"ratio={statistics.median(cpu[f'health check, --backend {args.backend}']) / base:.1f}")


if __name__ == "__main__":
    main()
