"""Data-parallel ResNet training with Horovod (or DDP): the seed-000 recipe, one readable loop.

Runs on every rank under `mpirun` (the launcher builds that line):
    python -m training.train --data SHARDS --output RUN_DIR [--model resnet50] [--epochs 90] ...
    python -m training.train --synthetic --output RUN_DIR ...      # random tensors on the device, no I/O
Rank 0 alone writes: metrics.jsonl, checkpoints, TensorBoard events, summary.json and the summary line.
Every distributed call goes through training/engine.py and is marked `# Distributed:`.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import tarfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F

from training import checkpoint, distributed, durable, gpudecode, stopping
from training import engine as engines
from training.checkpoint import CheckpointError, newest_checkpoint, output_problem, restore
from training.ckptwriter import CheckpointWriter, finish_writes
from training.loader import DataError, load_manifest, make_loader, rank_shards, shards_of, steps_per_epoch
from training.model import build_model
from training.options import Config, launch_rank, launch_world, parse_args, paths_problem
from training.progress import Progress, progress_path
from training.schedule import lr_at, peak_lr
from training.transforms import normalize

__all__ = ["Config", "TrainError", "main", "parse_args", "train"]


class TrainError(RuntimeError):
    """A problem with the run's inputs; one line for the user.

    `everywhere`: every rank reached the same verdict (rank 0 says it once); otherwise the rank that hit it
    says it, prefixed with its rank. `status`: the exit status, 2 for input found wrong before the first step.
    """

    def __init__(self, message: str, everywhere: bool = True, status: int = 1):
        super().__init__(message)
        self.everywhere, self.status = everywhere, status


def accuracy_counts(logits: torch.Tensor, labels: torch.Tensor, ks=(1, 5)) -> list[int]:
    """Number of samples whose label is in the top-k predictions, for each k."""
    top = logits.topk(min(max(ks), logits.shape[1]), dim=1).indices
    hits = top.eq(labels.view(-1, 1))
    return [int(hits[:, :k].any(dim=1).sum()) for k in ks]


def param_groups(model: torch.nn.Module, weight_decay: float, decay_bn_bias: bool) -> list[dict]:
    """SGD parameter groups: weight decay on everything, or (decay_bn_bias=False) not on BN and biases."""
    if decay_bn_bias:
        return [{"params": list(model.parameters()), "weight_decay": weight_decay}]
    no_decay = [p for p in model.parameters() if p.ndim <= 1]  # BN gamma/beta and every bias are 1-d
    decay = [p for p in model.parameters() if p.ndim > 1]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def tensorboard_writer(enabled: bool, directory: Path):
    """A SummaryWriter when asked for and tensorboard is installed; None otherwise."""
    if not enabled:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(log_dir=str(directory))


READ_ERRORS = (DataError, OSError, EOFError, tarfile.TarError)  # a shard that cannot be read or decoded


def rank_local(e: Exception) -> TrainError:
    """A data error one rank hit mid-run (possibly re-raised from a loader worker, traceback and all), as one
    line: the original exception's last line without its class name."""
    last = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
    return TrainError(re.sub(r"^[\w.]+(Error|Exception): ", "", last), everywhere=False)


def what_it_reads(cfg: Config, world: int) -> tuple[int, list[dict], list[dict], int]:
    """(classes, training shards, validation shards, steps per epoch): the manifest's, checked whole (names, counts,
    splits, classes: training.shards.TrainingManifest) against `world` ranks; nothing at all with --synthetic. Every
    rank reaches the same verdict from the same shared files, so each stops by itself, before any process group: a
    rank that left while another was still joining the group (gloo's connections) was a `Connection reset by peer`
    traceback on that other rank (CI, 2026-11-28), not the one line."""
    data = Path(cfg.data)
    if cfg.synthetic:
        num_classes, train_shards, val_shards = cfg.num_classes, [], []
        steps = cfg.steps_per_epoch or 100
    else:
        try:  # checked whole (names, counts, splits, classes) before a step: training.shards.TrainingManifest
            manifest = load_manifest(data, training=True)
        except DataError as e:
            raise TrainError(str(e), status=2) from None
        num_classes = len(manifest["classes"])
        train_shards, val_shards = shards_of(manifest, "train"), shards_of(manifest, "val")
        if len(train_shards) < world:
            raise TrainError(f"{len(train_shards)} training shard(s) for {world} ranks: every rank needs one; "
                             f"convert with a smaller --shard-size", status=2)
        steps = steps_per_epoch(train_shards, world, cfg.batch_per_gpu)
        if steps == 0:
            smallest = min(sum(s["count"] for s in rank_shards(train_shards, r, world)) for r in range(world))
            raise TrainError(f"--batch-per-gpu {cfg.batch_per_gpu} is larger than the {smallest} samples the "
                             f"smallest rank holds; use a batch of at most {smallest}", status=2)
        steps = min(steps, cfg.steps_per_epoch or steps)
    return num_classes, train_shards, val_shards, steps


def train(cfg: Config) -> dict:
    num_classes, train_shards, val_shards, steps = what_it_reads(cfg, launch_world())
    # Distributed: start the engine; pin this rank to a GPU (local rank), or share the cores on CPU.
    engine = engines.start(cfg.engine, reducers=cfg.reducers)
    rank, world = engine.rank, engine.size
    if world != launch_world():  # a launcher that does not say the world in the environment: judged again
        num_classes, train_shards, val_shards, steps = what_it_reads(cfg, world)
    data, out = Path(cfg.data), Path(cfg.output)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", engine.local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        if cfg.threads:  # the launcher's share (launcher/plans/loading.py): the GPU computes, loader workers decode
            torch.set_num_threads(cfg.threads)
    else:
        torch.set_num_threads(cfg.threads or int(os.environ.get("OMP_NUM_THREADS", 0))
                              or max(1, (os.cpu_count() or 1) // engine.local_size))
    precision = cfg.precision if cfg.precision != "auto" else ("fp16" if cuda else "fp32")
    memory_format = {"channels_last": torch.channels_last, "contiguous": torch.contiguous_format}.get(
        cfg.memory_format, torch.channels_last if cuda else torch.contiguous_format)
    log = print if rank == 0 else (lambda *a, **k: None)
    passes = cfg.backward_passes_per_step

    global_batch = cfg.batch_per_gpu * world
    peak = peak_lr(global_batch, cfg.lr_per_256)

    torch.manual_seed(cfg.seed)
    net = build_model(cfg.model, num_classes, zero_init_residual=cfg.zero_gamma)
    net = net.to(device, memory_format=memory_format)
    if cfg.compile:
        # torch.compile of the module itself, in place (its state_dict keys stay as they are, so checkpoints load
        # either way), before the engine wraps it: "torch.compile specifically doesn't handle distributed wrapper
        # modules like DDP or FSDP very well, so consider applying torch.compile to the inner module passed to
        # the wrapper" (https://docs.pytorch.org/docs/stable/compile/programming_model.where_to_apply_compile.html,
        # "Where to apply torch.compile?", the DistributedDataParallel example: model.compile(), then DDP(model)).
        net.compile()
    optimizer = torch.optim.SGD(param_groups(net, cfg.weight_decay, cfg.decay_bn_bias), lr=cfg.warmup_start,
                                momentum=cfg.momentum, nesterov=True)
    # fp16: dynamic loss scaling, or a static scale (update() pins it; a step with inf/nan is still skipped).
    static_scale = None if cfg.loss_scale == "dynamic" else float(cfg.loss_scale)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16",
                                  init_scale=static_scale or cfg.initial_loss_scale)

    # Distributed: wrap the model/optimizer so gradients are averaged across ranks during backward. Before the
    # checkpoint is loaded: Horovod's wrapper is a new optimizer over the same parameters, without their state.
    model, optimizer = engine.prepare(net, optimizer, fp16_allreduce=cfg.fp16_allreduce,
                                      backward_passes_per_step=passes)

    # Rank 0 decides, before a step is trained, whether the run can start: --output writable, --checkpoint-to
    # writable, the checkpoint to resume from whole and made for this model and data. Its verdict reaches every rank,
    # so all stop together (exit 2, rank 0 says it).
    start_epoch, done, problem = 0, 0, None
    if rank == 0:
        problem = output_problem(out)
    if cfg.checkpoint_to and rank == 0 and problem is None:
        try:
            durable.probe(cfg.checkpoint_to, cfg.aws_cli, cfg.aws_region)
        except durable.DurableError as e:
            problem = str(e)
    if cfg.resume and rank == 0 and problem is None:
        try:
            if cfg.checkpoint_to and (restored := durable.restore(out, cfg.checkpoint_to, cfg.aws_cli, cfg.aws_region)):
                log(f"--resume: {restored}", flush=True)
            if found := newest_checkpoint(out, cfg.model):
                start_epoch, done = restore(*found, net, optimizer, scaler, num_classes, steps)
                checkpoint.trim_metrics(out / "metrics.jsonl", start_epoch * steps + done)  # rows written again
                log(f"resuming from {found[0].name}: epoch {start_epoch}, step {found[1]['step'] + 1}", flush=True)
            else:
                log(f"--resume: no checkpoint in {out}; starting from scratch", flush=True)
        except (CheckpointError, durable.DurableError) as e:
            problem = str(e)
    # Distributed: every rank learns rank 0's verdict, then its parameters, optimizer state, loss scale and epoch.
    start_epoch, done, problem = engine.broadcast_object((start_epoch, done, problem), "resume.verdict")
    if problem:
        raise TrainError(problem, status=2)
    engine.broadcast_state(net, optimizer)
    if scaler.is_enabled():
        scaler.load_state_dict(engine.broadcast_object(scaler.state_dict(), "scaler.state"))

    metrics = tb = uploader = None
    if rank == 0:
        metrics = open(out / "metrics.jsonl", "a")  # noqa: SIM115 - closed at the end of the run
        tb = tensorboard_writer(cfg.tensorboard, out / "tensorboard")
        uploader = durable.Uploader(cfg.checkpoint_to, cfg.aws_cli, cfg.aws_region, log) if cfg.checkpoint_to else None
    # The write leaves the loop after a copy to host memory; S3 copies (background too) once the file is whole.
    writer = CheckpointWriter(out, uploader.submit if uploader else None) if rank == 0 else None

    def save_checkpoint(epoch: int, step: int) -> None:
        # Distributed: average BatchNorm running statistics, so the checkpoint (and validation) hold one model; at
        # the same steps with or without a resume, so a resumed run stays the uninterrupted one.
        average_buffers(net, engine)
        if writer is not None:
            last = (step + 1) % steps == 0
            writer.save(checkpoint.checkpoint_state(net, optimizer, scaler, asdict(cfg), epoch, step, steps),
                        out / checkpoint.checkpoint_name(epoch, None if last else step + 1))
    source = "synthetic data" if cfg.synthetic else f"{num_classes} classes"
    log(f"training {cfg.model} on {world} rank(s) ({engine.name}), {source}, {steps} steps/epoch, "
        f"global batch {global_batch}, peak lr {peak:.4g}, {precision}, {device.type}", flush=True)

    def record(**row) -> None:
        if rank == 0:
            metrics.write(json.dumps(row) + "\n")
            metrics.flush()
            if tb is not None:
                for key in ("lr", "loss", "images_per_sec", "top1", "top5", "loss_scale"):
                    if row.get(key) is not None:
                        tb.add_scalar(f"train/{key}" if key not in ("top1", "top5") else f"val/{key}",
                                      row[key], row["step"])

    def validation(epoch: int, step: int, lr: float, loss) -> tuple:
        top1, top5, count = validate(net, data, val_shards, cfg, device, memory_format, engine, num_classes)
        if top1 is not None:
            record(epoch=epoch, step=step, lr=lr, loss=loss, images_per_sec=None, top1=top1, top5=top5)
            log(f"validation after epoch {epoch}: top-1 {top1:.2%} top-5 {top5:.2%} on {count} images", flush=True)
        return top1, top5, count

    autocast_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    train_time, images_seen, skipped_total = 0.0, 0, 0
    steady_images, steady_time, first_window = 0, 0.0, True
    mean_loss, lr = None, cfg.warmup_start
    val = (None, None, 0)
    # Each rank's per-step phases, for the job's step to name a straggler (training/progress.py): no collective.
    progress = Progress(progress_path(out, rank) if world > 1 else None, device=device)
    stop, stopped_at = False, None
    for epoch in range(start_epoch, cfg.epochs):
        model.train()
        if cfg.synthetic:
            batches = gpudecode.synthetic_batches(cfg.batch_per_gpu, cfg.image_size, num_classes, device, cfg.seed,
                                                  rank)
        else:
            batches = gpudecode.batches(make_loader(
                data, rank_shards(train_shards, rank, world), cfg.image_size, cfg.batch_per_gpu, train=True,
                seed=cfg.seed, epoch=epoch, rank=rank, workers=cfg.workers, pin_memory=cuda, decode=cfg.decode,
                num_classes=num_classes), cfg.image_size, device)
        for _ in range(done):  # resumed mid-epoch: this epoch's order, less the batches the checkpoint holds
            next(batches)
        epoch_start = window_start = time.perf_counter()
        loss_sum, skipped = torch.zeros((), device=device), 0
        for i in range(done, steps):
            step = epoch * steps + i
            lr = lr_at(step, steps, cfg.epochs, peak, cfg.warmup_epochs, cfg.warmup_start, cfg.decay)
            for group in optimizer.param_groups:
                group["lr"] = lr
            t0 = time.perf_counter()
            try:
                images, labels = next(batches)
            except READ_ERRORS as e:
                raise rank_local(e) from None
            except StopIteration:  # the manifest promised more than the shards held (read_shard says which, mostly)
                raise TrainError(f"the shards ran out at step {i + 1} of {steps} of epoch {epoch}: they hold fewer "
                                 f"samples than the manifest says; convert the data again", everywhere=False) from None
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            progress.add("data", time.perf_counter() - t0)
            optimizer.zero_grad()
            try:
                # Micro-batches: gradients add up locally; the reduction runs once, after the last one.
                for k, (x, y) in enumerate(zip(images.chunk(passes), labels.chunk(passes), strict=True)):
                    with engine.accumulate(model) if k < passes - 1 else contextlib.nullcontext():
                        with progress.phase("forward"), torch.autocast(device.type, dtype=autocast_dtype,
                                                                       enabled=autocast_dtype is not None):
                            loss = F.cross_entropy(model(normalize(x, memory_format)), y,
                                                   label_smoothing=cfg.label_smoothing) / passes
                        with progress.phase("backward"):
                            scaler.scale(loss).backward()
                    loss_sum += loss.detach().float()
                # Distributed: the optimizer step sees gradients averaged over all ranks.
                with progress.phase("optimizer"):
                    skipped += engine.step(optimizer, scaler, static_scale)
                progress.step_done(step)
            except torch.OutOfMemoryError:
                raise TrainError(f"--batch-per-gpu {cfg.batch_per_gpu} of {cfg.image_size}px images does not fit "
                                 f"in GPU memory with {cfg.model} ({precision}); use a smaller batch or "
                                 f"--backward-passes-per-step", everywhere=False) from None
            n = min((i % cfg.log_every) + 1, i + 1 - done)  # steps in this window (fewer just after a resume)
            if (i % cfg.log_every) + 1 == cfg.log_every or i + 1 == steps:
                # Distributed: the logged loss is the mean over ranks; riding on it, whether rank 0 was asked to
                # stop (training/stopping.py: every rank stops after this step, with no collective of its own).
                mean_loss, stop = stopping.agreed(engine.allreduce(
                    stopping.with_flag(loss_sum.cpu() / n, rank == 0 and stopping.requested(out) is not None),
                    "mean", name="log.loss"))
                now = time.perf_counter()
                ips = n * global_batch / (now - window_start)
                if not first_window:
                    steady_images, steady_time = steady_images + n * global_batch, steady_time + now - window_start
                first_window = False
                row = dict(epoch=epoch, step=step + 1, lr=lr, loss=mean_loss, images_per_sec=ips)
                if scaler.is_enabled():
                    row.update(loss_scale=scaler.get_scale(), skipped_steps=skipped_total + skipped)
                record(**row)
                log(f"epoch {epoch} step {step + 1} lr {lr:.4g} loss {mean_loss:.4f} {ips:.0f} img/s", flush=True)
                window_start, loss_sum = now, torch.zeros((), device=device)
            if stop and i + 1 < steps:  # asked to stop: a checkpoint after this step, then out (every rank)
                save_checkpoint(epoch, step)
                stopped_at = (epoch, step + 1)
                break
            if checkpoint.mid_epoch_due(step, steps, cfg.checkpoint_every):
                save_checkpoint(epoch, step)
        if stopped_at:
            break
        del batches
        epoch_time = time.perf_counter() - epoch_start
        train_time += epoch_time
        images_seen += (steps - done) * global_batch
        skipped_total += skipped
        record(epoch=epoch, step=(epoch + 1) * steps, lr=lr, loss=mean_loss,
               images_per_sec=(steps - done) * global_batch / epoch_time, epoch_time_s=epoch_time)
        save_checkpoint(epoch, (epoch + 1) * steps - 1)
        done = 0
        if stop:  # asked to stop at an epoch's last step: its own checkpoint is the one
            stopped_at = (epoch, (epoch + 1) * steps)
            break
        if cfg.val_every and (epoch + 1) % cfg.val_every == 0 and epoch + 1 < cfg.epochs and not cfg.synthetic:
            val = validation(epoch, (epoch + 1) * steps, lr, mean_loss)

    if stopped_at:
        return _stopped(stopped_at, stopping.requested(out) if rank == 0 else None, writer, uploader, metrics, tb,
                        progress, engine, log)
    if not cfg.synthetic:
        val = validation(cfg.epochs - 1, cfg.epochs * steps, lr, mean_loss)
    top1, top5, val_count = val
    summary = {"model": cfg.model, "engine": engine.name, "classes": num_classes, "ranks": world,
               "epochs": cfg.epochs, "steps_per_epoch": steps, "global_batch": global_batch,
               "top1": top1, "top5": top5, "val_samples": val_count, "train_images": images_seen,
               "images_per_sec": images_seen / train_time if images_seen else 0.0,
               "steady_images_per_sec": steady_images / steady_time if steady_time else None,
               "time_s": train_time, "skipped_steps": skipped_total, "precision": precision,
               "device": torch.cuda.get_device_name(device) if cuda else "cpu", "synthetic": cfg.synthetic}
    progress.close()
    if cfg.dump_rank_params:
        torch.save({k: v.detach().cpu() for k, v in net.named_parameters()}, out / f"params-rank{rank}.pt")
    if rank == 0:
        writer.close()
        summary["checkpoint_stall_s"] = writer.stall_s
        if uploader:
            uploader.close()
            if line := uploader.summary():
                log(line, flush=True)
        metrics.close()
        if tb is not None:
            tb.close()
        tmp = out / ".summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2) + "\n")
        os.replace(tmp, out / "summary.json")
        top = "n/a" if top1 is None else f"{top1:.2%}"
        log(f"summary: {cfg.model} {world} ranks, {cfg.epochs} epochs, top-1 {top}, "
            f"{summary['images_per_sec']:.0f} img/s, {train_time:.1f} s", flush=True)
    engine.shutdown()
    return summary


def _stopped(at: tuple[int, int], why: str | None, writer, uploader, metrics, tb, progress, engine, log) -> dict:
    """The end of a run asked to stop (training/stopping.py): its checkpoint written whole, the record closed, no
    validation and no summary.json (the run has not finished); one line from rank 0."""
    progress.close()
    if writer is not None:
        writer.close()
        if uploader:
            uploader.close()
        metrics.close()
        if tb is not None:
            tb.close()
    epoch, step = at
    log(f"stopped after step {step} (epoch {epoch}): {why or 'asked to stop'}; its checkpoint is written, "
        f"--resume continues from it", flush=True)
    engine.shutdown()
    return {"stopped": True, "epoch": epoch, "step": step}


def average_buffers(net: torch.nn.Module, engine) -> None:
    # Distributed: each rank's BatchNorm running statistics, replaced by their mean over the ranks.
    for name, buf in net.named_buffers():
        if buf.is_floating_point():
            buf.copy_(engine.allreduce(buf, "mean", name=f"bn.{name}"))


@torch.no_grad()
def validate(net, data: Path, val_shards: list[dict], cfg: Config, device, memory_format, engine, num_classes: int):
    """Top-1 / top-5 over exactly the validation set: each rank its own shards, counts summed."""
    net.eval()
    mine = rank_shards(val_shards, engine.rank, engine.size)
    counts = torch.zeros(3, dtype=torch.float64)
    if mine:
        loader = make_loader(data, mine, cfg.image_size, cfg.batch_per_gpu, train=False, seed=cfg.seed,
                             epoch=0, rank=engine.rank, workers=cfg.workers, num_classes=num_classes)
        try:
            for images, labels in loader:
                logits = net(normalize(images.to(device), memory_format)).float()
                c1, c5 = accuracy_counts(logits, labels.to(device))
                counts += torch.tensor([c1, c5, len(labels)], dtype=torch.float64)
        except READ_ERRORS as e:
            raise rank_local(e) from None
    # Distributed: sum the hit counts and sample counts of all ranks.
    counts = engine.allreduce(counts, "sum", name="val.counts")
    total = int(counts[2])
    if total == 0:
        return None, None, 0
    return float(counts[0]) / total, float(counts[1]) / total, total


_interrupted = False


def _on_sigint(signum, frame) -> None:
    """Python's own SIGINT handler (KeyboardInterrupt), remembering that it came: a loader worker that the same
    Ctrl-C stopped may surface first, as the DataLoader's "worker exited unexpectedly"."""
    global _interrupted
    _interrupted = True
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """0 after a finished run. Every other way out goes through distributed.leave: one line, the status, and no
    interpreter exit while a process group is live (training/distributed.py says why)."""
    cfg = parse_args(argv)
    if problem := paths_problem(cfg):  # every rank sees the same shared storage: all stop, rank 0 says it
        distributed.leave(2, f"error: {problem}" if launch_rank() == 0 else "")
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not where a launcher made it ignored
        signal.signal(signal.SIGINT, _on_sigint)
    try:
        train(cfg)
    except BaseException as e:  # noqa: BLE001 - each kind ends below, with its line and status
        finish_writes()  # a checkpoint write in flight ends whole before os._exit stops its thread
        if _interrupted or isinstance(e, KeyboardInterrupt):
            # Ctrl-C reaches every rank (the terminal's process group, or mpirun/torchrun passing it on): rank 0
            # says it once; 130 is how a shell reports SIGINT (128 + 2). save_atomic left no half checkpoint, and
            # a metrics line is written whole, flushed, before the next begins.
            distributed.leave(130, "error: interrupted" if launch_rank() == 0 else "")
        if isinstance(e, (TrainError, DataError, gpudecode.GpuDecodeError)):
            # A verdict every rank reached (same manifest, same options) is said once, by rank 0; a rank's own, by
            # it. No orderly shutdown: mpirun sees a rank leave and stops the others instead of letting them wait.
            everywhere = getattr(e, "everywhere", True)
            where = "" if everywhere else f"rank {launch_rank()}: "
            distributed.leave(getattr(e, "status", 1),
                              f"error: {where}{e}" if launch_rank() == 0 or not everywhere else "")
        if isinstance(e, SystemExit):
            distributed.leave(e.code if isinstance(e.code, int) else 1, "" if e.code is None or isinstance(
                e.code, int) else str(e.code))
        traceback.print_exc()  # a bug: its traceback, then out as cleanly as the rest
        distributed.leave(1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
