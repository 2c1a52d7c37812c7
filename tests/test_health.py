"""Slurm's health check (launcher/doctor/health.py), run as slurmd runs it, with small fakes for the node's tools: it
asks nvidia-smi once, imports torch at most once, gives up on a hung probe by name before slurmd's 60 s, and keeps
its own process free of the launcher's heavy imports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher.doctor import checks, health

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "pydantic", "rich", "boto3", "numpy")


def _script(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(0o755)
    return path


@pytest.fixture
def node(tmp_path: Path) -> dict:
    """A node's tools as fakes that count their runs in one file: nvidia-smi (8 A100s of a p4d), the cluster's python
    (the real interpreter), mpirun, scontrol; and torch and horovod packages that count their imports."""
    bin_, pkgs, counter = tmp_path / "bin", tmp_path / "pkgs", tmp_path / "counter"
    bin_.mkdir()
    (pkgs / "horovod" / "torch").mkdir(parents=True)
    counter.touch()
    _script(bin_ / "nvidia-smi", """
        #!/bin/sh
        echo "nvidia-smi $*" >> "$COUNTER"
        echo $$ > "$COUNTER.smi-pid"
        [ -n "$FAKE_SMI_SLEEP" ] && sleep "$FAKE_SMI_SLEEP"
        i=0; while [ $i -lt 8 ]; do echo "NVIDIA A100-SXM4-40GB, 570.172.08, 40960 MiB"; i=$((i+1)); done
        """)
    _script(bin_ / "python", f"""
        #!/bin/sh
        echo python >> "$COUNTER"
        exec {sys.executable} "$@"
        """)
    _script(bin_ / "mpirun", """
        #!/bin/sh
        echo "mpirun (Open MPI) 4.1.5"
        """)
    _script(bin_ / "scontrol", """
        #!/bin/sh
        echo "scontrol $*" >> "$COUNTER"
        """)
    (pkgs / "torch").mkdir()
    (pkgs / "torch" / "__init__.py").write_text(
        'import os\nwith open(os.environ["COUNTER"], "a") as f:\n    f.write("torch\\n")\n'
        'if os.environ.get("FAKE_TORCH_BROKEN"):\n    raise ImportError("libtorch_cpu.so: cannot open")\n')
    (pkgs / "horovod" / "__init__.py").write_text('__version__ = "0.28.1"\n')
    (pkgs / "horovod" / "torch" / "__init__.py").write_text(textwrap.dedent("""
        import torch  # noqa: F401

        def mpi_built(): return True
        def gloo_built(): return True
        def nccl_built(): return True
        def ddl_built(): return False
        def ccl_built(): return False
        """))
    env = dict(os.environ, PATH=f"{bin_}{os.pathsep}{os.environ['PATH']}", COUNTER=str(counter),
               PYTHONPATH=f"{pkgs}{os.pathsep}{ROOT}")
    env.pop("FAKE_SMI_SLEEP", None)
    env.pop("FAKE_TORCH_BROKEN", None)
    return {"bin": bin_, "counter": counter, "env": env, "state": tmp_path / "run"}


def _args(node: dict, backend: str) -> list[str]:
    args = ["--backend", backend, "--python", str(node["bin"] / "python"), "--mpirun", str(node["bin"] / "mpirun"),
            "--state-dir", str(node["state"])]
    if backend == "aws":
        args += ["--instance-type", "p4d.24xlarge", "--storage", "none", "--efa-devices", "0"]
    return args


def _health(node: dict, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.doctor.health", *args], cwd=ROOT, env=env or node["env"],
                          capture_output=True, text=True, timeout=60)


def _runs(node: dict) -> list[str]:
    return [line.split(" ", 1)[0] for line in node["counter"].read_text().splitlines()]


def test_a_p4d_check_runs_nvidia_smi_once_and_imports_torch_once(node) -> None:
    done = _health(node, *_args(node, "aws"))
    runs = _runs(node)
    assert runs.count("nvidia-smi") == 1, runs
    assert runs.count("torch") == 1 and runs.count("python") == 1, runs  # not horovodrun's six, nor horovod-python
    # The one query answers the GPU check, and the one import the Horovod check. What this machine lacks of a p4d
    # (libnccl, aws-ofi-nccl, maybe nvcc) fails, and drains the node for that alone.
    failed = done.stdout.removeprefix("scaletrain health: ")
    assert not any(f"{name}:" in failed for name in ("gpus", "horovod", "mpi")), done.stdout
    assert done.returncode == (1 if failed else 0), done.stdout + done.stderr


def test_a_rehearsal_nodes_check_imports_torch_once_and_asks_no_gpu(node) -> None:
    done = _health(node, *_args(node, "local"))
    assert done.returncode == 0, done.stdout + done.stderr
    runs = _runs(node)
    assert runs.count("torch") == 1 and runs.count("nvidia-smi") == 0, runs
    assert runs[-1] == "scontrol", runs  # passed: asks whether it drained itself, to resume


def test_a_second_check_in_the_same_boot_asks_the_gpus_again_but_imports_torch_no_more(node) -> None:
    for _ in range(2):
        done = _health(node, *_args(node, "aws"))
    runs = _runs(node)
    assert runs.count("nvidia-smi") == 2, runs  # what changes under a running node is asked every time
    assert runs.count("torch") == 1 and runs.count("python") == 1, runs  # the image's files are not
    assert "horovod:" not in done.stdout, done.stdout  # the kept answer reads as the import did
    for _ in range(2):
        assert _health(node, *_args(node, "local")).returncode == 0
    assert _runs(node).count("torch") == 2, _runs(node)  # the rehearsal's probe is another command: its own import


def test_an_import_kept_from_another_boot_or_another_command_is_run_again(node) -> None:
    assert _health(node, *_args(node, "local")).returncode == 0
    kept = node["state"] / health.IMPORTS_KEPT
    record = json.loads(kept.read_text())
    assert record["boot"] == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    kept.write_text(json.dumps({**record, "boot": "another-boot"}))
    assert _health(node, *_args(node, "local")).returncode == 0
    assert _runs(node).count("torch") == 2, _runs(node)
    record = json.loads(kept.read_text())
    assert record["boot"] != "another-boot"
    kept.write_text(json.dumps({**record, "probes": {n: {**v, "command": v["command"] + " -X dev"}
                                                    for n, v in record["probes"].items()}}))
    assert _health(node, *_args(node, "local")).returncode == 0
    assert _runs(node).count("torch") == 3, _runs(node)


def test_an_import_that_failed_is_not_kept_and_drains_the_node_at_every_check(node) -> None:
    broken = {**node["env"], "FAKE_TORCH_BROKEN": "1"}
    for _ in range(2):
        done = _health(node, *_args(node, "local"), env=broken)
        assert done.returncode == 1 and "horovod" in done.stdout and "libtorch_cpu" in done.stdout, done.stdout
    assert _runs(node).count("torch") == 2, _runs(node)
    assert not (node["state"] / health.IMPORTS_KEPT).exists()
    assert _health(node, *_args(node, "local")).returncode == 0  # mended: passes, and is kept from then on
    assert _health(node, *_args(node, "local")).returncode == 0
    assert _runs(node).count("torch") == 3, _runs(node)


def test_a_hung_nvidia_smi_fails_by_name_within_the_deadline(node) -> None:
    env = dict(node["env"], FAKE_SMI_SLEEP="30")
    started = time.monotonic()
    done = _health(node, *_args(node, "aws"), "--deadline", "3", env=env)
    took = time.monotonic() - started
    assert took < 4.5, took  # 3 s, and the interpreter's start; slurmd would have waited 60 s and killed it
    assert done.returncode == 1
    # nvidia-smi's share of a 45 s deadline is 30 s: 2 s of 3. One reason for the two checks that read it.
    assert done.stdout.startswith("scaletrain health: gpus, driver/cuda: nvidia-smi did not answer in 2 s;"), done
    drained = [ln for ln in node["counter"].read_text().splitlines() if ln.startswith("scontrol update")]
    assert len(drained) == 1 and "State=DRAIN" in drained[0] and "nvidia-smi did not answer in 2 s" in drained[0]
    # Killed with its process group: the sleeping fake is gone (or a zombie waiting for init).
    pid = int((node["counter"].parent / "counter.smi-pid").read_text())
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state == "Z":
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the hung nvidia-smi (pid {pid}) is still running")


def test_the_rehearsal_health_path_imports_nothing_heavy(node) -> None:
    code = ("import sys\nfrom launcher.doctor import health\nrc = health.main(sys.argv[1:])\n"
            f"print('HEAVY', sorted(m for m in {HEAVY!r} if m in sys.modules), rc)\n")
    done = subprocess.run([sys.executable, "-c", code, *_args(node, "local")], cwd=ROOT, env=node["env"],
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[-1] == "HEAVY [] 0", done.stdout + done.stderr
    assert _runs(node).count("torch") == 1  # in the probe's child, not here


def test_the_one_import_reads_as_horovodrun_check_build_did(node) -> None:
    def build(pkgs_env: dict) -> checks.Check:
        out = subprocess.run(["bash", "-c", checks.horovod_build_command(str(node["bin"] / "python"))],
                             env=pkgs_env, capture_output=True, text=True, timeout=60)
        return checks.check_horovod_build(checks.Probe(out.stdout + out.stderr, out.returncode), need_nccl=True,
                                          tool=checks.HOROVOD_BUILD_TOOL)

    assert build(node["env"]) == checks.ok("horovod", "0.28.1: PyTorch, MPI; tensor ops NCCL, MPI, Gloo")
    pkgs = Path(node["env"]["PYTHONPATH"].split(os.pathsep)[0])
    mpi_ops = pkgs / "horovod" / "torch" / "__init__.py"
    mpi_ops.write_text(mpi_ops.read_text().replace("def nccl_built(): return True", "def nccl_built(): return False"))
    assert build(node["env"]).detail == "Horovod 0.28.1 built without NCCL; rebuild it (ami/components/horovod.sh)"
    (pkgs / "torch" / "__init__.py").write_text("raise ImportError('libc10.so: cannot open shared object file')\n")
    assert build(node["env"]).detail.startswith("Horovod 0.28.1 built without PyTorch, MPI, NCCL")
    (pkgs / "horovod" / "__init__.py").write_text("raise ImportError('no horovod here')\n")
    assert build(node["env"]).detail == ("python -c 'import horovod.torch' failed: import horovod: ImportError: "
                                         "no horovod here")


def test_a_probe_starved_of_cpu_is_unchecked_and_a_hung_one_fails(monkeypatch) -> None:
    # slurmctld runs the check on every node at once: 64 rehearsal nodes on 2 cores starve; a wedged driver hangs.
    from launcher.doctor import health

    probes = {"horovod-python": "while :; do :; done", "nvidia-smi": "sleep 30"}
    limits = {"horovod-python": 0.5, "nvidia-smi": 0.5}
    monkeypatch.setattr(os, "getloadavg", lambda: (64.0, 40.0, 20.0))
    found = health.run_probes(probes, limits)
    cpus = len(os.sched_getaffinity(0))
    assert found["horovod-python"] == checks.Probe(
        f"python -c 'import horovod.torch' was starved of CPU for 0.5 s (load average 64.0 on {cpus} CPUs)\n",
        health.STARVED)
    assert found["nvidia-smi"] == checks.Probe("nvidia-smi did not answer in 0.5 s\n", health.TIMED_OUT)
    verdict = [checks.fail("mpi", "mpirun --version: no output"),
               checks.fail("horovod", "horovod.torch does not import"), checks.fail("gpus", "nvidia-smi failed")]
    failed, unchecked = health.failures(verdict, found | {"mpirun": checks.Probe("", 1)})
    assert failed == [("mpi", "mpirun --version: no output"), ("gpus", "nvidia-smi did not answer in 0.5 s")]
    assert unchecked == [("horovod", found["horovod-python"].output.strip())]
    # An idle node's probe that runs out of time is not starved, whatever it was doing.
    monkeypatch.setattr(os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    assert health.run_probes({"mpirun": "while :; do :; done"}, {"mpirun": 0.3})["mpirun"].rc == health.TIMED_OUT


# --- A reducer (c5n): the check its instance type calls for, not a GPU type's (issue 46's fourth review) -------------
NO_DRIVER = """
    #!/bin/sh
    echo "nvidia-smi $*" >> "$COUNTER"
    echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    exit 9
    """


def _as_type(node: dict, instance_type: str) -> list[str]:
    args = _args(node, "aws")
    args[args.index("--instance-type") + 1] = instance_type
    return args


def test_a_reducers_check_on_a_c5n_passes_and_asks_no_gpu(node) -> None:
    """The image's nvidia-smi on a c5n, which has no GPU, answers as it does with no driver loaded (exit 9). The
    reducer's health is its EFA devices, MPI and the storage: it does not drain itself, and nothing asks a GPU or
    imports torch (before: 'gpus: nvidia-smi failed', drained at its first interval, two minutes after boot)."""
    _script(node["bin"] / "nvidia-smi", NO_DRIVER)
    done = _health(node, *_as_type(node, "c5n.18xlarge"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert not [r for r in node["counter"].read_text().splitlines() if "DRAIN" in r], node["counter"].read_text()
    assert "nvidia-smi" not in _runs(node) and "torch" not in _runs(node)


def test_a_gpu_node_whose_driver_does_not_answer_still_drains(node) -> None:
    """The other side: the same nvidia-smi on a p4d drains the node, naming its GPUs."""
    _script(node["bin"] / "nvidia-smi", NO_DRIVER)
    done = _health(node, *_as_type(node, "p4d.24xlarge"))
    assert done.returncode == 1
    drains = [r for r in node["counter"].read_text().splitlines() if "State=DRAIN" in r]
    assert len(drains) == 1 and "gpus: nvidia-smi failed" in drains[0], drains


def test_a_reducer_with_efa_is_checked_for_its_efa_device() -> None:
    """What a c5n's check still reads: its EFA device (the group's one) and libfabric's efa provider; one missing
    fails as on a GPU node."""
    from infra import catalog

    c5n = catalog.get("c5n.18xlarge")
    probes = {"infiniband": checks.Probe("rdmap0s6\n", 0), "fi_version": checks.Probe("fi_info: 1.22.0amzn1.0\n", 0),
              "fi_info": checks.Probe("provider: efa\n    fabric: efa\n    domain: rdmap0s6-rdm\n", 0),
              "mpirun": checks.Probe("mpirun (Open MPI) 4.1.7\n", 0)}
    found = {c.name: c for c in checks.evaluate_aws(probes, c5n, storage="none", efa_devices=1)}
    assert [n for n, c in found.items() if c.failed] == []
    skipped = {n for n, c in found.items() if c.status == "skip"}
    assert skipped == {"gpus", "driver/cuda", "nccl", "horovod", "shared storage"}
    gone = checks.evaluate_aws({**probes, "infiniband": checks.Probe("", 0)}, c5n, storage="none", efa_devices=1)
    assert [c.name for c in gone if c.failed] == ["efa devices"]
