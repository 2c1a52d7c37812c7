"""`launch data sample|convert`: sample data in the ILSVRC2012 layout, and ImageNet to shards (here, or on every
node of a cluster), with a progress display."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from launcher import cluster as clusters
from launcher.cli.common import console, err, plural, usage_error
from launcher.errors import LaunchError

app = typer.Typer(no_args_is_help=True, help="Sample data in the ILSVRC2012 layout; conversion to shards.")


class _Tick:
    """The per-image tick of a progress display: a rich bar with images/s and ETA on a terminal, else a plain
    line every LINE_EVERY_S seconds (a node's output relayed by `--cluster` is not a terminal)."""

    LINE_EVERY_S = 30.0

    def __init__(self, bar: Progress, what: str, total: int):
        self.bar, self.what = bar, what
        self.task = bar.add_task(what, total=max(total, 0), rate="")
        self.restart(total)

    def restart(self, total: int) -> None:
        """Count `total` images from now (the clock too: images/s and ETA are for the work left)."""
        self.total, self.done, self.start = max(total, 0), 0, time.perf_counter()
        self.last_line = self.start
        self.bar.reset(self.task, total=self.total, rate="")

    def __call__(self) -> None:
        self.done += 1
        now = time.perf_counter()
        rate = self.done / max(now - self.start, 1e-9)
        if not self.bar.disable:
            self.bar.update(self.task, advance=1, rate=f"{rate:.0f}")
        elif now - self.last_line >= self.LINE_EVERY_S:
            self.last_line = now
            eta = time.strftime("%H:%M:%S", time.gmtime(max(self.total - self.done, 0) / max(rate, 1e-9)))
            err.print(f"{self.what}: {self.done:,}/{self.total:,} images, {rate:.0f} img/s, ETA {eta}",
                      markup=False, highlight=False)


@contextlib.contextmanager
def _progress(what: str, total: int) -> Iterator[_Tick]:
    """A progress display (see _Tick); yields the per-image tick."""
    bar = Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[rate]:>8} img/s"),
                   TimeRemainingColumn(), console=err, disable=not err.is_terminal)
    with bar:
        yield _Tick(bar, what, total)


def out_dir(out: str) -> Path:
    """--out as a directory; an empty string would be the current directory, which nobody means."""
    if not out.strip():
        raise usage_error("--out is empty: name the directory to write")
    return Path(out)


@app.command("sample")
def data_sample(out: str = typer.Option(..., "--out", help="Directory to create (ILSVRC2012 layout): new, empty, "
                                                           "or an earlier sample, which this one replaces."),
                classes: int = typer.Option(10, "--classes", help="Number of classes (2..1000)."),
                per_class: int = typer.Option(100, "--per-class", help="Training images per class (1..10000)."),
                val_per_class: int = typer.Option(None, "--val-per-class",
                                                  help="Validation images per class (0..10000); default: a fifth "
                                                       "of --per-class, at least 2."),
                seed: int = typer.Option(0, "--seed", help="Same seed, same bytes.")):
    """Write a synthetic data set in the real ILSVRC2012 layout, learnable by a small network."""
    from training.sample import OptionError, default_val_per_class, make_sample

    where = out_dir(out)
    val = val_per_class if val_per_class is not None else default_val_per_class(per_class)
    with _progress("sample", classes * (per_class + val)) as tick:
        try:
            summary = make_sample(where, classes=classes, per_class=per_class, val_per_class=val_per_class,
                                  seed=seed, on_image=tick)
        except OptionError as e:
            raise usage_error(str(e)) from None
        except ValueError as e:
            raise LaunchError(str(e)) from None
    console.print(f"wrote {summary['train']} training and {summary['val']} validation images "
                  f"in {plural(classes, 'class', 'classes')} to {where}")


@app.command("convert")
def data_convert(src_arg: str = typer.Argument(None, metavar="SRC", help="ImageNet as you have it (see above)."),
                 out: str = typer.Option(..., "--out", help="Directory for the shards and manifest.json (not in "
                                                            "SRC's train/ or val/)."),
                 shard_size: int = typer.Option(1000, "--shard-size", help="Samples per shard."),
                 resize: int = typer.Option(None, "--resize", metavar="PX",
                                            help="Shrink images whose shorter side is over PX to PX (e.g. 256-480) "
                                                 "and re-encode them; default: keep every image as it is."),
                 quality: int = typer.Option(95, "--quality", metavar="Q", help="JPEG quality of re-encoded images."),
                 seed: int = typer.Option(0, "--seed", help="Shuffle seed (0 or more)."),
                 workers: int = typer.Option(None, "--workers", metavar="W",
                                             help="Processes; default: one per core (with --cluster: the node's)."),
                 node_index: int = typer.Option(0, "--node-index", metavar="I",
                                                help="This machine is node I of --node-count N: it writes shards "
                                                     "I, I+N, ... and manifest.node-I-of-N.json; when every node "
                                                     "is done, one runs --merge."),
                 node_count: int = typer.Option(1, "--node-count", metavar="N", help="Machines sharing the work."),
                 replace: bool = typer.Option(False, "--replace", help="--out may hold another conversion (another "
                                                                       "SRC or other options): delete it and "
                                                                       "write this one; without it, refused."),
                 merge: bool = typer.Option(False, "--merge", help="Only merge the node manifests of an N-node "
                                                                   "conversion (--node-count N) into manifest.json."),
                 cluster: str = typer.Option(None, "--cluster", help="Convert on every node of this cluster, then "
                                                                     "merge; SRC and --out as the nodes see them "
                                                                     "(shared storage).")):
    """Convert ImageNet into WebDataset shards with a manifest; resumable, parallel over cores and nodes.

    SRC is ImageNet as you have it: train/<wnid>/ and val/ folders (val as class folders, or flat files beside
    LOC_val_solution.csv or the devkit), and/or the official ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar,
    read without extracting. Run again after an interruption: finished shards are verified and kept.
    """
    from training.convert import ArgumentError, convert, merge_manifests
    from training.shards import OptionError, check_options

    def summary(manifest: dict, where: str) -> None:
        splits = ", ".join(f"{k}: {plural(v['samples'], 'sample')} in {plural(v['shards'], 'shard')}"
                           for k, v in manifest["splits"].items())
        rejected = plural(len(manifest["rejected"]), "input")
        console.print(f"wrote {where} ({splits or 'no shards'}); {rejected} rejected")
        shown = 20
        for r in manifest["rejected"][:shown]:
            err.print(f"  rejected {r['path']}: {r['reason']}", markup=False, highlight=False)
        if len(manifest["rejected"]) > shown:
            err.print(f"  ... and {len(manifest['rejected']) - shown} more, listed in {where}", markup=False,
                      highlight=False)
        missing = manifest.get("classes_without_train_images") or []
        if missing:  # a class named only by the validation labels, or whose every image was rejected
            listed = ", ".join(missing[:5]) + (", ..." if len(missing) > 5 else "")
            err.print(f"warning: {plural(len(missing), 'class', 'classes')} of {len(manifest['classes'])} "
                      f"{'has' if len(missing) == 1 else 'have'} no training image: {listed} "
                      f"(classes_without_train_images in {where})", markup=False, highlight=False)

    out = out_dir(out)
    # A str, not typer's Path: Path('') is '.', so an empty SRC would quietly convert the current directory.
    if src_arg is not None and not src_arg.strip():
        raise usage_error("SRC is empty: name the directory that holds ImageNet (train/ and val/, or its tars)")
    src = Path(src_arg) if src_arg is not None else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    try:
        # Checked here too with --cluster, so that a bad option is one line, not one per node.
        check_options(shard_size, resize, quality, workers if workers is not None else cores, node_index,
                      node_count, seed)
    except OptionError as e:
        raise usage_error(str(e)) from None
    try:
        if merge:
            extra = [name for name, given in ((f"SRC {src}", src is not None), (f"--cluster {cluster}",
                                                                                  cluster is not None)) if given]
            extra += ["--replace"] if replace else []
            if extra:  # the nodes' manifests are merged in --out; nothing is read from SRC or a cluster
                raise usage_error(f"--merge takes only --out and --node-count; leave out {' and '.join(extra)}")
            summary(merge_manifests(out, node_count), f"{out}/manifest.json")
            return
        if src is None:
            raise usage_error("missing argument SRC")
        if cluster is not None:
            from launcher.execute.dataprep import convert_on_cluster
            from launcher.plans.dataprep import ConvertSpec

            if (node_index, node_count) != (0, 1):
                raise usage_error("--cluster chooses the nodes itself; leave out --node-index and --node-count")
            # Paths on the nodes: resolving them here would name this machine's directory or home, not theirs.
            for name, path in (("SRC", src), ("--out", out)):
                if not path.is_absolute():
                    raise usage_error(f"{name} {path} must be an absolute path as the nodes see it with --cluster, "
                                      f"e.g. /fsx/imagenet")
            spec = ConvertSpec(src=str(src), out=str(out),
                               shard_size=shard_size, seed=seed, resize=resize, quality=quality,
                               workers=workers, replace=replace)
            summary(convert_on_cluster(clusters.load(cluster), spec), f"{spec.out}/manifest.json")
            return

        def started(inputs: int, kept: int) -> None:
            if kept:
                err.print(f"resuming: {plural(kept, 'finished shard')} verified and kept", markup=False,
                          highlight=False)
            tick.restart(inputs)

        if err.is_terminal:
            err.print(f"listing {src} ...", markup=False, highlight=False)  # 1.28M files take a while
        with _progress("convert", 0) as tick:
            manifest = convert(src, out, shard_size=shard_size, seed=seed, resize=resize, quality=quality,
                               workers=workers if workers is not None else cores, node_index=node_index,
                               node_count=node_count, replace=replace, on_start=started, on_sample=tick)
    except ArgumentError as e:  # SRC or --out: a bad argument, exit 2 as for a bad option
        raise usage_error(str(e)) from None
    except ValueError as e:
        raise LaunchError(str(e)) from None
    where = "manifest.json" if node_count == 1 else f"manifest.node-{node_index}-of-{node_count}.json"
    summary(manifest, f"{out}/{where}")
