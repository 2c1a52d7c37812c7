"""The learning-rate schedule of seed 000, as a pure function of the step.

LR 0.1 per 256 images scaled linearly with the global batch (6.4 for 64 GPUs x 256); linear warmup from
0.001 to the peak over `warmup_epochs` (by default the seed's share of the run: 10 of 90 epochs); then polynomial
decay of power 2 to 0 at the last epoch. Updated every step, not every epoch. The trainer and `launch plan` both take
their default and their check from here, so the plan shows the schedule the run will follow.
"""

from __future__ import annotations

import math

# Seed 000 warms up for 10 of its 90 epochs. The warmup exists to survive the first steps at a large batch's LR
# ("gradual warmup", Goyal et al., Accurate, Large Minibatch SGD: Training ImageNet in 1 Hour,
# https://arxiv.org/abs/1706.02677, 5 of 90 epochs there); a shorter run keeps the same share, not the same 10
# epochs, which would leave a 15-epoch run two thirds in warmup.
SEED_WARMUP_EPOCHS, SEED_EPOCHS = 10.0, 90
# The longest run the trainer, `launch plan` and `launch cost` take: over a hundred times the seed's 90 epochs, and
# a bound on what a plan builds per epoch (its `lr_schedule`: 10^7 epochs took 2.2 GB and 10^9 ran out of memory).
MAX_EPOCHS = 10_000


def epochs_problem(epochs: int) -> str | None:
    """None for a run length the trainer, plan and cost take (1 to MAX_EPOCHS), else one line naming --epochs."""
    if epochs < 1:
        return f"--epochs must be >= 1, got {epochs}"
    if epochs > MAX_EPOCHS:
        return f"--epochs must be <= {MAX_EPOCHS}, got {epochs} (allowed: 1 to {MAX_EPOCHS} epochs)"
    return None


def default_warmup_epochs(epochs: int) -> float:
    """The warmup a run of ``epochs`` gets unless told otherwise: the seed's 10 of 90, to two decimals (10 for 90,
    1.67 for 15, 0.11 for 1)."""
    return round(SEED_WARMUP_EPOCHS * epochs / SEED_EPOCHS, 2)


def warmup_problem(warmup_epochs: float, epochs: int) -> str | None:
    """None for a warmup the run can finish, else one line naming the options: a warmup that reaches the end of the
    run leaves the LR climbing (or at its peak) to the last step, never decaying."""
    if not warmup_epochs >= 0:  # also NaN
        return f"--warmup-epochs must be >= 0, got {warmup_epochs:g}"
    if warmup_epochs >= epochs:
        return (f"--warmup-epochs {warmup_epochs:g} reaches the end of the {epochs}-epoch run, so the LR would never "
                f"decay; allowed: 0 to less than --epochs (default for {epochs}: "
                f"{default_warmup_epochs(epochs):g}, the seed's 10 of 90)")
    return None


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


def peak_step(steps_per_epoch: int, epochs: int, warmup_epochs: float) -> int:
    """The update at which the LR is highest: the first after warmup (0 without one), or the run's last update when
    warmup rounds up to the whole run. It falls between epoch boundaries when warmup is not a whole number of
    epochs (0.11 epochs for a 1-epoch run), so the by-epoch schedule alone would miss the peak."""
    total = steps_per_epoch * epochs
    return max(min(round(warmup_epochs * steps_per_epoch), total - 1), 0)


def schedule_by_epoch(steps_per_epoch: int, epochs: int, peak: float, warmup_epochs: float = 10.0,
                      warmup_start: float = 0.001, decay: str = "poly") -> list[tuple[int, float]]:
    """[epoch, lr] at each epoch boundary, epoch 0 to the last (the `lr_schedule` of `launch plan`)."""
    return [(e, lr_at(e * steps_per_epoch, steps_per_epoch, epochs, peak, warmup_epochs, warmup_start, decay))
            for e in range(epochs + 1)]
