"""What recording a rank's progress costs a training step (training/progress.py; issue: "under 1% of step time at 2
ranks on CPU"). In the same run, alternating rounds:

  step        one CPU training step of ResNet-18 at the trainer's smallest sizes (batch 8, 64 px): forward,
              backward, SGD step, as a rank of `launch train` runs it on the local cluster
  step+rec    the same step with the trainer's progress calls around it (the data add, three phases, step_done)
              writing to a file in a temporary directory, flushed at most once a second as in a run

Then the recording alone, the same calls around empty phases over 20,000 steps. Prints each and `ratio=` last: the
recording's time per step over a step's (under 0.01 meets the issue's bound); step+rec against step is printed too,
though at a fraction of a percent it is within the rounds' noise.

    .venv/bin/python bench/progress.py [--steps 30] [--rounds 5]

With --device cuda (a device machine): ResNet-50 at 224 px, batch 128, fp16 autocast, channels_last, as a GPU rank
runs it, the recording timing phases by CUDA events (training/progress.py). It also prints what each phase was
recorded as, by the events and by the host's clock (the recorder before CUDA events), per step.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    import torch
    import torch.nn.functional as F

    from training.model import build_model
    from training.progress import Progress

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = p.parse_args()
    torch.manual_seed(0)
    cuda = a.device == "cuda"
    device = torch.device(a.device)
    if cuda:
        torch.backends.cudnn.benchmark = True
        net = build_model("resnet50", 1000).to(device, memory_format=torch.channels_last)
        x = torch.randn(128, 3, 224, 224, device=device).to(memory_format=torch.channels_last)
        y = torch.randint(0, 1000, (128,), device=device)
    else:
        torch.set_num_threads(1)  # a rank of the local cluster: one core
        net = build_model("resnet18", 10)
        x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(enabled=cuda)

    def steps(progress: Progress) -> float:
        t0 = time.perf_counter()
        for i in range(a.steps):
            progress.add("data", 0.0)
            opt.zero_grad()
            with progress.phase("forward"), torch.autocast(a.device, dtype=torch.float16, enabled=cuda):
                loss = F.cross_entropy(net(x), y)
            with progress.phase("backward"):
                scaler.scale(loss).backward()
            with progress.phase("optimizer"):
                scaler.step(opt)  # on a GPU: waits for the inf check, so the host's clock puts the GPU's time here
                scaler.update()
            progress.step_done(i)
        if cuda:
            torch.cuda.synchronize()
        return (time.perf_counter() - t0) / a.steps

    steps(Progress(None))  # warm up
    plain, recorded = [], []
    with tempfile.TemporaryDirectory() as d:
        for r in range(a.rounds):
            plain.append(steps(Progress(None)))
            rec = Progress(Path(d) / f"rank-0@bench-{r}.tsv", device=device)
            recorded.append(steps(rec))
            rec.close()
        if cuda:  # what each phase is recorded as: by CUDA events (the last round) and by the host's clock
            host = Progress(Path(d) / "rank-0@bench-host.tsv")
            steps(host)
            host.close()
            files = (("CUDA events", f"rank-0@bench-{a.rounds - 1}.tsv"), ("host clock", "rank-0@bench-host.tsv"))
            for how, f in files:
                rows = [ln.split("\t") for ln in (Path(d) / f).read_text().splitlines()]
                means = [statistics.median(float(r[k]) for r in rows) * 1e3 for k in (3, 4, 5)]
                print(f"recorded by {how:11}  forward {means[0]:7.2f} ms  backward {means[1]:7.2f} ms  "
                      f"optimizer {means[2]:7.2f} ms (medians of {len(rows)} steps)")
        # The recording alone, timed over many steps: the same calls with nothing inside the phases.
        rec = Progress(Path(d) / "rank-0@bench-alone.tsv", device=device)
        n = 20_000
        t0 = time.perf_counter()
        for i in range(n):
            rec.add("data", 0.0)
            with rec.phase("forward"):
                pass
            with rec.phase("backward"):
                pass
            with rec.phase("optimizer"):
                pass
            rec.step_done(i)
        rec.close()
        alone = (time.perf_counter() - t0) / n
    base, with_rec = statistics.median(plain), statistics.median(recorded)
    print(f"step             {base * 1e3:8.2f} ms (median of {a.rounds} rounds of {a.steps} steps)")
    print(f"step+rec         {with_rec * 1e3:8.2f} ms ({(with_rec - base) / base:+.2%}: within the rounds' noise)")
    print(f"recording alone  {alone * 1e6:8.2f} us per step")
    print(f"ratio={alone / base:.6f}")


if __name__ == "__main__":
    main()
