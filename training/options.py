"""The trainer's options: what each means (the comment beside its field, which is also its --help), and every rule
about them, checked on every rank before the engine starts (rank 0 says the first broken one; all exit 2).

`parse_args` decides from the options alone (pure: the launcher's plan parses its own trainer line with it);
`paths_problem` looks at --data and --output as this rank sees them, without writing anything.
"""

from __future__ import annotations

import argparse
import inspect
import math
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from training import durable
from training import engine as engines
from training.loader import DECODERS
from training.model import ARCHITECTURES
from training.schedule import default_warmup_epochs, epochs_problem, warmup_problem

DESCRIPTION = "Data-parallel ResNet training with Horovod (or DDP): the seed-000 recipe, one readable loop."


@dataclass
class Config:
    data: str                       # directory with manifest.json and the shards (not needed with --synthetic)
    output: str                     # run directory: metrics.jsonl, checkpoints, summary.json
    model: str = "resnet50"         # architecture (ResNet v1.5)
    image_size: int = 224           # px, square crops
    epochs: int = 90                # passes over the training set
    batch_per_gpu: int = 256        # images per rank per optimizer step (split over --backward-passes-per-step)
    backward_passes_per_step: int = 1  # micro-batches per step; gradients are reduced once per step
    lr_per_256: float = 0.1         # LR per 256 images, scaled linearly with the global batch
    warmup_epochs: float | None = None  # linear warmup to the peak, in epochs; unset: 10 per 90 --epochs (seed 000)
    warmup_start: float = 0.001     # LR at step 0
    decay: str = "poly"             # poly (power 2, seed 000) or cosine
    momentum: float = 0.9           # Nesterov
    weight_decay: float = 1e-4      # L2 penalty in SGD
    decay_bn_bias: bool = True      # False: no weight decay on BatchNorm parameters and biases
    label_smoothing: float = 0.0    # 0 = plain cross-entropy (seed 000); 0.1 is common
    zero_gamma: bool = True         # last BN gamma of each residual block starts at 0
    precision: str = "auto"         # auto (fp16 on GPU, fp32 on CPU), fp32, bf16, fp16
    memory_format: str = "auto"     # auto (channels_last on GPU, contiguous on CPU), channels_last, contiguous
    compile: bool = False           # torch.compile the model in place, before the engine wraps it (first steps compile)
    loss_scale: str = "dynamic"     # dynamic, or a number (seed 000: 1024) for a static scale
    initial_loss_scale: float = 65536.0  # where dynamic scaling starts (halved on inf, doubled every 2000 steps)
    engine: str = "horovod"         # horovod, ddp (torch.distributed: NCCL on GPU, gloo on CPU), or reducer
    reducers: int = 0               # with --engine reducer: reducer processes started beside the workers (MPMD)
    fp16_allreduce: bool = False    # fp16 gradient compression on the wire
    val_every: int = 0              # validate every k epochs; 0 = once, at the end
    workers: int = 2                # data loader processes per rank
    decode: str = "cpu"             # where training JPEGs are decoded: cpu (loader processes) or gpu (nvJPEG)
    threads: int = 0                # torch CPU threads per rank; 0 = OMP_NUM_THREADS or all cores / ranks
    log_every: int = 10             # steps
    seed: int = 0
    resume: bool = False
    checkpoint_every: int = 0       # steps between checkpoints inside an epoch (rank 0); 0 = only at each epoch's end
    synthetic: bool = False         # random uint8 batches made on the device: pure compute throughput
    steps_per_epoch: int = 0        # 0 = as many as the data allows (100 with --synthetic)
    num_classes: int = 1000         # with --synthetic only; otherwise the manifest's class list decides
    tensorboard: bool = True        # write TensorBoard events when tensorboard is installed
    dump_rank_params: bool = False  # each rank saves its final parameters (consistency checks)
    checkpoint_to: str = ""         # s3://BUCKET/PREFIX: rank 0 copies each checkpoint there; --resume restores
    aws_region: str = ""            # with --checkpoint-to: the bucket's region (the nodes have no AWS configuration)
    aws_cli: str = ""               # with --checkpoint-to: the AWS CLI's absolute path (the image's /usr/local/bin/aws)


CHOICES = {"model": sorted(ARCHITECTURES), "decay": ["poly", "cosine"],
           "precision": ["auto", "fp32", "bf16", "fp16"], "memory_format": ["auto", "channels_last", "contiguous"],
           "engine": list(engines.ENGINES), "decode": list(DECODERS)}


def _field_help() -> dict[str, str]:
    """Each option's help is the comment beside its field in Config: one place says what an option means."""
    return dict(re.findall(r"^\s+(\w+):[^#\n]*#\s*(.+)$", inspect.getsource(Config), flags=re.M))


def launch_rank() -> int:
    """This process's rank as mpirun or torchrun set it, before any process group exists."""
    return int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("RANK", "0")) or 0)


def launch_world() -> int:
    """How many ranks mpirun or torchrun started, before any process group exists."""
    return int(os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")) or 1)


class RankParser(argparse.ArgumentParser):
    """An option parser for a program every rank runs with the same options (the trainer, examples/bert): a bad
    option is one line, said once (by rank 0), then every rank exits 2."""

    def error(self, message: str):
        if launch_rank() == 0:
            print(f"error: {message}", file=sys.stderr, flush=True)
        sys.exit(2)


def parse_args(argv: list[str] | None = None) -> Config:
    p = RankParser(prog="python -m training.train", description=DESCRIPTION,
                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    helps = _field_help()
    for name, default in asdict(Config(data="", output="")).items():
        flag, kw = "--" + name.replace("_", "-"), {"help": helps.get(name, " ")}
        if name == "output":
            p.add_argument(flag, required=True, **kw)
        elif isinstance(default, bool):
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, **kw)
        elif name in CHOICES:
            p.add_argument(flag, default=default, choices=CHOICES[name], **kw)
        else:
            p.add_argument(flag, type=float if default is None else type(default), default=default, **kw)
    cfg = Config(**vars(p.parse_args(argv)))
    if not cfg.output.strip():  # '' was the current directory: the run landed wherever the rank was started
        p.error(f"--output needs a run directory, got {cfg.output!r}")
    if problem := number_problem(cfg):
        p.error(problem)
    for name in ("epochs", "batch_per_gpu", "image_size", "log_every", "backward_passes_per_step", "num_classes",
                 "initial_loss_scale"):
        if not getattr(cfg, name) >= 1:  # NaN too
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(cfg, name)}")
    for name in ("steps_per_epoch", "val_every", "threads", "workers", "checkpoint_every"):
        if getattr(cfg, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(cfg, name)}")
    if problem := epochs_problem(cfg.epochs):  # the ceiling `launch plan` and `launch cost` keep too
        p.error(problem)
    cfg.warmup_epochs = default_warmup_epochs(cfg.epochs) if cfg.warmup_epochs is None else cfg.warmup_epochs
    if cfg.batch_per_gpu % cfg.backward_passes_per_step:
        p.error(f"--batch-per-gpu {cfg.batch_per_gpu} must be a multiple of --backward-passes-per-step "
                f"{cfg.backward_passes_per_step}")
    if (cfg.engine == "reducer") != (cfg.reducers > 0):
        p.error(f"--engine reducer needs --reducers K >= 1 (and only it takes them); got --engine {cfg.engine} "
                f"--reducers {cfg.reducers}")
    if problem := warmup_problem(cfg.warmup_epochs, cfg.epochs) or durable.check_options(
            cfg.checkpoint_to, cfg.aws_region, cfg.aws_cli):
        p.error(problem)
    if not cfg.data and not cfg.synthetic:
        p.error("--data is required (a directory made by `launch data convert`), unless --synthetic")
    if cfg.synthetic and cfg.decode != "cpu":
        p.error(f"--decode {cfg.decode} decodes shards; --synthetic reads none (leave --decode out)")
    if cfg.loss_scale != "dynamic":
        try:
            scale = float(cfg.loss_scale)
        except ValueError:
            scale = 0.0
        # GradScaler multiplies the loss by the scale and divides the gradients by it: inf makes every gradient
        # inf * 0 = NaN and skips every step ("Gradient Scaling", https://docs.pytorch.org/docs/stable/amp.html).
        if not (scale > 0 and math.isfinite(scale)):
            p.error(f"--loss-scale must be 'dynamic' or a positive, finite number, got '{cfg.loss_scale}'")
    return cfg


def number_problem(cfg: Config) -> str | None:
    """The first real-valued hyperparameter out of its range, as the user types it; None when all are in range.

    NaN passes no comparison, so every rule is written as what the value must be (`not lo <= x < hi` is true of
    NaN). The ranges are torch's own where it has one, narrowed where its edge trains nothing:
    - --lr-per-256 > 0, finite: SGD refuses lr < 0 ("Invalid learning rate"), and 0 never moves a weight
      (https://docs.pytorch.org/docs/stable/generated/torch.optim.SGD.html);
    - --momentum in (0, 1): SGD refuses momentum < 0, and with nesterov=True also 0 ("Nesterov momentum requires a
      momentum and zero dampening", same page); 1 or more lets the velocity grow without bound;
    - --weight-decay >= 0, finite: SGD refuses < 0 ("Invalid weight_decay value", same page);
    - --warmup-start >= 0, finite: the learning rate at step 0 (training/schedule.py), an LR as above;
    - --label-smoothing in [0, 1): CrossEntropyLoss takes "A float in [0.0, 1.0]"
      (https://docs.pytorch.org/docs/stable/generated/torch.nn.CrossEntropyLoss.html); 1 makes every target
      uniform, whatever the label, so nothing is learned;
    - --initial-loss-scale >= 1, finite: GradScaler's init_scale (https://docs.pytorch.org/docs/stable/amp.html).
    """
    finite = {name: getattr(cfg, name) for name in ("lr_per_256", "momentum", "weight_decay", "warmup_start",
                                                     "label_smoothing", "initial_loss_scale")}
    for name, value in finite.items():
        if not math.isfinite(value):
            return f"--{name.replace('_', '-')} must be a finite number, got {value:g}"
    if not cfg.lr_per_256 > 0:
        return f"--lr-per-256 must be > 0, got {cfg.lr_per_256:g}"
    if not 0 < cfg.momentum < 1:
        return f"--momentum must be between 0 and 1 (both excluded; Nesterov needs one above 0), got {cfg.momentum:g}"
    if not cfg.weight_decay >= 0:
        return f"--weight-decay must be >= 0, got {cfg.weight_decay:g}"
    if not cfg.warmup_start >= 0:
        return f"--warmup-start must be >= 0, got {cfg.warmup_start:g}"
    if not 0 <= cfg.label_smoothing < 1:
        return f"--label-smoothing must be from 0 up to (not including) 1, got {cfg.label_smoothing:g}"
    return None


def paths_problem(cfg: Config) -> str | None:
    """What is wrong with --data and --output as this rank sees them (they are on the shared storage, so every rank
    sees the same), without writing anything; None when nothing is. Rank 0 proves --output writable later, by
    writing (training.checkpoint.output_problem): a permission check alone is always yes for root."""
    out = Path(cfg.output)
    if out.exists() and not out.is_dir():
        return f"--output {cfg.output} is a file, not a directory; name a run directory"
    blocking = next((p for p in out.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        return f"--output {cfg.output}: {blocking} is a file, not a directory"
    if not cfg.synthetic:
        data = Path(cfg.data)
        if data.exists() and not data.is_dir():
            return f"--data {cfg.data} is a file; name the directory that holds manifest.json and the shards"
    return None


