"""Whether the node's PyTorch has kernels for its GPU: ``torch.cuda.get_arch_list()`` against a compute capability.

Pure. torch 2.7's CUDA 12.8 wheels left sm_70 out (pytorch/pytorch#147607), so on a V100 every kernel failed with
"no kernel image is available for execution on the device" while the image test (on a g5's sm_86) and the doctor's
other checks (nccl-tests is built on its own) passed. :func:`check_torch_arch` reads :data:`TORCH_ARCH_PY`'s output
(the arch list, each GPU's capability, and a small kernel run on every GPU) and says whether the build serves the
catalog's GPU for the node's type; the image test asks the same of the capabilities its build serves
(``python -m launcher.doctor.torchprobe``).

What an arch list entry runs on (CUDA C++ Programming Guide, "Binary Compatibility" and "PTX Compatibility",
https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#binary-compatibility; PTX ISA, "Target ISA
notes": targets with the suffix "a" "include architecture-accelerated features that are supported on the specified
architecture only", and with "f" (CUDA 12.9) on the same family):

- ``sm_XY``: a cubin, which "will only execute on devices of compute capability X.z where z >= y": same major, minor
  at least Y (sm_86 serves 8.6 and 8.9, not 8.0; sm_80 serves 8.6).
- ``sm_XYa`` (and ``compute_XYa``): X.Y exactly (sm_90a serves 9.0, nothing else).
- ``sm_XYf`` (and ``compute_XYf``): same major, minor at least Y.
- ``compute_XY``: PTX, which the driver compiles at load time for any device of capability X.Y or higher. It runs,
  but every kernel of the build is compiled on first use: the check passes and says so.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass

from launcher.doctor.checks import Check, fail, ok, skip
from launcher.doctor.probes import TORCH_ARCH_PY, Probe

__all__ = ["TORCH_ARCH_PY", "Arch", "check_torch_arch", "parse_arch", "serving_entry"]

NAME = "torch cuda arch"

_ENTRY = re.compile(r"(sm|compute)_(\d+?)(\d)([af]?)")


@dataclass(frozen=True)
class Arch:
    kind: str      # "sm" (a cubin) or "compute" (PTX)
    major: int
    minor: int
    suffix: str    # "", "a" (architecture-specific), "f" (family-specific)

    def runs_on(self, capability: tuple[int, int]) -> bool:
        major, minor = capability
        if self.suffix == "a":
            return (major, minor) == (self.major, self.minor)
        if self.kind == "sm" or self.suffix == "f":
            return major == self.major and minor >= self.minor
        return (major, minor) >= (self.major, self.minor)  # plain PTX: JIT-compiled for this or any later capability


def parse_arch(entry: str) -> Arch | None:
    """``sm_70`` -> Arch("sm", 7, 0, ""); ``sm_100a`` -> Arch("sm", 10, 0, "a"); None for anything else."""
    found = _ENTRY.fullmatch(entry.strip())
    return Arch(found[1], int(found[2]), int(found[3]), found[4]) if found else None


def serving_entry(arch_list: Iterable[str], capability: tuple[int, int]) -> str | None:
    """The entry of ``arch_list`` that serves a GPU of ``capability`` (a cubin before PTX), or None."""
    entries = [(entry, parse_arch(entry)) for entry in arch_list]
    runs = [(entry, arch) for entry, arch in entries if arch is not None and arch.runs_on(capability)]
    cubins = [entry for entry, arch in runs if arch.kind == "sm"]
    return (cubins or [entry for entry, _ in runs] or [None])[0]


def _cc(capability: tuple[int, int]) -> str:
    return f"{capability[0]}.{capability[1]}"




def check_torch_arch(probe: Probe, needs: Iterable[tuple[int, int]], *, what: str = "") -> Check:
    """``probe``: TORCH_ARCH_PY's output. ``needs``: the compute capabilities the build must serve (the catalog's GPU
    for the node's type; for the image test, every type its build serves); ``what`` names them in the line."""
    needs = sorted(set(needs))
    if not needs:
        return skip(NAME, "no GPU to serve")
    try:  # the last JSON line: torch may warn on stderr before it
        last = [ln for ln in probe.output.splitlines() if ln.startswith("{")][-1:] if probe.rc == 0 else []
        found = json.loads(last[0]) if last else None
    except ValueError:
        found = None
    if not isinstance(found, dict):
        lines = [ln for ln in probe.output.strip().splitlines() if ln.strip()]
        return fail(NAME, f"the torch probe failed: {lines[-1] if lines else f'exit {probe.rc}'}")
    arch_list, build = found.get("arch_list") or [], f"torch {found.get('torch')}"
    if not found.get("cuda"):
        return fail(NAME, f"{build} is not a CUDA build")
    missing = [cc for cc in needs if serving_entry(arch_list, cc) is None]
    if missing:
        return fail(NAME, f"{build} has no kernels for compute capability {', '.join(map(_cc, missing))}"
                          f"{f' ({what})' if what else ''}: its arch list is {' '.join(arch_list) or 'empty'}; "
                          "install a build whose arch list serves it (ami/versions.json, torch_index)")
    gpus = [tuple(g) for g in found.get("gpus", [])]
    unserved = sorted({cc for cc in gpus if serving_entry(arch_list, cc) is None})
    if unserved:
        return fail(NAME, f"{build} has no kernels for this node's GPUs (compute capability "
                          f"{', '.join(map(_cc, unserved))}): its arch list is {' '.join(arch_list)}")
    kernels = found.get("kernel", [])
    if not gpus:
        return fail(NAME, f"{build} sees no GPU (torch.cuda.is_available() is false)")
    if bad := [(i, k) for i, k in enumerate(kernels) if k != "ok"]:
        return fail(NAME, f"a kernel failed on GPU {bad[0][0]} ({len(bad)} of {len(gpus)}): {bad[0][1]}")
    serving = [serving_entry(arch_list, cc) for cc in needs]
    jit = [f"{_cc(cc)} by {e}" for cc, e in zip(needs, serving, strict=True) if e and e.startswith("compute_")]
    return ok(NAME, f"{build} (CUDA {found['cuda']}) serves compute capability {', '.join(map(_cc, needs))}"
                    f"{f' ({what})' if what else ''} with {', '.join(dict.fromkeys(serving))}"
                    + (f" (PTX, compiled at first use: {', '.join(jit)})" if jit else "")
                    + f"; a kernel ran on {len(gpus)} GPU(s)")
