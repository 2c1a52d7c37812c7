"""Slurm's HealthCheckProgram on every node: the doctor's node checks (launcher/doctor/checks.py), run on the node
itself by slurmd every HealthCheckInterval, with no launcher attached. A node that fails one drains itself
(`scontrol update State=DRAIN`): Slurm lets its running job finish, starts none there, and `sinfo -R` says why,
as ParallelCluster's and HyperPod's health checks take a bad instance out of service. A replacement instance returns
itself to service when it registers (launcher/plans/slurm.rejoin_commands).

Run as ``python -m launcher.doctor.health --backend local|aws ...`` (launcher/plans/slurm.health_check_argv).
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys

from launcher.doctor import checks
from launcher.plans import slurm

# The launcher's working directory over SSH is not the node's health: a fresh node has none until a launcher
# connects.
NOT_HEALTH = ("workdir",)


def evaluate(a: argparse.Namespace, probes: dict[str, checks.Probe]) -> list[checks.Check]:
    if a.backend == "aws":
        from infra import catalog

        found = checks.evaluate_aws(probes, catalog.get(a.instance_type), storage=a.storage or "none",
                                    efa_devices=a.efa_devices)
    else:
        found = checks.evaluate_local(probes, a.python, shared_mount=a.shared_mount)
    return [c for c in found if c.name not in NOT_HEALTH]


def main(args: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m launcher.doctor.health")
    p.add_argument("--backend", choices=("local", "aws"), required=True)
    p.add_argument("--python", required=True)
    p.add_argument("--mpirun", required=True)
    p.add_argument("--shared-mount")
    p.add_argument("--instance-type")
    p.add_argument("--storage")
    p.add_argument("--efa-devices", type=int)
    a = p.parse_args(args)
    script = checks.probe_script(a.backend, a.python, a.mpirun, shared_mount=a.shared_mount)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=600)
    failed = [(c.name, c.detail) for c in evaluate(a, checks.parse_probes(done.stdout)) if c.failed]
    node = socket.gethostname().split(".")[0]
    if not failed:
        shown = subprocess.run(["scontrol", "--oneliner", "show", "node", node], capture_output=True, text=True)
        if slurm.health_restored(slurm.fields(shown.stdout.strip())):  # it drained itself, and is well again
            subprocess.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
        return 0
    reason = slurm.drain_reason(failed)
    print(reason, flush=True)
    subprocess.run(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"], check=False)
    return 1


if __name__ == "__main__":
    sys.exit(main())
