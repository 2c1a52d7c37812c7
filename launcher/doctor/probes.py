"""`launch doctor`'s probes: what runs on a node to gather the tools' output the checks read.

:func:`probe_commands` names each probe's shell command; :func:`probe_script` is the one shell line that runs them
all on a node, each output fenced by markers; :func:`parse_probes` splits its output again into a :class:`Probe`
per name. The verdicts on those outputs are launcher/doctor/checks.py's (which re-exports these names).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Literal

from ami import paths

OFI_NCCL_DIRS = (f"{paths.OFI_NCCL_PREFIX}/lib", "/opt/aws-ofi-nccl/lib")  # the image's; older DLAMIs'


@dataclass(frozen=True)
class Probe:
    output: str
    rc: int


_MARK = "@@@scaletrain-doctor"


def _probe(name: str, command: str) -> str:
    return f'echo "{_MARK} begin {name}"; ( {command} ) 2>&1; echo "{_MARK} end {name} $?"'


def probe_script(backend: Literal["local", "aws"], python: str, mpirun: str, *, shared_mount: str | None = None) -> str:
    """The shell line that gathers every probe on a node (run by every node at once, same text for all).

    Every program of the image is named by its absolute path (ami/paths.py), and on AWS the image's directories are
    put on PATH and LD_LIBRARY_PATH first: the launcher's non-interactive, non-login SSH shell reads none of
    /etc/profile.d, where the image (and the EFA installer) put them for people who log in. ``shared_mount``: the
    local rehearsal nodes' shared storage (where the stack mounts FSx), checked mounted and writable."""
    path = paths.path_export() if backend == "aws" else ""
    probes = probe_commands(backend, python, mpirun, shared_mount=shared_mount)
    return path + "; ".join(_probe(n, c) for n, c in probes.items())


# horovodrun --check-build asks each of its questions (PyTorch there? built with MPI, Gloo, NCCL, DDL, CCL?) in a
# process of its own that imports the framework afresh (horovod/common/util.py, _check_extension_lambda: one
# multiprocessing child per question, for TensorFlow and MXNet too): six imports of torch a run. One import answers
# them all; printed in check-build's format, check_horovod_build reads it unchanged.
HOROVOD_BUILD_PY = """\
import sys
try:
    import horovod
except Exception as e:
    sys.exit(f"import horovod: {type(e).__name__}: {e}")
print(f"Horovod v{horovod.__version__}:")
try:
    import horovod.torch as hvd
    built = {k: bool(getattr(hvd, k + "_built")()) for k in ("mpi", "gloo", "nccl", "ddl", "ccl")}
    torch = True
except Exception as e:
    print(f"horovod.torch: {type(e).__name__}: {e}")
    built, torch = {}, False
x = lambda v: "X" if v else " "
print("Available Frameworks:")
print(f"    [{x(torch)}] PyTorch")
print("Available Controllers:")
print(f"    [{x(built.get('mpi'))}] MPI")
print(f"    [{x(built.get('gloo'))}] Gloo")
print("Available Tensor Operations:")
for name in ("nccl", "ddl", "ccl", "mpi", "gloo"):
    print(f"    [{x(built.get(name))}] {name.upper() if name != 'gloo' else 'Gloo'}")
"""


# What launcher/doctor/gpuarch.py's check reads, run by the node's training Python: torch's arch list, each GPU's
# capability, and a small kernel (an elementwise multiply and a sum) on every GPU, whose exact result (float32
# integers below 2**24) shows it ran there.
TORCH_ARCH_PY = """\
import json
try:
    import torch
except Exception as e:
    raise SystemExit(f"import torch: {type(e).__name__}: {e}")
out = {"torch": torch.__version__, "cuda": torch.version.cuda, "arch_list": torch.cuda.get_arch_list(),
       "gpus": [], "kernel": []}
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        out["gpus"].append(list(torch.cuda.get_device_capability(i)))
        try:
            x = torch.arange(4096, device=f"cuda:{i}", dtype=torch.float32)
            got = (x * 2).sum().item()
            out["kernel"].append("ok" if got == 4096 * 4095 else f"wrong result {got}")
        except Exception as e:
            out["kernel"].append(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
print(json.dumps(out))
"""


HOROVOD_BUILD_TOOL = "python -c 'import horovod.torch'"


def horovod_build_command(python: str) -> str:
    """What ``horovodrun --check-build`` prints about PyTorch, from one import of horovod.torch (HOROVOD_BUILD_PY)."""
    return f"{shlex.quote(python)} -c {shlex.quote(HOROVOD_BUILD_PY)}"


def probe_commands(backend: Literal["local", "aws"], python: str, mpirun: str, *, shared_mount: str | None = None,
                   workdir: bool = True) -> dict[str, str]:
    """Each probe's shell command, by name, in the order probe_script runs them. ``workdir``: the launcher's working
    directory, which only a launcher connected over SSH has (the health check leaves it out)."""
    py = shlex.quote(python)
    venv_bin = shlex.quote(python.rsplit("/", 1)[0]) if "/" in python else "."
    common = [
        ("mpirun", f"{shlex.quote(mpirun)} --version"),
        ("horovod-python", f"{py} -c 'import json, horovod, horovod.torch as hvd; print(json.dumps("
                           f"{{\"version\": horovod.__version__, \"mpi\": bool(hvd.mpi_built()), "
                           f"\"gloo\": bool(hvd.gloo_built()), \"nccl\": bool(hvd.nccl_built())}}))'"),
    ]
    if workdir:
        from launcher.cluster import WORKDIR_SHELL

        common.append(("workdir", f'w={WORKDIR_SHELL} && f="$w/.doctor-$$" && touch "$f" && rm -f "$f" '
                                  '&& echo "writable $w"'))
    aws = [
        ("nvidia-smi", "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader"),
        ("nvidia-smi-header", "nvidia-smi | head -n 4"),
        ("nvcc", f"{paths.CUDA_HOME}/bin/nvcc --version"),
        ("kernel", 'echo "kernel $(uname -r)"; echo "module $(/sbin/modinfo -F version nvidia 2>&1)"'),
        ("infiniband", "ls /sys/class/infiniband"),
        ("fi_info", f"{paths.FI_INFO} -p efa -t FI_EP_RDM"),
        ("fi_version", f"{paths.FI_INFO} --version"),
        ("ldconfig", "/sbin/ldconfig -p | grep -E 'libnccl'"),
        ("ofi-nccl", "ls " + " ".join(f"{d}/libnccl-net*.so" for d in OFI_NCCL_DIRS)),
        ("horovod-build", f"{venv_bin}/horovodrun --check-build"),
        ("torch-arch", f"{py} -c {shlex.quote(TORCH_ARCH_PY)}"),
        ("storage", "findmnt -J -t lustre,beegfs"),
        ("storage-write", 'for m in $(findmnt -rn -t lustre,beegfs -o TARGET); do f="$m/.doctor-$(hostname)-$$"; '
                          'if touch "$f" 2>/dev/null && rm -f "$f"; then echo "writable $m"; '
                          'else echo "read-only $m"; fi; done'),
        ("image", f"cat {paths.IMAGE_ENV_FILE}"),
    ]
    if shared_mount:
        m = shlex.quote(shared_mount)
        common.append(("shared-mount", f'findmnt -n -o TARGET --mountpoint {m} && f={m}/.doctor-"$(hostname)-$$" '
                                       f'&& touch "$f" && rm -f "$f" && echo "writable {shared_mount}"'))
    return dict(common + (aws if backend == "aws" else []))


def parse_probes(text: str) -> dict[str, Probe]:
    """Split :func:`probe_script`'s output into each probe's output and exit status."""
    probes: dict[str, Probe] = {}
    name, lines = None, []
    for line in text.splitlines():
        if line.startswith(f"{_MARK} begin "):
            name, lines = line.split(" ", 2)[2], []
        elif line.startswith(f"{_MARK} end ") and name is not None:
            _, _, rest = line.split(" ", 2)
            probe, _, rc = rest.rpartition(" ")
            probes[probe] = Probe("\n".join(lines) + ("\n" if lines else ""), int(rc))
            name = None
        elif name is not None:
            lines.append(line)
    return probes
