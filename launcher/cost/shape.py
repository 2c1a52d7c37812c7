"""The shape of a run the cost model prices: steps per epoch (a batch too large for a rank's share is refused) and the
CPU tier's nodes (seed 003's parameter servers, seed 004's reducers). Pure; launcher.cost.model re-exports it."""

from __future__ import annotations

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
