"""Data-parallel ResNet training with Horovod: the seed-000 recipe, one readable loop.

Runs on every rank under `mpirun` (the launcher builds that line):
    python -m training.train --data SHARDS --output RUN_DIR [--model resnet50] [--epochs 90] ...
Rank 0 alone writes: metrics.jsonl, checkpoints, the summary line. Every distributed call is marked
`# Horovod:`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from training.loader import DataError, load_manifest, make_loader, rank_shards, shards_of, steps_per_epoch
from training.model import ARCHITECTURES, build_model
from training.schedule import lr_at, peak_lr
from training.transforms import normalize


@dataclass
class Config:
    data: str                       # directory with manifest.json and the shards
    output: str                     # run directory: metrics.jsonl, checkpoints, summary.json
    model: str = "resnet50"
    image_size: int = 224           # px, square crops
    epochs: int = 90
    batch_per_gpu: int = 256        # images per rank per step
    lr_per_256: float = 0.1         # LR per 256 images, scaled linearly with the global batch
    warmup_epochs: float = 10.0     # linear warmup from warmup_start to the peak
    warmup_start: float = 0.001
    decay: str = "poly"             # poly (power 2, seed 000) or cosine
    momentum: float = 0.9           # Nesterov
    weight_decay: float = 1e-4
    label_smoothing: float = 0.0
    zero_gamma: bool = True         # last BN gamma of each residual block starts at 0
    precision: str = "auto"         # auto (fp16 on GPU, fp32 on CPU), fp32, bf16, fp16
    loss_scale: str = "dynamic"     # dynamic, or a number (seed 000: 1024) for a static scale
    fp16_allreduce: bool = False    # Horovod fp16 gradient compression
    workers: int = 2                # data loader processes per rank
    threads: int = 0                # torch CPU threads per rank; 0 = OMP_NUM_THREADS or all cores / ranks
    log_every: int = 10             # steps
    seed: int = 0
    resume: bool = False
    dump_rank_params: bool = False  # each rank saves its final parameters (consistency checks)


class TrainError(RuntimeError):
    """A problem with the run's inputs; one line for the user."""


def parse_args(argv: list[str] | None = None) -> Config:
    p = argparse.ArgumentParser(prog="python -m training.train", description=__doc__.splitlines()[0])
    for name, default in asdict(Config(data="", output="")).items():
        flag = "--" + name.replace("_", "-")
        if name in ("data", "output"):
            p.add_argument(flag, required=True)
        elif isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default)
        elif name == "model":
            p.add_argument(flag, default=default, choices=sorted(ARCHITECTURES))
        elif name == "decay":
            p.add_argument(flag, default=default, choices=["poly", "cosine"])
        elif name == "precision":
            p.add_argument(flag, default=default, choices=["auto", "fp32", "bf16", "fp16"])
        else:
            p.add_argument(flag, type=type(default), default=default)
    cfg = Config(**vars(p.parse_args(argv)))
    for name in ("epochs", "batch_per_gpu", "image_size", "log_every"):
        if getattr(cfg, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    if cfg.loss_scale != "dynamic":
        try:
            float(cfg.loss_scale)
        except ValueError:
            p.error(f"--loss-scale must be 'dynamic' or a number, got '{cfg.loss_scale}'")
    return cfg


def accuracy_counts(logits: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> list[int]:
    """Number of samples whose label is in the top-k predictions, for each k."""
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hits = top.eq(labels.view(-1, 1))
    return [int(hits[:, :k].any(dim=1).sum()) for k in ks]


def newest_checkpoint(out: Path, model: str) -> tuple[Path, dict] | None:
    """The newest checkpoint that loads; one made by another model is an error, not a silent restart."""
    for path in sorted(out.glob("checkpoint-epoch*.pt"), reverse=True):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception:  # a torn or corrupt file: fall back to the one before
            continue
        if state["config"]["model"] != model:
            raise TrainError(f"checkpoint {path.name} was made by {state['config']['model']}, not {model}; "
                             f"use another --output or the same --model")
        return path, state
    return None


def save_atomic(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def train(cfg: Config) -> dict:
    import horovod.torch as hvd

    # Horovod: initialize and pin this rank to a GPU (local rank), or share the cores on CPU.
    hvd.init()
    rank, world = hvd.rank(), hvd.size()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", hvd.local_rank()) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(cfg.threads or int(os.environ.get("OMP_NUM_THREADS", 0))
                              or max(1, (os.cpu_count() or 1) // hvd.local_size()))
    precision = cfg.precision if cfg.precision != "auto" else ("fp16" if cuda else "fp32")
    memory_format = torch.channels_last if cuda else torch.contiguous_format
    log = print if rank == 0 else (lambda *a, **k: None)

    data, out = Path(cfg.data), Path(cfg.output)
    manifest = load_manifest(data)
    num_classes = len(manifest["classes"])
    train_shards, val_shards = shards_of(manifest, "train"), shards_of(manifest, "val")
    if len(train_shards) < world:
        raise TrainError(f"{len(train_shards)} training shard(s) for {world} ranks: every rank needs one; "
                         f"convert with a smaller --shard-size")
    steps = steps_per_epoch(train_shards, world, cfg.batch_per_gpu)
    if steps == 0:
        smallest = min(sum(s["count"] for s in rank_shards(train_shards, r, world)) for r in range(world))
        raise TrainError(f"--batch-per-gpu {cfg.batch_per_gpu} is larger than the {smallest} samples the "
                         f"smallest rank holds; use a batch of at most {smallest}")
    global_batch = cfg.batch_per_gpu * world
    peak = peak_lr(global_batch, cfg.lr_per_256)

    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model, num_classes, zero_init_residual=cfg.zero_gamma)
    model = model.to(device, memory_format=memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.warmup_start, momentum=cfg.momentum,
                                nesterov=True, weight_decay=cfg.weight_decay)
    scaler = torch.amp.GradScaler("cuda" if cuda else "cpu", enabled=precision == "fp16",
                                  init_scale=2.0**16 if cfg.loss_scale == "dynamic" else float(cfg.loss_scale),
                                  growth_interval=2000 if cfg.loss_scale == "dynamic" else 10**9,
                                  backoff_factor=0.5 if cfg.loss_scale == "dynamic" else 1.0)

    start_epoch = 0
    if cfg.resume and rank == 0:
        found = newest_checkpoint(out, cfg.model)
        if found:
            path, state = found
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            scaler.load_state_dict(state["scaler"])
            start_epoch = state["epoch"] + 1
            log(f"resuming from {path.name}: epoch {start_epoch}, step {state['step'] + 1}", flush=True)
        else:
            log(f"--resume: no checkpoint in {out}; starting from scratch", flush=True)
    # Horovod: every rank starts from rank 0's parameters, optimizer state and epoch.
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    start_epoch = hvd.broadcast_object(start_epoch, root_rank=0)

    # Horovod: wrap the optimizer so gradients are averaged across ranks during backward.
    compression = hvd.Compression.fp16 if cfg.fp16_allreduce else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression, op=hvd.Average)

    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        metrics = open(out / "metrics.jsonl", "a")  # noqa: SIM115 - closed at the end of the run
    log(f"training {cfg.model} on {world} rank(s), {num_classes} classes, {steps} steps/epoch, "
        f"global batch {global_batch}, peak lr {peak:.4g}, {precision}, {device.type}", flush=True)

    def record(**row) -> None:
        if rank == 0:
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()

    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    run_start, images_seen = time.perf_counter(), 0
    for epoch in range(start_epoch, cfg.epochs):
        model.train()
        loader = make_loader(data, rank_shards(train_shards, rank, world), cfg.image_size, cfg.batch_per_gpu,
                             train=True, seed=cfg.seed, epoch=epoch, rank=rank, workers=cfg.workers,
                             pin_memory=cuda)
        epoch_start, window_start, loss_sum = time.perf_counter(), time.perf_counter(), 0.0
        batches = iter(loader)
        for i in range(steps):
            step = epoch * steps + i
            lr = lr_at(step, steps, cfg.epochs, peak, cfg.warmup_epochs, cfg.warmup_start, cfg.decay)
            for group in optimizer.param_groups:
                group["lr"] = lr
            images, labels = next(batches)
            x = normalize(images.to(device, non_blocking=True), memory_format)
            y = labels.to(device, non_blocking=True)
            with torch.autocast(device.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                loss = F.cross_entropy(model(x), y, label_smoothing=cfg.label_smoothing)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            if scaler.is_enabled():
                # Horovod: finish the allreduce before unscaling, so the scaler sees reduced gradients.
                optimizer.synchronize()
                scaler.unscale_(optimizer)
                with optimizer.skip_synchronize():
                    scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            loss_sum += float(loss.detach())
            if (i + 1) % cfg.log_every == 0 or i + 1 == steps:
                # Horovod: the logged loss is the mean over ranks.
                mean_loss = float(hvd.allreduce(torch.tensor(loss_sum / ((i % cfg.log_every) + 1)),
                                                op=hvd.Average, name="log.loss"))
                now = time.perf_counter()
                n = (i % cfg.log_every) + 1
                ips = n * global_batch / (now - window_start)
                record(epoch=epoch, step=step + 1, lr=lr, loss=mean_loss, images_per_sec=ips)
                log(f"epoch {epoch} step {step + 1} lr {lr:.4g} loss {mean_loss:.4f} {ips:.0f} img/s", flush=True)
                window_start, loss_sum = now, 0.0
        del batches, loader
        epoch_time = time.perf_counter() - epoch_start
        images_seen += steps * global_batch
        # Horovod: average BatchNorm running statistics, so the checkpoint and validation use one model.
        for name, buf in model.named_buffers():
            if buf.is_floating_point():
                buf.copy_(hvd.allreduce(buf, op=hvd.Average, name=f"bn.{name}"))
        record(epoch=epoch, step=(epoch + 1) * steps, lr=lr, loss=mean_loss,
               images_per_sec=steps * global_batch / epoch_time, epoch_time_s=epoch_time)
        if rank == 0:
            save_atomic({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                         "scaler": scaler.state_dict(), "epoch": epoch, "step": (epoch + 1) * steps - 1,
                         "rng": {"torch": torch.get_rng_state(), "python": random.getstate(),
                                 "numpy": np.random.get_state()},
                         "config": asdict(cfg)},
                        out / f"checkpoint-epoch{epoch:03d}.pt")

    top1, top5, val_count = validate(model, data, val_shards, cfg, device, memory_format, hvd)
    elapsed = time.perf_counter() - run_start
    summary = {"model": cfg.model, "classes": num_classes, "ranks": world, "epochs": cfg.epochs,
               "steps_per_epoch": steps,
               "global_batch": global_batch, "top1": top1, "top5": top5, "val_samples": val_count,
               "train_images": images_seen, "images_per_sec": images_seen / elapsed if images_seen else 0.0,
               "time_s": elapsed, "precision": precision, "device": device.type}
    if top1 is not None:
        record(epoch=cfg.epochs - 1, step=cfg.epochs * steps, lr=0.0, loss=mean_loss if images_seen else None,
               images_per_sec=summary["images_per_sec"], top1=top1, top5=top5)
    if cfg.dump_rank_params:
        torch.save({k: v.detach().cpu() for k, v in model.named_parameters()}, out / f"params-rank{rank}.pt")
    if rank == 0:
        metrics.close()
        tmp = out / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, out / "summary.json")
        top = "n/a" if top1 is None else f"{top1:.2%}"
        log(f"summary: {cfg.model} {world} ranks, {cfg.epochs} epochs, top-1 {top}, "
            f"{summary['images_per_sec']:.0f} img/s, {elapsed:.1f} s", flush=True)
    return summary


@torch.no_grad()
def validate(model, data: Path, val_shards: list[dict], cfg: Config, device, memory_format, hvd):
    """Top-1 / top-5 over exactly the validation set: each rank its own shards, counts summed."""
    model.eval()
    mine = rank_shards(val_shards, hvd.rank(), hvd.size())
    counts = torch.zeros(3, dtype=torch.float64)
    if mine:
        loader = make_loader(data, mine, cfg.image_size, cfg.batch_per_gpu, train=False, seed=cfg.seed,
                             epoch=0, rank=hvd.rank(), workers=cfg.workers)
        for images, labels in loader:
            logits = model(normalize(images.to(device), memory_format)).float()
            c1, c5 = accuracy_counts(logits, labels.to(device))
            counts += torch.tensor([c1, c5, len(labels)], dtype=torch.float64)
    # Horovod: sum the hit counts and sample counts of all ranks.
    counts = hvd.allreduce(counts, op=hvd.Sum, name="val.counts")
    total = int(counts[2])
    if total == 0:
        return None, None, 0
    return float(counts[0]) / total, float(counts[1]) / total, total


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    try:
        train(cfg)
    except (TrainError, DataError) as e:
        # Every rank reaches the same verdict from the same manifest and options; rank 0 says it once.
        if os.environ.get("OMPI_COMM_WORLD_RANK", "0") == "0":
            print(f"error: {e}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
