"""One process of a `launch run` job, on its node: what mpirun starts once per GPU (per slot on CPU nodes). It sets
the torchrun variables from Open MPI's (launcher/plans/userjob.torchrun_env), puts the image's Python first on PATH,
with ``--requirements-set`` makes (or finds) the job's own environment and puts it first on PATH
(launcher/execute/userenv.py), goes to the synced working directory, runs the user's command, and prints its output
with the rank in front, as torchrun's ``--tee`` does with ``[default0]:``. Signals mpirun sends (SIGTERM, SIGINT)
go on to the command.

Run as ``python -m launcher.execute.userrank --workdir DIR --python-bin DIR [--requirements-set ENV.json] -- COMMAND
ARGS...``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys

from launcher.plans import userjob


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.execute.userrank")
    p.add_argument("--workdir", required=True)
    p.add_argument("--python-bin", required=True)
    p.add_argument("--reducers", type=int, default=0, help="reducer processes after the workers in the MPI world")
    p.add_argument("--requirements-set", default=None, help="the set's document on the shared storage (ENV.json)")
    p.add_argument("command", nargs=argparse.REMAINDER)
    a = p.parse_args(args)
    command = a.command[1:] if a.command[:1] == ["--"] else a.command
    if not command:
        print("error: launch run needs a command after --", flush=True)
        return 2
    try:
        env = os.environ | userjob.torchrun_env(dict(os.environ), job_id=os.environ.get("SLURM_JOB_ID", ""),
                                                restarts=os.environ.get("SCALETRAIN_RESTART_COUNT", "0"),
                                                reducers=a.reducers)
    except ValueError as e:
        print(f"error: {e}", flush=True)
        return 2
    env["PATH"] = f"{a.python_bin}:{env.get('PATH', '/usr/bin:/bin')}"
    env.setdefault("PYTHONUNBUFFERED", "1")
    prefix = f"[rank {env['RANK']}] "
    if a.requirements_set:
        from launcher.execute import userenv

        try:
            made, _ = userenv.ensure(a.requirements_set, say=lambda line: print(prefix + line, flush=True))
        except userenv.EnvError as e:
            print(f"{prefix}error: {e}", flush=True)
            return 1
        # The environment's python first: `python` and every console script it installed (venv(1): activating a
        # virtual environment is PATH and VIRTUAL_ENV, https://docs.python.org/3/library/venv.html).
        env["PATH"] = f"{made}/bin:{env['PATH']}"
        env["VIRTUAL_ENV"] = str(made)
    try:
        proc = subprocess.Popen(command, cwd=a.workdir, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    except OSError as e:  # no such program, not executable, no such working directory
        print(f"{prefix}error: cannot run {command[0]!r} in {a.workdir}: {e.strerror or e}", flush=True)
        return 127

    def forward(signum, _frame):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    assert proc.stdout is not None
    out = sys.stdout.buffer
    for line in iter(proc.stdout.readline, b""):
        out.write(prefix.encode() + line if line.endswith(b"\n") else prefix.encode() + line + b"\n")
        out.flush()
    code = proc.wait()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
