"""The learning-rate schedule of seed 000, as a pure function of the step.

LR 0.1 per 256 images scaled linearly with the global batch (6.4 for 64 GPUs x 256); linear warmup from
0.001 to the peak over `warmup_epochs`; then polynomial decay of power 2 to 0 at the last epoch.
Updated every step, not every epoch.
"""

from __future__ import annotations

import math


def peak_lr(global_batch: int, lr_per_256: float = 0.1) -> float:
    return lr_per_256 * global_batch / 256


def lr_at(step: int, steps_per_epoch: int, epochs: int, peak: float, warmup_epochs: float = 10.0,
          warmup_start: float = 0.001, decay: str = "poly", power: float = 2.0) -> float:
    """LR for the update made at `step` (0-based, counted over the whole run)."""
    total = steps_per_epoch * epochs
    warmup = min(round(warmup_epochs * steps_per_epoch), total)
    if step < warmup:
        return warmup_start + (peak - warmup_start) * step / warmup
    remaining = max(total - warmup, 1)
    progress = min((step - warmup) / remaining, 1.0)
    if decay == "cosine":
        return peak * 0.5 * (1 + math.cos(math.pi * progress))
    if decay == "poly":
        return peak * (1 - progress) ** power
    raise ValueError(f"unknown decay '{decay}'; choose one of: poly, cosine")


def schedule_by_epoch(steps_per_epoch: int, epochs: int, peak: float, warmup_epochs: float = 10.0,
                      warmup_start: float = 0.001, decay: str = "poly") -> list[tuple[int, float]]:
    """[epoch, lr] at each epoch boundary, epoch 0 to the last (the `lr_schedule` of `launch plan`)."""
    return [(e, lr_at(e * steps_per_epoch, steps_per_epoch, epochs, peak, warmup_epochs, warmup_start, decay))
            for e in range(epochs + 1)]
