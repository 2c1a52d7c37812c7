"""What a checkpoint costs the training loop (issue 34 item 7): the time a step waits per checkpoint, written
synchronously (training.checkpoint.save_atomic, as the trainer did before --checkpoint-every) against written in the
background after a copy to host memory (training.ckptwriter.CheckpointWriter), in the same run, on CPU or, with
--device cuda, with the state on the GPU (there the background save's stall is queueing copies into pinned host
memory; the copy into ordinary, pageable memory the writer made before is timed beside it, as `pageable`).

The states are the trainer's checkpoint content, weights plus SGD momentum (fp32):
  resnet50    the trainer's own ResNet-50 (25.6M parameters) and its optimizer state
  bert-large  335M parameters in BERT-large's tensor shapes (24 layers of 1024, 30,522-token vocabulary)

Each round: a synchronous save (the whole write is the stall), then --saves background saves separated by a pause
1.2 times as long as the synchronous write took (the training between checkpoints; then the previous write is done
when the next one starts, as with any interval longer than a write). One writer for all rounds, as one run has: its
first save allocates the host copy (printed apart), later ones copy into it. Prints each and `ratio=` last: the
background stall over the synchronous one, for the last model measured (BERT-large by default).

    .venv/bin/python bench/checkpoint_stall.py [--models resnet50,bert-large] [--rounds 2] [--saves 3] [--dir DIR]
        [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def bert_large_shapes() -> list[tuple[int, ...]]:
    """BERT-large's parameters (Devlin et al. 2019, https://arxiv.org/abs/1810.04805, Table: L=24, H=1024, A=16;
    335M parameters with the pre-training heads, as the example's model counts them)."""
    h, ff, vocab = 1024, 4096, 30522
    shapes: list[tuple[int, ...]] = [(vocab, h), (512, h), (2, h), (h,), (h,)]
    for _ in range(24):
        shapes += [(h, h), (h,)] * 4 + [(h,), (h,), (ff, h), (ff,), (h, ff), (h,), (h,), (h,)]
    shapes += [(h, h), (h,), (h, h), (h,), (h,), (h,), (vocab,), (2, h), (2,)]
    return shapes


def state_of(name: str, device: str = "cpu"):
    import torch

    torch.manual_seed(0)
    if name == "resnet50":
        from training.model import build_model

        net = build_model("resnet50", 1000).to(device)
        weights = net.state_dict()
        params = [p for p in net.parameters()]
    else:
        weights = {f"p{i}": torch.randn(s, device=device) for i, s in enumerate(bert_large_shapes())}
        params = list(weights.values())
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.9)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()  # the momentum buffers exist, as in a checkpoint after the first step
    count = sum(p.numel() for p in params)
    return {"model": weights, "optimizer": opt.state_dict(), "epoch": 0, "step": 0}, count


def main() -> None:
    from training.checkpoint import save_atomic
    from training.ckptwriter import CheckpointWriter

    p = argparse.ArgumentParser()
    p.add_argument("--models", default="resnet50,bert-large")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--saves", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temporary directory under /tmp)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    a = p.parse_args()
    import torch

    def pageable(obj):  # the writer's copy before pinned memory: .to("cpu") into fresh, pageable memory
        if isinstance(obj, torch.Tensor):
            return obj.detach().to("cpu", copy=True)
        if isinstance(obj, dict):
            return {k: pageable(v) for k, v in obj.items()}
        return [pageable(v) for v in obj] if isinstance(obj, list | tuple) else obj

    ratio = None
    with tempfile.TemporaryDirectory(dir=a.dir) as d:
        out = Path(d)
        for name in a.models.split(","):
            state, count = state_of(name, a.device)
            sync, stall, paged = [], [], []
            writer = CheckpointWriter(out)  # one a run, as the trainer's: its host copy is reused after the first
            for r in range(a.rounds):
                t0 = time.perf_counter()
                save_atomic(state, out / "checkpoint-epoch000.pt")
                sync.append(time.perf_counter() - t0)
                for s in range(a.saves):
                    stall.append(writer.save(state, out / f"checkpoint-epoch001-step{r * a.saves + s + 1:08d}.pt"))
                    time.sleep(sync[-1] * 1.2)  # training until the next checkpoint
                writer.wait()
                if a.device == "cuda":
                    t0 = time.perf_counter()
                    pageable(state)
                    paged.append(time.perf_counter() - t0)
            first, stall = stall[0], stall[1:]
            size = (out / "checkpoint-epoch000.pt").stat().st_size
            s_sync, s_bg = statistics.median(sync), statistics.median(stall)
            ratio = s_bg / s_sync
            print(f"{name}: {count / 1e6:.1f}M parameters, {size / 1e6:,.0f} MB a checkpoint; stall per checkpoint "
                  f"synchronous {s_sync:.3f} s (median of {len(sync)}), background {s_bg:.3f} s (median of "
                  f"{len(stall)}: the copy into the reused host buffers; the run's first, allocating them, "
                  f"{first:.3f} s), ratio {ratio:.3f}"
                  + (f"; pageable copy {statistics.median(paged):.3f} s" if paged else ""), flush=True)
            del state
    print(f"ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
