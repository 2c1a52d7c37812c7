"""A run asked to stop from outside, with a checkpoint: the job's step (launcher/execute/budget.py, at `--max-cost`)
writes STOP_FILE in the run directory; rank 0 looks for it only at a logged step, where every rank already joins
the logged loss's allreduce, and its answer rides on that allreduce (``with_flag``/``agreed``), so every rank stops
after the same step with no collective of its own and nothing read on the other ranks. A signal would reach the
ranks at different steps, and ranks stopping at different steps leave the others waiting in a collective."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

STOP_FILE = "stop-requested"  # its text: why (one line)


def requested(out: Path) -> str | None:
    """Why the run was asked to stop (the file's line), or None when it was not."""
    try:
        return (out / STOP_FILE).read_text().strip() or "asked to stop"
    except OSError:
        return None


def with_flag(loss: torch.Tensor, asked: bool) -> torch.Tensor:
    """The logged loss and this rank's stop flag, as one tensor for the one allreduce (mean) of a logged step."""
    import torch  # here: the job's step reads STOP_FILE's name without loading torch

    return torch.stack([loss.reshape(()).float(), torch.tensor(1.0 if asked else 0.0, device=loss.device)])


def agreed(reduced: torch.Tensor) -> tuple[float, bool]:
    """(the mean loss, whether any rank was asked to stop) from ``with_flag``'s tensor after the allreduce."""
    return float(reduced[0]), float(reduced[1]) > 0.0
