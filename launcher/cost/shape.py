"""The shape of a run the cost model prices: steps per epoch (a batch too large for a rank's share is refused) and the
CPU tier's nodes (seed 003's parameter servers, seed 004's reducers), and the range of numbers the model answers in.
Pure; launcher.cost.model re-exports it."""

from __future__ import annotations

import math
from typing import TypeVar

from pydantic import BaseModel

# The largest whole number a float holds exactly (IEEE 754 binary64: a 53-bit significand): a count of samples or
# parameters beyond it is rounded once the model divides it, and from about 1.8e308 on it is no float at all
# (Python's OverflowError). The commands refuse such counts before the model sees them.
MAX_COUNT = 2**53

_TIER_NOUN = {"ps": "parameter server", "reducers": "reducer"}


class BatchTooLarge(ValueError):
    """An epoch's share of samples per rank is smaller than one batch: no step would run (a bad --batch-per-gpu or
    --nodes, said by `launch plan` and `launch cost` alike)."""


def steps_per_epoch(images: int, ranks: int, batch_per_gpu: int) -> int:
    """Full batches each rank makes from an even share of the epoch's images (the trainer drops the rest)."""
    steps = images // ranks // batch_per_gpu
    if steps < 1:
        raise BatchTooLarge(f"{images:,} images over {ranks} ranks is {images // ranks:,} per rank, fewer than one "
                            f"batch of {batch_per_gpu}; use fewer nodes or a smaller --batch-per-gpu")
    return steps


def tier_noun(strategy: str) -> str:
    """'reducer' or 'parameter server': what one node of the strategy's CPU tier is called."""
    return _TIER_NOUN[strategy]


def default_tier_nodes(strategy: str, nodes: int) -> int:
    """Seed 003's 2 parameter servers per worker; seed 004's one reducer per worker; none for horovod."""
    return {"ps": 2 * nodes, "reducers": nodes}.get(strategy, 0)


class OutOfRange(ValueError):
    """The inputs make a figure of an estimate infinite or not a number (a per-GPU throughput of 1e-300 img/s takes
    inf seconds): refused in one line rather than printed, plotted or written as JSON, which has no inf (RFC 8259,
    section 6: "Infinity and NaN are not permitted")."""


class PriceOutOfRange(OutOfRange):
    """The price this machine has (a cached quote), not an option, is what makes the cost infinite."""


Model = TypeVar("Model", bound=BaseModel)


def finite(estimate: Model) -> Model:
    """``estimate`` when every float of it is finite, else :class:`OutOfRange` naming the first that is not."""
    for name, value in estimate:
        if isinstance(value, float) and not math.isfinite(value):
            what = name.removesuffix("_s").removesuffix("_usd").replace("_", " ")
            shape = getattr(estimate, "shape", "the shape")
            hourly = getattr(estimate, "cluster_usd_per_hour", math.nan)
            hours = getattr(estimate, "time_to_train_s", math.nan) / 3600
            if "usd" in name and math.isfinite(hours) and hourly > hours:  # the price is the larger factor
                raise PriceOutOfRange(f"{shape}: the {what} comes to {value:g} at ${hourly:g}/h, beyond what the model "
                                      f"can count; check the price (`launch cost --refresh-prices` rewrites the "
                                      f"cache)")
            rate, unit = getattr(estimate, "gpu_images_per_sec", math.nan), getattr(estimate, "rate_unit", "")
            source = str(getattr(estimate, "throughput_source", "")).split(":")[0]
            raise OutOfRange(f"{shape}: the {what} comes to {value:g}, beyond what the model can count (per-GPU "
                             f"throughput {rate:g} {unit}, {source}); give a larger per-GPU throughput, or fewer "
                             f"samples, parameters or GFLOP per sample")
    return estimate
