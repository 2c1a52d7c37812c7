"""How often to checkpoint, as a pure decision: the work an interruption loses, and Young's interval.

Young's first-order optimum for the interval between checkpoints is sqrt(2 x C x M), C the time one checkpoint
costs and M the mean time between interruptions (J. W. Young, "A first order approximation to the optimum
checkpoint interval", Communications of the ACM 17(9), 1974, https://doi.org/10.1145/361147.361115). An interruption
lands anywhere in an interval, so on average it loses half of one (plus the restart, which is not modelled here).

C: the checkpoint's bytes over the write bandwidth the cost model assumes (launcher/cost/inputs.py
``checkpoint_write_bytes_per_sec``: an EBS gp3 volume's baseline 125 MiB/s,
https://docs.aws.amazon.com/ebs/latest/userguide/general-purpose.html#gp3-performance). The trainer writes in the
background (training/ckptwriter.py), so the step waits less than C; C is the honest upper bound the issue asks for.

M: On-Demand instances are not interrupted by AWS: "you decide when to launch, stop, hibernate, start, reboot, or
terminate it" (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-on-demand-instances.html); no interval is
suggested there (hardware failures happen but AWS publishes no rate). Spot: AWS publishes, per instance type and
Region, a "frequency of interruption" bucket in the Spot Instance Advisor
(https://aws.amazon.com/ec2/spot/instance-advisor/): "the rate at which Spot has reclaimed capacity during the
trailing month", in ranges of <5%, 5-10%, 10-15%, 15-20% and >20% (the Advisor's data,
https://spot-bid-advisor.s3.amazonaws.com/spot-advisor-data.json). A bucket is read at its upper edge (the
pessimistic end; ">20%" at 20%, which is then a floor on the rate), per instance per month of 730 hours (AWS's
month in its pricing, https://aws.amazon.com/ec2/pricing/on-demand/). A job stops when any of its nodes is
reclaimed, so N nodes are interrupted N times as often as one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MONTH_S = 730 * 3600.0
# The Spot Instance Advisor's buckets, each read at its upper edge (">20%": its lower one, the only edge it has).
SPOT_BUCKETS = {"<5%": 0.05, "5-10%": 0.10, "10-15%": 0.15, "15-20%": 0.20, ">20%": 0.20}
DEFAULT_BUCKET = "<5%"


@dataclass(frozen=True)
class Advice:
    write_s: float                 # one checkpoint's write (C)
    interval_s: float              # between checkpoints as planned (once an epoch)
    lost_s: float                  # work an interruption loses on average, at that interval
    mtbi_s: float | None           # mean time between interruptions of the job (M); None: not interrupted by AWS
    young_s: float | None          # sqrt(2 C M)
    every_steps: int | None        # Young's interval in steps (--checkpoint-every); None: once an epoch is as often
    young_lost_s: float | None     # work an interruption loses on average at Young's interval


def bucket_problem(bucket: str) -> str | None:
    if bucket not in SPOT_BUCKETS:
        return f"unknown interruption frequency '{bucket}'; choose one of the Spot Instance Advisor's: " \
               f"{', '.join(SPOT_BUCKETS)}"
    return None


def advice(checkpoint_bytes: float, write_bytes_per_sec: float, epoch_s: float, step_s: float, market: str,
           nodes: int, bucket: str = DEFAULT_BUCKET) -> Advice:
    """The interval for a run checkpointing once an epoch (`epoch_s`, steps of `step_s`) on `nodes` nodes."""
    if problem := bucket_problem(bucket):
        raise ValueError(problem)
    write_s = checkpoint_bytes / write_bytes_per_sec
    lost_s = epoch_s / 2
    if market != "spot":
        return Advice(write_s, epoch_s, lost_s, None, None, None, None)
    mtbi_s = MONTH_S / (SPOT_BUCKETS[bucket] * nodes)
    young_s = math.sqrt(2 * write_s * mtbi_s)
    if young_s >= epoch_s or step_s <= 0:  # the end-of-epoch checkpoint already comes at least that often
        return Advice(write_s, epoch_s, lost_s, mtbi_s, young_s, None, None)
    every = max(1, math.floor(young_s / step_s))
    return Advice(write_s, epoch_s, lost_s, mtbi_s, young_s, every, every * step_s / 2)


def _t(s: float) -> str:
    return f"{s:,.1f} s" if s < 120 else f"{s / 60:,.1f} min" if s < 7200 else f"{s / 3600:,.1f} h"


def lines(a: Advice, market: str, nodes: int, bucket: str = DEFAULT_BUCKET) -> list[str]:
    """The plan's checkpoint section, in words."""
    out = [f"checkpoints: one an epoch ({_t(a.interval_s)}), a write {_t(a.write_s)}; an interruption loses "
           f"{_t(a.lost_s)} of training on average (half the interval)"]
    if a.mtbi_s is None:
        out.append(f"{market}: AWS does not interrupt On-Demand instances; once an epoch is enough")
        return out
    out.append(f"spot: the Spot Instance Advisor's frequency of interruption {bucket} (read as "
               f"{SPOT_BUCKETS[bucket]:.0%} a month per instance) on {nodes} node(s): one interruption every "
               f"{_t(a.mtbi_s)} on average")
    assert a.young_s is not None
    if a.every_steps is None:
        out.append(f"Young's interval sqrt(2 x {_t(a.write_s)} x {_t(a.mtbi_s)}) = {_t(a.young_s)}: once an epoch "
                   f"is as often as that")
    else:
        assert a.young_lost_s is not None
        out.append(f"Young's interval sqrt(2 x {_t(a.write_s)} x {_t(a.mtbi_s)}) = {_t(a.young_s)}: "
                   f"launch train --checkpoint-every {a.every_steps:,} (an interruption then loses "
                   f"{_t(a.young_lost_s)} on average)")
    return out
