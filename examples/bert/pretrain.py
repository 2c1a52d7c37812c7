"""BERT-style masked-language-model pre-training through training.distributed: Horovod, DDP or the reducer tier.

Every process runs this file; the engine comes from the environment (training/distributed.py's table):
    python examples/bert/pretrain.py --size tiny --steps 200                     # one process, the CPU
    torchrun --nproc-per-node 8 examples/bert/pretrain.py --size large            # DDP
    mpirun -np 16 python examples/bert/pretrain.py --size large                  # Horovod
    launch run --nodes 4 -- python examples/bert/pretrain.py --size large         # what the launcher set
    ... --synthetic                                                               # random tokens: throughput only
The text is the Python reference manual that ships with Python (pydoc_data); nothing is downloaded. Rank 0 alone
prints and writes --output (summary.json). Every distributed call is marked `# Distributed:`.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import itertools
import json
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # bert.py beside this file
from bert import SIZES, BertMLM, Vocab, corpus, count_params, mask_tokens, mlm_loss, sequences  # noqa: E402

from training import distributed  # noqa: E402
from training.options import RankParser, launch_rank  # noqa: E402


class PretrainError(RuntimeError):
    """A verdict about this run's input, one line; every rank that reached it says it and exits `status`."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = RankParser(prog="pretrain.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="tiny", help="tiny (CPU tests), base, large (BERT-large)")
    p.add_argument("--steps", type=int, default=100, help="optimizer steps")
    p.add_argument("--batch", type=int, default=8, help="sequences per process per step")
    p.add_argument("--accumulate", type=int, default=1, help="micro-batches per step (--batch split into them)")
    p.add_argument("--seq-len", type=int, default=0, help="tokens per sequence; 0 = the size's (tiny 32, else 128)")
    p.add_argument("--lr", type=float, default=0.0, help="AdamW peak learning rate; 0 = the size's")
    p.add_argument("--warmup", type=int, default=10, help="steps of linear warmup, then linear decay to 0")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], default="auto",
                   help="auto: bf16 on a GPU that has it, else fp16 on GPU, fp32 on CPU")
    p.add_argument("--fp16-allreduce", action="store_true", help="gradients cross the wire in fp16")
    p.add_argument("--synthetic", action="store_true", help="random tokens, the same batch every step: throughput only")
    p.add_argument("--log-every", type=int, default=10, help="steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads; 0 = OMP_NUM_THREADS or cores / ranks")
    p.add_argument("--output", default="", help="directory for summary.json (rank 0)")
    p.add_argument("--dump-rank-params", action="store_true", help="each rank saves its final parameters there")
    args = p.parse_args(argv)
    for name in ("steps", "batch", "accumulate", "log_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.batch % args.accumulate:
        p.error(f"--batch {args.batch} must be a multiple of --accumulate {args.accumulate}")
    size = SIZES[args.size]
    args.seq_len = args.seq_len or size.seq_len
    if not 3 <= args.seq_len <= size.positions:
        p.error(f"--seq-len must be 3 to {size.positions} for --size {args.size}, got {args.seq_len}")
    if args.dump_rank_params and not args.output:
        p.error("--dump-rank-params needs --output")
    if problem := number_problem(args):
        p.error(problem)
    return args


def number_problem(args: argparse.Namespace) -> str | None:
    """The first hyperparameter out of its range, as the user types it; None when all are in range.

    AdamW's learning rate must be >= 0 (torch.optim.AdamW raises "Invalid learning rate" below it,
    https://docs.pytorch.org/docs/stable/generated/torch.optim.AdamW.html) and here 0 means the size's; dropout is a
    probability of zeroing, "p – probability of an element to be zeroed. Default: 0.5" in [0, 1)
    (https://docs.pytorch.org/docs/stable/generated/torch.nn.Dropout.html; 1 zeroes everything). NaN passes every
    comparison but `math.isfinite`, so it is checked first."""
    if not math.isfinite(args.lr) or args.lr < 0:
        return f"--lr must be a finite number >= 0 (0: the size's), got {args.lr:g}"
    if not math.isfinite(args.dropout) or not 0 <= args.dropout < 1:
        return f"--dropout must be a probability from 0 up to (not including) 1, got {args.dropout:g}"
    if args.warmup < 0:
        return f"--warmup must be >= 0 steps, got {args.warmup}"
    if args.threads < 0:
        return f"--threads must be >= 0, got {args.threads}"
    return None


def output_problem(output: str) -> str | None:
    """Why rank 0 could not write summary.json under --output (a file there, a directory it cannot write), checked on
    every rank before the first step; None when it can (or when there is no --output)."""
    if not output:
        return None
    path = Path(output)
    if path.exists() and not path.is_dir():
        return f"--output {output} is a file, not a directory"
    existing = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        return f"--output {output}: cannot write in {existing} (permission denied or a read-only file system)"
    return None


def lr_at(step: int, steps: int, peak: float, warmup: int) -> float:
    """BERT's schedule: linear warmup over `warmup` steps, then linear decay to 0 at `steps`."""
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * max(0.0, (steps - step) / max(1, steps - warmup))


def batches(data: torch.Tensor, batch: int, rank: int, world: int, seed: int):
    """This rank's rows of `data`, batch after batch, epoch after epoch: each epoch one permutation shared by every
    rank (same seed), rank r taking rows r, r + world, ...; a partial batch at an epoch's end is dropped."""
    epoch = 0
    while True:
        order = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed * 1009 + epoch))
        mine = order[rank::world]
        for i in range(len(mine) // batch):
            yield data[mine[i * batch:(i + 1) * batch]]
        epoch += 1


def pretrain(args: argparse.Namespace) -> dict:
    # Distributed: start the engine the launcher named (or mpirun's / torchrun's variables imply).
    engine = distributed.init()
    rank, world = distributed.rank(), distributed.size()
    device = distributed.device()
    cuda = device.type == "cuda"
    if not cuda:
        torch.set_num_threads(args.threads or int(os.environ.get("OMP_NUM_THREADS", 0))
                              or max(1, (os.cpu_count() or 1) // distributed.local_size()))
    precision = args.precision if args.precision != "auto" else (
        ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if cuda else "fp32")
    log = print if rank == 0 else (lambda *a, **k: None)
    size = SIZES[args.size]

    if args.synthetic:  # one fixed random batch per rank: no text, nothing to read
        g = torch.Generator().manual_seed(args.seed * 100_003 + rank)
        fixed = torch.randint(5, size.vocab, (args.batch, args.seq_len), generator=g)
        stream, vocab_len, source = itertools.repeat(fixed), size.vocab, "synthetic tokens"
    else:
        text = corpus()
        vocab = Vocab.build(text, size.vocab)
        data = sequences(vocab.encode(text), args.seq_len)
        # Distributed: every rank must hold the same text and words (another Python's manual differs: 3.11.2 has
        # 3,826 sequences of 32 tokens where 3.11.7 has 3,848); all stop together if one does not.
        mine = hashlib.sha256(json.dumps(vocab.tokens).encode() + data.numpy().tobytes()).hexdigest()
        differs = mine != distributed.broadcast_object(mine, name="text.sha256")
        if int(distributed.allreduce(torch.tensor([float(differs)]), "sum", name="text.differs")):
            raise PretrainError("the ranks' Pythons ship different reference manuals (pydoc_data), so their "
                                "words would differ; run every rank on one image, or use --synthetic")
        if len(data) < args.batch * world:
            raise PretrainError(f"{len(data)} sequences of {args.seq_len} tokens for {world} ranks of "
                                f"--batch {args.batch}; use a smaller --batch or --seq-len", status=2)
        stream, vocab_len = batches(data, args.batch, rank, world, args.seed), len(vocab)
        source = f"{len(data)} sequences of the Python reference manual, {len(vocab)} words"

    torch.manual_seed(args.seed)  # the same initial weights everywhere (wrap broadcasts rank 0's anyway)
    net = BertMLM(size, dropout=args.dropout).to(device)
    decay = [p for p in net.parameters() if p.ndim > 1]
    no_decay = [p for p in net.parameters() if p.ndim <= 1]  # biases and LayerNorm: no weight decay
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr or size.lr, betas=(0.9, 0.999), eps=1e-6)
    # Distributed: gradients averaged over every rank; every rank starts from rank 0's weights.
    model, optimizer = distributed.wrap(net, optimizer, fp16_allreduce=args.fp16_allreduce,
                                        backward_passes_per_step=args.accumulate)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    autocast = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    params = count_params(net)
    log(f"pretraining BERT-{args.size} ({params / 1e6:.1f}M parameters) on {world} rank(s) ({engine.name}), "
        f"{source}, batch {args.batch} x {world} of {args.seq_len} tokens, {precision}, {device.type}", flush=True)

    model.train()
    losses, window_loss, skipped = [], torch.zeros((), device=device), 0
    start = window = time.perf_counter()
    steady_time, steady_seqs = 0.0, 0
    for step in range(args.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step, args.steps, args.lr or size.lr, args.warmup)
        # The masks of this rank and step, the same whichever engine trains.
        inputs, labels = mask_tokens(next(stream), vocab_len, torch.Generator().manual_seed(
            (args.seed * 1_000_003 + step) * 1024 + rank))
        inputs, labels = inputs.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        optimizer.zero_grad()
        for k, (x, y) in enumerate(zip(inputs.chunk(args.accumulate), labels.chunk(args.accumulate), strict=True)):
            # Distributed: micro-batches before the last add up locally, with no communication.
            with distributed.accumulate(model) if k < args.accumulate - 1 else contextlib.nullcontext():
                with torch.autocast(device.type, dtype=autocast, enabled=autocast is not None):
                    loss = mlm_loss(model(x), y) / args.accumulate
                scaler.scale(loss).backward()
            window_loss += loss.detach().float()
        # Distributed: the step sees the gradient averaged over every rank.
        skipped += distributed.step(optimizer, scaler if scaler.is_enabled() else None)
        if (step + 1) % args.log_every == 0 or step + 1 == args.steps:
            n = (step % args.log_every) + 1
            # Distributed: the logged loss is the mean over the ranks.
            mean = float(distributed.allreduce(window_loss.cpu() / n, "mean", name="log.loss"))
            if not math.isfinite(mean):
                raise PretrainError(f"the loss is {mean} at step {step + 1}; try a smaller --lr")
            now = time.perf_counter()
            seqs = n * args.batch * world / (now - window)
            if step + 1 > args.log_every:  # the first window holds the warm-up
                steady_time, steady_seqs = steady_time + now - window, steady_seqs + n * args.batch * world
            losses.append(mean)
            log(f"step {step + 1} loss {mean:.4f} {seqs:.1f} seq/s {seqs * args.seq_len:.0f} tok/s", flush=True)
            window, window_loss = now, torch.zeros((), device=device)
    elapsed = time.perf_counter() - start
    summary = {"size": args.size, "parameters": params, "engine": engine.name, "ranks": world, "steps": args.steps,
               "global_batch": args.batch * world, "seq_len": args.seq_len, "losses": losses,
               "sequences_per_sec": args.steps * args.batch * world / elapsed,
               "steady_sequences_per_sec": steady_seqs / steady_time if steady_time else None,
               "skipped_steps": skipped, "precision": precision, "synthetic": args.synthetic,
               "device": torch.cuda.get_device_name(device) if cuda else "cpu", "time_s": elapsed}
    if args.output:
        out = Path(args.output)
        out.mkdir(parents=True, exist_ok=True)
        if args.dump_rank_params:
            torch.save({k: v.detach().cpu() for k, v in net.named_parameters()}, out / f"params-rank{rank}.pt")
        if rank == 0:
            tmp = out / ".summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2) + "\n")
            os.replace(tmp, out / "summary.json")
    log(f"summary: BERT-{args.size} {world} ranks ({engine.name}), loss {losses[0]:.3f} -> {losses[-1]:.3f}, "
        f"{summary['sequences_per_sec']:.1f} seq/s, {elapsed:.1f} s", flush=True)
    distributed.shutdown()
    return summary


def main(argv: list[str] | None = None) -> int:
    """0 after a finished run; every other way out ends the process through distributed.leave (a rank with a live
    process group must not go through the interpreter's exit: training/distributed.py says why)."""
    args = parse_args(argv)
    if problem := output_problem(args.output):  # every rank reaches the same verdict; rank 0 says it
        distributed.leave(2, f"error: {problem}" if launch_rank() == 0 else "")
    try:
        pretrain(args)
    except distributed.DistributedError as e:
        distributed.leave(2, f"error: {e}")
    except PretrainError as e:
        distributed.leave(e.status, f"error: {e}")
    except KeyboardInterrupt:  # Ctrl-C reaches every rank: rank 0 says it, all end as a shell reports SIGINT
        distributed.leave(130, "error: interrupted" if launch_rank() == 0 else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
