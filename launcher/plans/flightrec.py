"""What PyTorch's NCCL flight recorder says about a stalled GPU rank, beside its Python stack (launcher/plans/hangs.py).

Every NCCL process group of a GPU rank keeps the last TRACE_ENTRIES collectives it issued in a ring buffer, each with
its sequence number, its name (``nccl:all_reduce``) and its state: scheduled, started (its kernel running) or
completed ("Flight Recorder for Debugging Stuck Jobs", https://docs.pytorch.org/tutorials/prototype/flight_recorder_tutorial.html).
A rank whose last collective is older than the others' is the one the others wait for; py-spy alone shows them all
"in allreduce". The ranks get ENV (torch_nccl_environment_variables: TORCH_NCCL_TRACE_BUFFER_SIZE enables the
recorder, TORCH_NCCL_DUMP_ON_TIMEOUT dumps it on the watchdog's timeout); with TORCH_NCCL_DEBUG_INFO_PIPE_FILE each
rank's watchdog makes a named pipe ``<stem><rank>.pipe`` and a write to it dumps the recorder to
``<TORCH_NCCL_DEBUG_INFO_TEMP_FILE><rank>`` (ProcessGroupNCCL.hpp/.cpp, DumpPipe). The stem is in /tmp on the node:
the pipe must be made where any rank can (a FIFO on the shared storage may not be), and the job's step copies what
it says into the run directory. The tutorial asks PyTorch 2.5 or later (the image pins 2.7.1: ami/versions.json);
newer releases read the same values under new names too (TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE), and the
old ones, set here, still.

The watchdog removes a pipe left by an earlier job and makes it again, and can fail the rank where it cannot
(DumpPipe's TORCH_CHECKs): the stem is the same for every job, which holds while a cluster's jobs run as one user
(its Slurm user, as here); a cluster shared by several users would need a stem per user.

Run on a GPU (an H200 with torch 2.13, 2026-11-28): tests/test_gpu.py's flight recorder test passed, the pipe made
by the watchdog and the dump read back; torch 2.13 warns once per rank that TORCH_NCCL_TRACE_BUFFER_SIZE is
deprecated in favour of TORCH_FR_BUFFER_SIZE and still honours it.
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping

from launcher.cluster import Cluster

TRACE_ENTRIES = 2000                   # collectives kept per process group (torch's own default where it sets one)
STEM = "/tmp/scaletrain-nccl-fr-rank"  # the pipe is STEM<rank>.pipe, the dump STEM<rank>

ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": str(TRACE_ENTRIES),
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": STEM,
    "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": STEM,
}


def for_cluster(cluster: Cluster) -> dict[str, str]:
    """ENV for a run's ranks on a cluster of GPU workers (AWS); nothing elsewhere: gloo keeps no such recorder."""
    from infra.catalog import get

    if cluster.backend != "aws" or not cluster.instance_type:
        return {}
    try:
        return dict(ENV) if get(cluster.instance_type).gpus else {}
    except (KeyError, ValueError):
        return {}


def pipe_path(stem: str, rank: int) -> str:
    return f"{stem}{rank}.pipe"


def dump_path(stem: str, rank: int) -> str:
    return f"{stem}{rank}"


class _Plain(pickle.Unpickler):
    """The recorder's dump is plain containers, strings and numbers: any class it names is refused (a pickle is code
    otherwise; https://docs.python.org/3/library/pickle.html, "Restricting Globals")."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def load(raw: bytes) -> dict | None:
    """The dump (pickle, or JSON where torch was asked for it), or None when it is neither."""
    import json

    try:
        found = _Plain(io.BytesIO(raw)).load()
    except Exception:  # noqa: BLE001 - any malformed or foreign pickle: not a dump we read
        try:
            found = json.loads(raw)
        except ValueError:
            return None
    return found if isinstance(found, dict) else None


def summary(dump: Mapping | None) -> str | None:
    """One phrase for the rank's newest collective: ``NCCL: nccl:all_reduce #1234 started, not completed``."""
    if not dump:
        return None
    entries = [e for e in dump.get("entries") or [] if isinstance(e, Mapping)]
    if not entries:
        return "NCCL: no collective recorded"
    last = max(entries, key=lambda e: (e.get("collective_seq_id") or 0, e.get("record_id") or 0))
    name = last.get("profiling_name") or "a collective"
    seq = last.get("collective_seq_id")
    state = str(last.get("state") or "?")
    how = {"scheduled": "scheduled, not started", "started": "started, not completed"}.get(state, state)
    return f"NCCL: {name} #{seq} {how}" if seq is not None else f"NCCL: {name} {how}"
