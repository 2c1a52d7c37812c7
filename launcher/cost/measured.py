"""This project's own measurements, which replace the model's published or assumed figures once recorded.

Two kinds: per-GPU ResNet-50 training throughput (recorded from runs, below) and the data loader's images/s per
CPU core (:func:`record_loader`, for a benchmark of the loader to call), which sets the model's CPU ceiling.

A run measures one GPU's training rate only when nothing else shares its steps: ResNet-50 at 224 px on GPUs, one
node (no inter-node communication). After such a run `launch train` records images/s per rank under
``<state root>/measured/gpu_throughput.json``, keyed ``GPU_MODEL/precision``, with the date and the run; the cost
model then uses it before the catalog (see :func:`launcher.cost.inputs.resolve_gpu_throughput`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from infra.catalog import InstanceType
from launcher.cost.inputs import GpuThroughput
from launcher.cost.model import node_efficiency

__all__ = ["from_run", "load", "load_loader", "loader_path", "path", "record", "record_loader"]


def path(root: Path) -> Path:
    return root / "measured" / "gpu_throughput.json"


def from_run(instance: InstanceType, *, nodes: int, model: str, image_size: int, summary: dict[str, Any],
             run_dir: str, today: dt.date) -> tuple[str, GpuThroughput] | None:
    """The figure a finished run measured, keyed ``GPU_MODEL/precision``; None when the run does not measure one."""
    ranks = int(summary.get("ranks") or 0)
    ips = float(summary.get("images_per_sec") or 0.0)
    if (nodes != 1 or model != "resnet50" or image_size != 224 or summary.get("device") in (None, "cpu")
            or instance.gpu_model is None or ranks < 1 or ips <= 0):
        return None
    precision = "fp32" if summary.get("precision") == "fp32" else "amp"
    # The model's figure is one GPU alone; a node's ranks together run at the model's node efficiency of it.
    per_gpu = ips / ranks / node_efficiency(ranks)
    return f"{instance.gpu_model}/{precision}", GpuThroughput(
        img_per_sec=per_gpu,
        source=(f"measured by scaletrain on {today}: 1 x {instance.name}, {ranks} rank(s), resnet50 at 224 px, "
                f"{summary.get('precision')}, {summary.get('device')}, {ips / ranks:,.0f} img/s per GPU over the "
                f"training loop = {per_gpu:,.0f} for one GPU alone at the model's node efficiency, run {run_dir}"),
    )


def load(file: Path) -> tuple[dict[str, GpuThroughput], str | None]:
    """The recorded figures, and a one-line note when the file exists but cannot be read (it is then ignored)."""
    if not file.is_file():
        return {}, None
    try:
        data = json.loads(file.read_text())
        return {key: GpuThroughput.model_validate(value) for key, value in data.items()}, None
    except (OSError, ValueError, AttributeError, ValidationError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        return {}, f"ignored the measured-throughput file {file} ({first})"


def record(file: Path, key: str, figure: GpuThroughput) -> None:
    """Add or replace one figure, writing the file atomically."""
    figures, _ = load(file)
    figures[key] = figure
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({k: v.model_dump() for k, v in sorted(figures.items())}, indent=1) + "\n")
    os.replace(tmp, file)


def loader_path(root: Path) -> Path:
    return root / "measured" / "loader.json"


def load_loader(file: Path) -> tuple[GpuThroughput | None, str | None]:
    """The recorded loader images/s per CPU core (``img_per_sec`` is per core here), or None; a note if unreadable."""
    if not file.is_file():
        return None, None
    try:
        return GpuThroughput.model_validate_json(file.read_text()), None
    except (OSError, ValueError, ValidationError) as e:
        first = (str(e).splitlines() or [type(e).__name__])[0]
        return None, f"ignored the measured-loader file {file} ({first})"


def record_loader(file: Path, img_per_sec_per_core: float, source: str) -> None:
    """Record the loader's training-transform images/s per CPU core (decode + crop + flip at 224 px), atomically."""
    figure = GpuThroughput(img_per_sec=img_per_sec_per_core, source=source)
    file.parent.mkdir(parents=True, exist_ok=True)
    tmp = file.with_name(f".{file.name}.{os.getpid()}.tmp")
    tmp.write_text(figure.model_dump_json(indent=1) + "\n")
    os.replace(tmp, file)
