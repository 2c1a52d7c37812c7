"""After a run: its measured training loop beside the model's prediction for the shape that ran. Pure."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from launcher.cost.model import Estimate

__all__ = ["RunCheck", "check_run"]


class RunCheck(BaseModel):
    """A finished run's measured throughput, loop time and cost beside the model's prediction for the same shape.

    The comparison covers the training loop (the trainer's ``time_s`` over ``images`` trained): provisioning,
    staging, checkpoints and validation are not in it, so the predicted time is ``images / images_per_sec``.
    """

    model_config = ConfigDict(frozen=True)

    predicted: Estimate
    images: int = Field(gt=0, description="images the run trained (all ranks, all epochs it ran)")
    measured_images_per_sec: float
    measured_steady_images_per_sec: float | None = Field(description="without the first logging window, if known")
    measured_loop_s: float

    @property
    def predicted_loop_s(self) -> float:
        return self.images / self.predicted.images_per_sec

    def cost(self, seconds: float) -> float:
        return self.predicted.cluster_usd_per_hour * seconds / 3600

    @property
    def rows(self) -> list[tuple[str, str, str, float]]:
        """(what, measured, predicted, relative error of measured against predicted)."""
        p = self.predicted
        rows = [("throughput", f"{self.measured_images_per_sec:,.0f} img/s", f"{p.images_per_sec:,.0f} img/s",
                 _off(self.measured_images_per_sec, p.images_per_sec))]
        if self.measured_steady_images_per_sec:
            rows.append(("steady throughput", f"{self.measured_steady_images_per_sec:,.0f} img/s",
                         f"{p.images_per_sec:,.0f} img/s", _off(self.measured_steady_images_per_sec, p.images_per_sec)))
        rows += [
            (f"time for {self.images:,} images", _duration(self.measured_loop_s), _duration(self.predicted_loop_s),
             _off(self.measured_loop_s, self.predicted_loop_s)),
            (f"cost at ${p.cluster_usd_per_hour:,.2f}/h", f"${self.cost(self.measured_loop_s):,.2f}",
             f"${self.cost(self.predicted_loop_s):,.2f}", _off(self.measured_loop_s, self.predicted_loop_s)),
        ]
        return rows

    def verdict(self) -> str:
        """One line: how far off the model was on throughput, the figure time and cost follow from."""
        off = _off(self.measured_images_per_sec, self.predicted.images_per_sec)
        if abs(off) < 0.005:
            return f"measured throughput matched the model's prediction for {self.predicted.shape} (within 0.5%)"
        direction = "above" if off > 0 else "below"
        time_off = _off(self.measured_loop_s, self.predicted_loop_s)
        return (f"measured throughput was {abs(off):.1%} {direction} the model's prediction for "
                f"{self.predicted.shape}; time and cost were off by {time_off:+.1%}")


def _off(measured: float, predicted: float) -> float:
    return (measured - predicted) / predicted if predicted else math.inf


def _duration(seconds: float) -> str:
    return f"{seconds:,.1f} s" if seconds < 120 else f"{seconds / 60:,.1f} min"


def check_run(predicted: Estimate, *, images: int, images_per_sec: float, loop_s: float,
              steady_images_per_sec: float | None = None) -> RunCheck:
    """Compare a run's measured training loop with ``predicted``, the estimate for the shape that ran."""
    if not (images > 0 and images_per_sec > 0 and loop_s > 0):
        raise ValueError(f"a run check needs positive measured images, images/s and time; got {images}, "
                         f"{images_per_sec}, {loop_s}")
    return RunCheck(predicted=predicted, images=images, measured_images_per_sec=images_per_sec,
                    measured_steady_images_per_sec=steady_images_per_sec, measured_loop_s=loop_s)
