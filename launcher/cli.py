"""The `launch` command line. Each command parses, calls the core, and prints; errors are one line."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from launcher import cluster as clusters
from launcher.cluster import local
from launcher.errors import LaunchError
from launcher.execute import remote, run
from launcher.plans import job

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="scaletrain: provision a GPU cluster, shard ImageNet, train ResNet-50 with Horovod over "
                       "MPI, and report what it cost. The same commands drive a local cluster of SSH nodes.")
local_app = typer.Typer(no_args_is_help=True, help="A local cluster of real sshd nodes on 127.0.0.1.")
data_app = typer.Typer(no_args_is_help=True, help="Sample data in the ILSVRC2012 layout; conversion to shards.")
app.add_typer(local_app, name="local")
app.add_typer(data_app, name="data")
# rich sizes tables to a terminal; when stdout is piped or logged it takes 80 columns (or the width of a terminal on
# stdin) and squeezes a wide table into unreadable `i…` columns. A log has no width: it gets one no table of ours
# reaches, so every table is printed at its natural width. An explicit COLUMNS still wins.
LOG_WIDTH = 1000


def _width(stream) -> int | None:
    """None (rich measures the terminal) on a terminal or with COLUMNS set; LOG_WIDTH for a pipe or a file."""
    try:
        terminal = stream.isatty()
    except (AttributeError, ValueError):
        terminal = False
    return None if terminal or os.environ.get("COLUMNS", "").isdigit() else LOG_WIDTH


console = Console(soft_wrap=True, width=_width(sys.stdout))
err = Console(stderr=True, soft_wrap=True, width=_width(sys.stderr))

ClusterOpt = typer.Option(None, "--cluster", help="Cluster name; defaults to the only cluster there is.")

RegionOpt = typer.Option(None, "--region", help="AWS region; default: the AWS environment's (AWS_REGION, profile).")
ProfileOpt = typer.Option(None, "--profile", help="AWS profile; default: the AWS environment's.")
DEFAULT_STACK = "scaletrain"  # infra's default cluster_name


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


@local_app.command("up")
def local_up(nodes: int = typer.Option(2, "--nodes", help="Worker nodes."),
             reducers: int = typer.Option(0, "--reducers", help="Reducer nodes (CPU-only role)."),
             base_port: int = typer.Option(None, "--base-port", help="First port; default: free ports.")):
    """Start one sshd per node on 127.0.0.1 and write the cluster's keys, ssh_config and known_hosts."""
    c = local.up(nodes, reducers, base_port)
    console.print(f"cluster '{c.name}' is up: {len(c.workers)} worker(s), {len(c.reducers)} reducer(s)")
    for n in c.nodes:
        console.print(f"  {n.name:<10} {n.role:<8} {n.address}:{n.port}  pid {c.processes[n.name]}  {n.workdir}")
    console.print(f"ssh_config: {c.ssh_config}   (try: ssh -F {c.ssh_config} {c.nodes[0].name})")


@local_app.command("down")
def local_down(cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Stop the local cluster's sshd processes and remove its state."""
    c = clusters.load(cluster)
    if c.backend != "local":
        raise LaunchError(f"cluster '{c.name}' is an AWS cluster; bring it down with `launch down`")
    stopped = local.down(c)
    console.print(f"cluster '{c.name}' is down ({stopped} sshd process(es) stopped)")


@local_app.command("replace")
def local_replace(nodes: list[str] = typer.Argument(None, metavar="[NODE]...",
                                                     help="Nodes to replace; default: every node whose sshd died."),
                  cluster: str = typer.Option(local.LOCAL, "--cluster", help="Local cluster name.")):
    """Start dead nodes afresh (new port, new host key), as an Auto Scaling group replaces an instance."""
    c = clusters.load(cluster)
    if c.backend != "local":
        raise LaunchError(f"cluster '{c.name}' is an AWS cluster; its Auto Scaling groups replace instances and "
                          f"the next `launch train` discovers them")
    c, replaced = local.replace(c, nodes or [])
    if not replaced:
        console.print(f"nothing to replace: every node of cluster '{c.name}' is running")
    for r in replaced:
        console.print(f"{r.node} replaced: 127.0.0.1:{r.port} (was {r.old_port}), pid {r.pid}, "
                      f"host key {r.fingerprint} pinned, the old one removed")


@app.command("exec", context_settings={"allow_interspersed_args": False})
def exec_(command: list[str] = typer.Argument(..., help="The command (after --), run by each node's shell."),
          cluster: str = ClusterOpt):
    """Run one command on every node in parallel; output is prefixed by node."""
    c = clusters.load(cluster)
    results = remote.run_all(c, c.nodes, " ".join(command))
    for r in results:
        for line in r.stdout.splitlines():
            console.print(f"[{r.node}] {line}", markup=False, highlight=False)
        for line in r.stderr.splitlines():
            err.print(f"[{r.node}] {line}", markup=False, highlight=False)
        if r.error:
            err.print(f"[{r.node}] {r.error}", markup=False, highlight=False)
    failed = [r for r in results if not r.ok]
    if failed:
        detail = ", ".join(f"{r.node} ({'exit ' + str(r.exit_code) if r.exit_code >= 0 else r.error})"
                           for r in failed)
        raise LaunchError(f"failed on {len(failed)} of {len(results)} node(s): {detail}")


@app.command("doctor")
def doctor_cmd(cluster: str = ClusterOpt,
               storage: str = typer.Option("auto", "--storage", help="Shared storage to expect on AWS nodes: "
                                                                     "auto (Lustre or BeeGFS), fsx, beegfs, none.")):
    """Prove every node is ready: GPUs, driver, EFA, NCCL, Horovod, storage, clocks, then a test across nodes."""
    from launcher.doctor import checks as doctor
    from launcher.doctor import runner as doctor_run

    c = clusters.load(cluster)
    checks = doctor_run.diagnose(c, storage=storage)
    table = Table(title=f"launch doctor: cluster '{c.name}' ({c.backend})")
    for col in ("node", "check", "status", "detail"):
        table.add_column(col, no_wrap=col != "detail")
    style = {"ok": "green", "fail": "bold red", "skip": "yellow"}
    for chk in checks:
        table.add_row(chk.node, chk.name, f"[{style[chk.status]}]{chk.status}[/]", chk.detail.replace("[", r"\["))
    console.print(table)
    skipped = sum(1 for chk in checks if chk.status == "skip")
    console.print(f"{sum(1 for chk in checks if chk.status == 'ok')} ok, {skipped} skipped "
                  f"(not applicable on this cluster, reasons above), {sum(1 for chk in checks if chk.failed)} failed")
    problem = doctor.verdict(checks)
    if problem:
        raise LaunchError(problem)


@app.command("status")
def status(cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt,
           extend_ttl: float = typer.Option(None, "--extend-ttl", metavar="HOURS",
                                            help="AWS: move the stack's self-deletion this many hours later.")):
    """Nodes of a cluster and whether each answers over SSH; on AWS also uptime, cost so far and TTL left."""
    c, stack = _target(cluster)
    if stack is not None:
        _status_aws(c, stack, region, profile, extend_ttl)
        return
    if extend_ttl is not None:
        raise LaunchError("--extend-ttl applies to AWS clusters; a local cluster has no TTL")
    assert c is not None
    answers = {r.node: r for r in remote.run_all(c, c.nodes, "uptime -p 2>/dev/null || uptime")}
    table = Table(title=f"cluster '{c.name}' ({c.backend})")
    for col in ("node", "role", "address", "slots", "state", "uptime"):
        table.add_column(col)
    for n in c.nodes:
        r = answers[n.name]
        table.add_row(n.name, n.role, n.address, str(n.slots), "ready" if r.ok else f"unreachable: {r.error}",
                      r.stdout.strip() if r.ok else "")
    console.print(table)
    if not all(r.ok for r in answers.values()):
        raise typer.Exit(1)


def _aws_cluster(c: clusters.Cluster | None, stack: str, region: str | None, profile: str | None):
    """(session, the cluster as last discovered: rediscovered when this launcher has not seen it yet)."""
    from launcher.cluster.aws import api as aws

    sess = aws.session(region or (c.aws.region if c and c.aws else None),
                       profile or (c.aws.profile if c and c.aws else None))
    return sess, c if c is not None else aws.discover_cluster(sess, stack, profile=profile)


def _status_aws(c: clusters.Cluster | None, stack: str, region: str | None, profile: str | None,
                extend_ttl: float | None) -> None:
    import datetime as dt

    from launcher.cluster.aws import api as aws
    from launcher.cluster.aws import lifecycle

    sess, c = _aws_cluster(c, stack, region, profile)
    assert c.aws is not None
    if extend_ttl is not None:
        start = aws.extend_ttl(sess, c, extend_ttl)
        console.print(f"TTL extended: the stack deletes itself from {start:%Y-%m-%d %H:%M:%S} UTC")
        c = clusters.load(c.name)
    now = dt.datetime.now(dt.timezone.utc)
    rows = aws.status(sess, c, now)
    newcomers = lifecycle.undiscovered({n.instance_id for n in c.nodes if n.instance_id},
                                       [(i.instance_id, i.role, i.state) for i in aws.cluster_instances(sess, c.name)])
    table = Table(title=f"cluster '{c.name}' (aws, {c.aws.region}, {c.instance_type})")
    for col in ("node", "role", "instance", "address", "state", "uptime", "cost so far (USD)"):
        # Ids and addresses are what people copy: folded onto a second line in a narrow terminal, never cut.
        table.add_column(col, justify="right" if col.startswith("cost") else "left", overflow="fold",
                         min_width=19 if col == "instance" else None)
    for n, r in zip(c.nodes, rows, strict=True):
        table.add_row(n.name, n.role, n.instance_id or "", n.address, r.state, lifecycle.format_duration(r.uptime_s),
                      f"{r.cost_usd:,.2f}")
    console.print(table)
    left = lifecycle.ttl_left(c.aws.ttl_expires_at, now)
    ttl = "no TTL" if left is None else (f"{lifecycle.format_duration(left)} left (deletes itself from "
                                         f"{c.aws.ttl_expires_at})" if left > 0 else
                                         f"expired at {c.aws.ttl_expires_at}: deletion under way")
    console.print(f"cost so far: ${lifecycle.cost_so_far(rows):,.2f} (on-demand prices); TTL: {ttl}")
    if newcomers:
        console.print(newcomers, markup=False, highlight=False)
    if any(r.state != "running" for r in rows):
        raise typer.Exit(1)


@app.command("down")
def down(cluster: str = ClusterOpt, region: str = RegionOpt, profile: str = ProfileOpt):
    """Delete an AWS cluster's stack, wait until it is gone, and verify no instance with its tag remains."""
    from launcher.cluster.aws import api as aws

    c, stack = _target(cluster)
    if stack is None:
        raise LaunchError(f"cluster '{c.name if c else cluster}' is local; bring it down with `launch local down`")
    sess = aws.session(region or (c.aws.region if c and c.aws else None),
                       profile or (c.aws.profile if c and c.aws else None))
    aws.teardown(sess, stack, say=lambda line: console.print(line, markup=False, highlight=False))
    if c is not None:
        import shutil

        shutil.rmtree(clusters.cluster_dir(c.name), ignore_errors=True)


@app.command("preflight")
def preflight_cmd(context: list[str] = typer.Option(None, "--context", "-c", metavar="KEY=VALUE",
                                                    help="A context key of `npx cdk deploy`, as you will pass it "
                                                         "there (cdk.json's context is read first)."),
                  region: str = typer.Option(None, "--region", help="Same as -c region=REGION (the stack's region; "
                                                                    "default: cdk.json's)."),
                  profile: str = ProfileOpt):
    """Before `npx cdk deploy`: ask AWS (read-only) what would stop the stack's nodes: instance types offered in
    the AZ, vCPU quotas, the capacity reservation, the image. Each failure is one line naming the fix."""
    import json

    from launcher.cluster.aws import api as aws
    from launcher.execute import preflight as preflight_shell
    from launcher.plans import preflight

    pairs = list(context or [])
    cdk_json = next((p for p in (Path("cdk.json"), Path(__file__).resolve().parent.parent / "cdk.json")
                     if p.is_file()), None)
    try:
        defaults = json.loads(cdk_json.read_text()).get("context", {}) if cdk_json else {}
        ctx = preflight.context_from_args(pairs, defaults)
        if region is not None and any(p.startswith("region=") for p in pairs):
            if ctx.get("region") != region:
                raise ValueError(f"--region {region} and -c region={ctx.get('region')} disagree; pass one")
        elif region is not None:
            ctx["region"], pairs = region, [*pairs, f"region={region}"]
        spec = preflight.spec_from_context(ctx)
    except (ValueError, OSError) as e:
        raise LaunchError(str(e).splitlines()[0]) from None
    facts = preflight_shell.gather(aws.session(spec.region, profile), spec)
    verdicts = preflight.decide(spec, facts)
    for line in [*preflight.render(verdicts), preflight.summary(spec, verdicts, pairs)]:
        console.print(line, markup=False, highlight=False)
    if preflight.failed(verdicts):
        raise typer.Exit(1)


@app.command("discover")
def discover_cmd(cluster: str = typer.Option(None, "--cluster", help="Stack name; default $SCALETRAIN_STACK or "
                                                                    "'scaletrain'."),
                 region: str = RegionOpt, profile: str = ProfileOpt,
                 ready_timeout: float = typer.Option(1800, "--ready-timeout", help="Seconds to wait for the nodes."),
                 no_wait: bool = typer.Option(False, "--no-wait", help="Only read the stack; do not wait.")):
    """Find a deployed stack's nodes, pin their host keys, write the ssh_config, and wait until all are ready."""
    from launcher.cluster.aws import api as aws
    from launcher.execute import awsrun

    stack = cluster or os.environ.get("SCALETRAIN_STACK") or DEFAULT_STACK
    sess = aws.session(region, profile)
    if no_wait:
        c = aws.discover_cluster(sess, stack, profile=profile)
    else:
        c = awsrun.connect_ready(sess, stack, profile=profile, timeout_s=ready_timeout)
        awsrun.install_node_access(c)
    for n in c.nodes:
        console.print(f"  {n.name:<10} {n.role:<8} {n.instance_id}  {n.address:<15} {n.instance_type}  "
                      f"{n.slots} slot(s)", markup=False, highlight=False)
    console.print(f"cluster '{c.name}': {len(c.workers)} worker(s), {len(c.reducers)} reducer(s); ssh_config "
                  f"{c.ssh_config} (try: launch ssh {c.nodes[0].name})", markup=False, highlight=False)


@app.command("ssh", context_settings={"allow_interspersed_args": False})
def ssh_cmd(node: str = typer.Argument(..., help="Node name (node0, reducer0, ...)."),
            command: list[str] = typer.Argument(None, help="Command to run instead of a login shell."),
            cluster: str = ClusterOpt):
    """Open an SSH session on one node (through SSM Session Manager on AWS), host keys pinned."""
    c = clusters.load(cluster)
    c.node(node)
    argv = ssh_argv(c.ssh_config, node, command or [])
    os.execvp(argv[0], argv)


def ssh_argv(ssh_config: str, node: str, command: list[str]) -> list[str]:
    """The ssh command line `launch ssh` runs (pure; the cluster's ssh_config pins the keys and the proxy)."""
    return ["ssh", "-F", ssh_config, *(["-t"] if not command else []), node, *command]


@data_app.command("sample")
def data_sample(out: Path = typer.Option(..., "--out", help="Directory to create (ILSVRC2012 layout)."),
                classes: int = typer.Option(10, "--classes", help="Number of classes (2..1000)."),
                per_class: int = typer.Option(100, "--per-class", help="Training images per class."),
                val_per_class: int = typer.Option(None, "--val-per-class",
                                                  help="Validation images per class; default per-class/5."),
                seed: int = typer.Option(0, "--seed", help="Same seed, same bytes.")):
    """Write a synthetic data set in the real ILSVRC2012 layout, learnable by a small network."""
    from training.sample import make_sample

    total = classes * (per_class + (val_per_class if val_per_class is not None else max(2, per_class // 5)))
    with _progress("sample", total) as tick:
        try:
            summary = make_sample(out, classes=classes, per_class=per_class, val_per_class=val_per_class,
                                  seed=seed, on_image=tick)
        except ValueError as e:
            raise LaunchError(str(e)) from None
    console.print(f"wrote {summary['train']} training and {summary['val']} validation images "
                  f"in {classes} classes to {out}")


@data_app.command("convert")
def data_convert(src: Path = typer.Argument(None, metavar="SRC", help="ImageNet as you have it (see above)."),
                 out: Path = typer.Option(..., "--out", help="Directory for the shards and manifest.json."),
                 shard_size: int = typer.Option(1000, "--shard-size", help="Samples per shard."),
                 resize: int = typer.Option(None, "--resize", metavar="PX",
                                            help="Shrink images whose shorter side is over PX to PX (e.g. 256-480) "
                                                 "and re-encode them; default: keep every image as it is."),
                 quality: int = typer.Option(95, "--quality", metavar="Q", help="JPEG quality of re-encoded images."),
                 seed: int = typer.Option(0, "--seed", help="Shuffle seed."),
                 workers: int = typer.Option(None, "--workers", metavar="W",
                                             help="Processes; default: one per core (with --cluster: the node's)."),
                 node_index: int = typer.Option(0, "--node-index", metavar="I",
                                                help="This machine is node I of --node-count N: it writes shards "
                                                     "I, I+N, ... and manifest.node-I-of-N.json; when every node "
                                                     "is done, one runs --merge."),
                 node_count: int = typer.Option(1, "--node-count", metavar="N", help="Machines sharing the work."),
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
    from training.convert import convert, merge_manifests

    def summary(manifest: dict, where: str) -> None:
        splits = ", ".join(f"{k}: {v['samples']} samples in {v['shards']} shards"
                           for k, v in manifest["splits"].items())
        console.print(f"wrote {where} ({splits or 'no shards'}); {len(manifest['rejected'])} input(s) rejected")
        shown = 20
        for r in manifest["rejected"][:shown]:
            err.print(f"  rejected {r['path']}: {r['reason']}", markup=False, highlight=False)
        if len(manifest["rejected"]) > shown:
            err.print(f"  ... and {len(manifest['rejected']) - shown} more, listed in {where}", markup=False,
                      highlight=False)

    try:
        if merge:
            if cluster is not None or src is not None:
                raise LaunchError("--merge takes only --out and --node-count")
            summary(merge_manifests(out, node_count), f"{out}/manifest.json")
            return
        if src is None:
            raise LaunchError("missing argument SRC (see `launch data convert --help`)")
        if cluster is not None:
            from launcher.execute.dataprep import convert_on_cluster
            from launcher.plans.dataprep import ConvertSpec

            if (node_index, node_count) != (0, 1):
                raise LaunchError("--cluster chooses the nodes itself; leave out --node-index and --node-count")
            spec = ConvertSpec(src=str(src.expanduser().resolve()), out=str(out.expanduser().resolve()),
                               shard_size=shard_size, seed=seed, resize=resize, quality=quality,
                               workers=workers)
            summary(convert_on_cluster(clusters.load(cluster), spec), f"{spec.out}/manifest.json")
            return
        if not src.exists():
            raise LaunchError(f"SRC {src} does not exist")

        def started(inputs: int, kept: int) -> None:
            if kept:
                err.print(f"resuming: {kept} finished shard(s) verified and kept", markup=False, highlight=False)
            tick.restart(inputs)

        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        if err.is_terminal:
            err.print(f"listing {src} ...", markup=False, highlight=False)  # 1.28M files take a while
        with _progress("convert", 0) as tick:
            manifest = convert(src, out, shard_size=shard_size, seed=seed, resize=resize, quality=quality,
                               workers=workers or cores, node_index=node_index,
                               node_count=node_count, on_start=started, on_sample=tick)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    where = "manifest.json" if node_count == 1 else f"manifest.node-{node_index}-of-{node_count}.json"
    summary(manifest, f"{out}/{where}")


@app.command("train", context_settings={"allow_interspersed_args": False})
def train(trainer_args: list[str] = typer.Argument(None, help="Extra trainer options after --, e.g. -- "
                                                             "--label-smoothing 0.1 (see python -m training.train "
                                                             "--help)."),
          cluster: str = ClusterOpt,
          nodes: int = typer.Option(None, "--nodes", help="Worker nodes to use; default all."),
          data: str = typer.Option(None, "--data", help="Shards directory (as the nodes see it); on AWS also "
                                                       "s3://BUCKET/PREFIX of shards, or ImageNet as downloaded "
                                                       "(converted on the nodes once, with fsx/beegfs storage); "
                                                       "default: make sample data and convert it."),
          model: str = typer.Option("resnet50", "--model", help="resnet18, resnet34, resnet50 or resnet101."),
          image_size: int = typer.Option(224, "--image-size", help="Training crop size in px."),
          epochs: int = typer.Option(90, "--epochs"),
          batch_per_gpu: int = typer.Option(256, "--batch-per-gpu", help="Images per rank per step."),
          warmup_epochs: float = typer.Option(None, "--warmup-epochs", help="Default: 10 (seed 000)."),
          workers: int = typer.Option(2, "--workers", help="Data loader processes per rank."),
          engine: str = typer.Option("horovod", "--engine", help="horovod, or ddp (torch.distributed: NCCL on "
                                                                 "GPU, gloo on CPU) for an image without Horovod."),
          reducers: int = typer.Option(0, "--reducers", help="Reduce gradients on this many of the cluster's "
                                                             "reducer nodes (seed 004's tier; engine 'reducer')."),
          output: str = typer.Option(None, "--output", help="Run directory; default runs/<time>."),
          resume: bool = typer.Option(False, "--resume", help="Continue from the newest checkpoint in --output."),
          teardown: bool = typer.Option(False, "--teardown", help="Bring the cluster down afterwards, "
                                                                  "also on failure or Ctrl-C."),
          region: str = RegionOpt, profile: str = ProfileOpt,
          ready_timeout: float = typer.Option(1800, "--ready-timeout", help="AWS: seconds to wait for every node "
                                                                           "to be ready."),
          probe_interval: float = typer.Option(15, "--probe-interval", metavar="SECONDS",
                                               help="While training, probe every node over SSH this often."),
          probe_misses: int = typer.Option(4, "--probe-misses", metavar="N",
                                           help="Stop the job when a node misses this many probes in a row "
                                                "(hung, not dead: mpirun would wait for it for ever)."),
          stall_timeout: float = typer.Option(1800, "--stall-timeout", metavar="SECONDS",
                                              help="Stop the job when it prints nothing for this long (a rank stuck "
                                                   "in a collective); 0: never.")):
    """Train on the cluster with Horovod (or DDP) over mpirun; stream rank 0; report accuracy and AWS cost."""
    from training.model import check_model

    try:
        check_model(model)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    if engine not in job.ENGINES:
        raise LaunchError(f"--engine must be one of: {', '.join(job.ENGINES)}; got '{engine}'")
    if reducers < 0:
        raise LaunchError(f"--reducers must be >= 0, got {reducers}")
    if reducers and engine not in ("horovod", "reducer"):
        raise LaunchError(f"--reducers uses the reducer engine; leave out --engine {engine}")
    if engine == "reducer" and not reducers:
        raise LaunchError("--engine reducer needs --reducers K (reducer nodes of the cluster)")
    engine = "reducer" if reducers else engine
    for name, value in (("--epochs", epochs), ("--batch-per-gpu", batch_per_gpu), ("--image-size", image_size)):
        if value < 1:
            raise LaunchError(f"{name} must be >= 1, got {value}")
    if resume and output is None:
        raise LaunchError("--resume needs --output: the run directory holding the checkpoints")
    if not probe_interval > 0:
        raise LaunchError(f"--probe-interval must be a number of seconds > 0, got {probe_interval:g}")
    if probe_misses < 1:
        raise LaunchError(f"--probe-misses must be >= 1, got {probe_misses}")
    if not stall_timeout >= 0:
        raise LaunchError(f"--stall-timeout must be a number of seconds >= 0 (0: no silence check), "
                          f"got {stall_timeout:g}")
    from launcher.plans import watchdog

    watch = watchdog.Watch(interval_s=probe_interval, misses=probe_misses, stall_s=stall_timeout)
    stamp = time.strftime("%Y%m%d-%H%M%S")

    def body(c: clusters.Cluster, out: str, data_path: str) -> None:
        chosen = c.select_workers(nodes)
        if reducers > len(c.reducers):
            raise LaunchError(f"--reducers {reducers} is more than the {len(c.reducers)} reducer node(s) of cluster "
                              f"'{c.name}'; bring one up with `launch local up --nodes N --reducers K`")
        spec = job.TrainSpec(data=data_path, output=out, model=model, image_size=image_size, epochs=epochs,
                             batch_per_gpu=batch_per_gpu, warmup_epochs=warmup_epochs, workers=workers,
                             resume=resume, engine=engine, reducers=reducers,
                             extra_args=tuple(trainer_args or ()))
        result = run.train(c, chosen, spec, make_data=not data, reducers=c.reducers[:reducers], watch=watch)
        if c.backend == "aws":  # the run directory is on the cluster's storage, which --teardown deletes
            _fetch_record(c, chosen[0], out, newest_checkpoint=teardown)
        if result.stopped:  # the watchdog's reason: a hung node would only stall a probe of who answers
            raise LaunchError(f"training failed: {result.stopped} (output above); run directory {out}")
        if result.exit_code != 0:
            from launcher.plans import faults

            used = chosen + c.reducers[:reducers]
            # Which nodes still answer: a node that went away is the likeliest cause, and mpirun may not name it.
            silent = {r.node: r.error or f"exit {r.exit_code}" for r in remote.run_all(c, used, "true") if not r.ok}
            why = faults.diagnose(result.lines, used, silent)
            raise LaunchError(f"training failed: {why or f'mpirun on {chosen[0].name} exited {result.exit_code}'} "
                              f"(output above); run directory {out}")
        _report(chosen, spec, result, c)

    c, stack = _target(cluster)
    if stack is None:
        assert c is not None
        try:
            body(c, run.local_output(output, stamp), str(Path(data).expanduser().resolve()) if data else "")
        finally:
            if teardown:
                _teardown(c)
        return

    from launcher.cluster.aws import api as aws
    from launcher.execute import awsrun

    sess = aws.session(region or (c.aws.region if c and c.aws else None), profile or (c.aws.profile if c and c.aws
                                                                                       else None))

    def on_aws() -> None:
        found = awsrun.connect_ready(sess, stack, profile=profile, timeout_s=ready_timeout)
        awsrun.install_node_access(found)
        awsrun.prepare_storage(found)
        first = found.select_workers(nodes)[0]
        out = output or f"{awsrun.shared_root(found) or first.workdir}/runs/{stamp}"
        body(found, out, awsrun.stage_data(found, found.select_workers(nodes), data) if data else "")

    awsrun.with_teardown(sess, stack, teardown, on_aws)



def _fetch_record(c: clusters.Cluster, first: clusters.Node, out: str, *, newest_checkpoint: bool) -> None:
    """Bring the run's record (and, before a teardown, its newest checkpoint) to this machine; a failure here is a
    warning, never the run's verdict."""
    from launcher.execute import results

    dest = results.local_copy(clusters.state_root(), c.name, out)
    try:
        got = results.fetch(c, first, out, dest, newest_checkpoint=newest_checkpoint, timeout_s=60)
    except LaunchError as e:
        console.print(f"warning: could not fetch the run's record from {first.name}: {e}", markup=False,
                      highlight=False)
        return
    size = sum(f.size for f in got)
    console.print(f"fetched {len(got)} file(s), {size / 2**20:,.1f} MiB, from {first.name}:{out} to {dest}",
                  markup=False, highlight=False)


def _target(cluster: str | None) -> tuple[clusters.Cluster | None, str | None]:
    """(the saved cluster, or None; the AWS stack to use, or None for a local cluster).

    A name the launcher does not know is taken as a stack to discover; with no name and no saved cluster, the
    stack is $SCALETRAIN_STACK or infra's default name.
    """
    names = clusters.known_names()
    if cluster in names or (cluster is None and names):
        c = clusters.load(cluster)
        return c, (c.aws.stack if c.aws else c.name) if c.backend == "aws" else None
    return None, cluster or os.environ.get("SCALETRAIN_STACK") or DEFAULT_STACK


def _report(chosen, spec: job.TrainSpec, result: run.RunResult, cluster: clusters.Cluster | None = None) -> None:
    import datetime as dt

    from launcher.cost import measured
    from launcher.cost import shell as costshell
    from launcher.cost.inputs import Workload
    from launcher.cost.model import compare, estimate
    from launcher.cost.runcheck import check_run
    from training.model import flops_per_image, parameter_count

    s = result.summary or {}
    top1 = "n/a" if s.get("top1") is None else f"{s['top1']:.1%}"
    top5 = "n/a" if s.get("top5") is None else f"{s['top5']:.1%}"
    console.print(f"\nrun finished: {spec.model} on {len(chosen)} node(s) / {s.get('ranks', '?')} rank(s), "
                  f"{spec.epochs} epochs, top-1 {top1}, top-5 {top5}, "
                  f"{s.get('images_per_sec', 0):.0f} img/s, {s.get('time_s', 0):.0f} s")
    console.print(f"metrics: {result.output}/metrics.jsonl   checkpoints: {result.output}/checkpoint-epoch*.pt")
    images = result.train_images
    ratio = flops_per_image(spec.model, spec.image_size) / flops_per_image("resnet50", 224)
    per_epoch = s["steps_per_epoch"] * s["global_batch"] if s.get("steps_per_epoch") and s.get("global_batch") \
        else images
    workload = Workload(images_per_epoch=max(per_epoch, 1), epochs=spec.epochs, flops_ratio=ratio,
                        param_count=parameter_count(spec.model, s.get("classes", 1000)))
    figures, _ = costshell.load_measured()
    constants, _ = costshell.model_constants()

    # Measured against predicted, for the shape that ran.
    c = cluster or costshell.cluster_of(list(chosen))
    ran_on = c.instance_type if c is not None and c.backend == "aws" else None
    on_gpus = s.get("device") not in (None, "cpu")
    if not (ran_on and on_gpus):
        where = f"{c.backend} cluster '{c.name}'" if c is not None else "this cluster"
        console.print(f"\nmeasured vs predicted: not available -- the model predicts GPU instance types from the "
                      f"catalog, and this run's {s.get('ranks', '?')} rank(s) ran on "
                      f"{'CPUs' if not on_gpus else 'GPUs of an unknown instance type'} of the {where}.")
    elif not (s.get("train_images") and s.get("images_per_sec") and s.get("time_s")):
        console.print("\nmeasured vs predicted: not available -- the run trained no images (summary.json)")
    else:
        try:
            instance = costshell.instance(ran_on)
            book = costshell.price_book([instance], ["on-demand"], refresh=False)
            predicted = estimate(
                instance, len(chosen), workload, batch_per_gpu=spec.batch_per_gpu, measured=figures,
                precision="fp32" if s.get("precision") == "fp32" else "amp", price=book.quote(ran_on, "on-demand"),
                constants=constants)
            check = check_run(predicted, images=s["train_images"], images_per_sec=s["images_per_sec"],
                              loop_s=s["time_s"], steady_images_per_sec=s.get("steady_images_per_sec"))
        except (ValueError, LaunchError) as e:
            console.print(f"\nmeasured vs predicted: no prediction ({e})")
        else:
            table = Table(title=f"measured vs predicted: {predicted.shape}, {predicted.market}")
            for col in ("", "measured", "predicted", "off by"):
                table.add_column(col, justify="left" if not col else "right", no_wrap=True)
            for what, got, want, off in check.rows:
                table.add_row(what, got, want, f"{off:+.1%}")
            console.print(table)
            console.print(check.verdict())
            console.print(f"per-GPU figure: {predicted.throughput_source.split(':')[0]}; "
                          f"{book.quote(ran_on, 'on-demand').label()}")
            found = measured.from_run(instance, nodes=len(chosen), model=spec.model, image_size=spec.image_size,
                                      summary=s, run_dir=result.output, today=dt.date.today())
            if found:
                try:
                    measured.record(measured.path(clusters.state_root()), *found)
                    console.print(f"recorded {found[1].img_per_sec:,.0f} img/s per GPU as this project's measured "
                                  f"{found[0]} figure; the cost model now uses it")
                except OSError as e:
                    err.print(f"warning: could not record the measured {found[0]} figure ({e.strerror or e})")

    table = Table(title=f"the same run on AWS ({len(chosen)} node(s), {images} images x {spec.epochs} epochs)")
    for col in ("instance", "img/s", "limited by", "time", "cost (USD)"):
        table.add_column(col, justify="left" if col in ("instance", "limited by") else "right", no_wrap=True)
    estimates = compare(["p3.16xlarge", "p4d.24xlarge", "p5.48xlarge"], len(chosen), workload,
                        batch_per_gpu=spec.batch_per_gpu, constants=constants)
    for e in estimates:
        table.add_row(e.instance_type, f"{e.images_per_sec:,.0f}", e.limited_by, f"{e.time_to_train_s / 60:.1f} min",
                      f"{e.cost_usd:,.2f}")
    console.print(table)
    dates = ", ".join(f"{e.instance_type} {e.price_date}" for e in estimates)
    console.print(f"us-east-1 on-demand prices as of {dates}; time includes provisioning "
                  f"({estimates[0].provisioning_s:.0f} s) and staging the data; `launch cost` compares more shapes.")


def _teardown(c: clusters.Cluster) -> None:
    if c.backend == "local":
        local.down(c)
        console.print(f"cluster '{c.name}' is down (--teardown)")
    else:
        from launcher.cluster.aws import api as aws

        assert c.aws is not None
        aws.teardown(aws.session(c.aws.region, c.aws.profile), c.aws.stack)


@app.command("plan")
def plan_cmd(nodes: int = typer.Option(..., "--nodes", help="Worker nodes."),
             instance_type: str = typer.Option(..., "--instance-type", help="Worker instance type, e.g. p4d.24xlarge."),
             reducers: int = typer.Option(None, "--reducers", help="CPU nodes of the reducer tier (parameter "
                                                                   "servers with --strategy ps); 0: none. Default: "
                                                                   "the model's count with --strategy reducers/ps."),
             reducer_type: str = typer.Option(None, "--reducer-type", help="Their instance type; default "
                                                                          "c5n.18xlarge (reducers), m5.24xlarge (ps)."),
             strategy: str = typer.Option(None, "--strategy", help="horovod, reducers or ps; default: reducers "
                                                                   "with --reducers or --reducer-type, else horovod."),
             epochs: int = typer.Option(90, "--epochs"),
             batch_per_gpu: int = typer.Option(256, "--batch-per-gpu", help="Images per rank per step."),
             warmup_epochs: float = typer.Option(10.0, "--warmup-epochs", help="Linear warmup (seed 000: 10)."),
             images_per_epoch: int = typer.Option(1_281_167, "--images-per-epoch", help="Default: ImageNet-1k."),
             gpu_throughput: float = typer.Option(None, "--gpu-throughput", help="Single-GPU ResNet-50 images/s; "
                                                                                "overrides the catalog's figure."),
             precision: str = typer.Option("amp", "--precision", help="amp (mixed precision) or fp32."),
             fp16_allreduce: bool = typer.Option(False, "--fp16-allreduce", help="Model fp16 gradient compression."),
             market: str = typer.Option("on-demand", "--market", help="on-demand or spot (spot prices come from "
                                                                     "`launch cost --refresh-prices`)."),
             as_json: bool = typer.Option(False, "--json", help="Print one JSON object instead of tables.")):
    """The plan and estimate for one cluster shape, offline: hostfile, mpirun, env, EFA devices, LR schedule, cost."""
    import json

    from launcher.cost import shell as costshell
    from launcher.cost.inputs import DEFAULT_TIER_TYPE, STRATEGIES, STRATEGY_LABELS, imagenet
    from launcher.cost.model import Estimate
    from launcher.cost.prices import MARKETS, PriceUnavailable
    from launcher.plans import offline

    for name, value, low in (("--nodes", nodes, 1), ("--epochs", epochs, 1), ("--batch-per-gpu", batch_per_gpu, 1),
                             ("--images-per-epoch", images_per_epoch, 1), ("--reducers", reducers, 0)):
        if value is not None and value < low:
            raise LaunchError(f"{name} must be >= {low}, got {value}")
    if market not in MARKETS:
        raise LaunchError(f"unknown market '{market}'; choose one of: {', '.join(MARKETS)}")
    workers = costshell.instance(instance_type)
    # An explicit --reducers 0 means no tier; only a count left out takes the model's default.
    if reducers == 0 and reducer_type and strategy is None:
        err.print(f"warning: --reducers 0 plans no reducer tier; --reducer-type {reducer_type} is not used",
                  markup=False, highlight=False)
        reducer_type = None
    strategy = strategy or ("reducers" if reducers or reducer_type else "horovod")
    if strategy not in STRATEGIES:
        raise LaunchError(f"unknown strategy '{strategy}'; choose one of: {', '.join(STRATEGIES)}")
    tier = costshell.instance(reducer_type or DEFAULT_TIER_TYPE[strategy]) \
        if strategy != "horovod" or reducer_type else None
    workload = imagenet(epochs, fp16_allreduce=fp16_allreduce)
    if images_per_epoch != workload.images_per_epoch:
        workload = workload.model_copy(update={"images_per_epoch": images_per_epoch, "dataset_bytes": None})
    figures, note = costshell.load_measured()
    constants, loader_note = costshell.model_constants()
    book = costshell.price_book([workers] + ([tier] if tier else []), [market], refresh=False)
    for line in [*book.notes, *(n for n in (note, loader_note) if n)]:
        err.print(f"warning: {line}", markup=False, highlight=False)
    try:
        doc = offline.plan_document(
            workers, nodes, workload, strategy=strategy, tier=tier, tier_nodes=reducers,
            batch_per_gpu=batch_per_gpu, warmup_epochs=warmup_epochs, gpu_throughput=gpu_throughput,
            precision=precision, measured=figures, price=book.quote(workers.name, market),  # type: ignore[arg-type]
            tier_price=book.quote(tier.name, market) if tier else None,  # type: ignore[arg-type]
            constants=constants)
    except (ValueError, PriceUnavailable) as e:
        raise LaunchError(str(e)) from None
    if as_json:
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        return
    e = Estimate.model_validate(doc["estimate"])
    console.print(f"plan: {e.shape}, {doc['shape']['ranks']} rank(s), {STRATEGY_LABELS[e.strategy]}, "
                  f"{e.market}", markup=False)
    table = Table(title="estimate", show_header=False)
    table.add_column("")
    table.add_column("", justify="right")
    for what, value in (
        ("per-GPU throughput", f"{e.gpu_images_per_sec:,.0f} img/s ({e.throughput_source.split(':')[0]})"),
        ("compute per step", f"{e.compute_time_s * 1e3:,.1f} ms"),
        ("gradient reduction per step", f"{e.comm_time_s * 1e3:,.1f} ms ({e.exposed_comm_time_s * 1e3:,.1f} ms "
                                        f"not hidden; limited by {e.comm_limited_by})"),
        ("step", f"{e.step_time_s * 1e3:,.1f} ms"),
        ("throughput", f"{e.images_per_sec:,.0f} img/s, {e.scaling_efficiency:.1%} scaling"),
        ("limited by", e.limited_by),
        ("epoch (with checkpoint)", f"{e.epoch_time_s:,.1f} s"),
        ("training", f"{e.training_s / 60:,.1f} min ({epochs} epochs + validation)"),
        ("provisioning + staging", f"{(e.provisioning_s + e.staging_s) / 60:,.1f} min"),
        ("time to train", f"{e.time_to_train_s / 60:,.1f} min"),
        ("cluster price", f"${e.cluster_usd_per_hour:,.2f}/h ({e.market}, as of {e.price_date})"),
        ("cost", f"${e.cost_usd:,.2f} (${e.cost_per_epoch_usd:,.2f} per epoch)"),
    ):
        table.add_row(what, value)
    console.print(table)
    nodes_table = Table(title="worker nodes")
    for col in ("node", "slots", "EFA interfaces (network card: device index)"):
        nodes_table.add_column(col)
    for dev in doc["efa_devices"]:
        cards = ", ".join(f"{i['network_card_index']}:{i['device_index']}" for i in dev["interfaces"]) or "none"
        nodes_table.add_row(dev["node"], str(workers.gpus), cards)
    console.print(nodes_table)
    if doc["reducer_nodes"]:
        console.print(f"{e.strategy} nodes: {', '.join(doc['reducer_nodes'])} ({e.tier_type})")
    console.print("env: " + " ".join(f"{k}={v}" for k, v in doc["env"].items()), markup=False, highlight=False)
    console.print("hostfile:\n" + doc["hostfile"].rstrip(), markup=False, highlight=False)
    console.print("mpirun: " + job.command_line(doc["mpirun"]), markup=False, highlight=False)
    schedule = doc["lr_schedule"]
    peak_epoch, peak = max(schedule, key=lambda row: row[1])
    console.print(f"lr: {schedule[0][1]:g} at epoch 0, peak {peak:g} at epoch {peak_epoch}, {schedule[-1][1]:g} at "
                  f"epoch {schedule[-1][0]} ({doc['steps_per_epoch']} steps per epoch, global batch "
                  f"{doc['global_batch']}; every epoch with --json)")
    for line in e.assumptions + doc["notes"]:
        console.print(f"  - {line}", markup=False, highlight=False)


@app.command("cost")
def cost_cmd(instance_types: str = typer.Option(None, "--instance-types", help="Comma-separated GPU types; default "
                                                "p3.16xlarge,p3dn.24xlarge,p4d.24xlarge,p5.48xlarge."),
             nodes: str = typer.Option("1,2,4,8,16", "--nodes", help="Comma-separated worker node counts."),
             strategies: str = typer.Option("horovod,ps,reducers", "--strategies", help="Comma-separated: horovod "
                                            "(ring allreduce), ps (parameter servers), reducers (reducer tier)."),
             markets: str = typer.Option("on-demand", "--markets", help="on-demand, spot, or on-demand,spot."),
             reducer_type: str = typer.Option("c5n.18xlarge", "--reducer-type"),
             reducers_per_worker: float = typer.Option(1.0, "--reducers-per-worker"),
             ps_type: str = typer.Option("m5.24xlarge", "--ps-type", help="Parameter-server instance type."),
             ps_per_worker: float = typer.Option(2.0, "--ps-per-worker", help="Seed 003: 2 servers per worker."),
             epochs: int = typer.Option(90, "--epochs"),
             batch_per_gpu: int = typer.Option(256, "--batch-per-gpu"),
             images_per_epoch: int = typer.Option(1_281_167, "--images-per-epoch", help="Default: ImageNet-1k."),
             gpu_throughput: float = typer.Option(None, "--gpu-throughput", help="Single-GPU ResNet-50 images/s "
                                                                                "for every type (overrides)."),
             precision: str = typer.Option("amp", "--precision", help="amp or fp32."),
             fp16_allreduce: bool = typer.Option(False, "--fp16-allreduce"),
             refresh_prices: bool = typer.Option(False, "--refresh-prices", help="Fetch on-demand (Price List API) "
                                                 "and spot prices from AWS first and cache them."),
             out: Path = typer.Option(None, "--out", help="Report directory; default reports/cost-<time>.")):
    """Compare cluster shapes on time to train and cost; write a report (Markdown, HTML, PNG plots, CSV)."""
    import datetime as dt

    from pydantic import ValidationError

    from infra.catalog import UnknownInstanceType
    from launcher.cost import report as costreport
    from launcher.cost import shell as costshell
    from launcher.cost.inputs import STRATEGY_LABELS, imagenet

    try:
        grid = costreport.CostGrid(
            instance_types=costshell.parse_list(instance_types, "--instance-types") if instance_types
            else costreport.DEFAULT_INSTANCE_TYPES,
            nodes=costshell.parse_list(nodes, "--nodes", int),
            strategies=costshell.parse_list(strategies, "--strategies"),
            markets=costshell.parse_list(markets, "--markets"), reducer_type=reducer_type,
            reducers_per_worker=reducers_per_worker, ps_type=ps_type, ps_per_worker=ps_per_worker,
            batch_per_gpu=batch_per_gpu, gpu_throughput=gpu_throughput, precision=precision)
        grid.check()
        workload = imagenet(epochs, fp16_allreduce=fp16_allreduce)
        if images_per_epoch != workload.images_per_epoch:
            workload = workload.model_copy(update={"images_per_epoch": images_per_epoch, "dataset_bytes": None})
    except ValidationError as e:
        first = e.errors()[0]
        raise LaunchError(f"--{str(first['loc'][0]).replace('_', '-')}: {first['msg']}") from None
    except (ValueError, UnknownInstanceType) as e:
        raise LaunchError(str(e)) from None
    types = [costshell.instance(n) for n in grid.instance_types]
    types += [costshell.instance(grid.reducer_type)] if "reducers" in grid.strategies else []
    types += [costshell.instance(grid.ps_type)] if "ps" in grid.strategies else []
    book = costshell.price_book(types, grid.markets, refresh=refresh_prices)
    figures, note = costshell.load_measured()
    constants, loader_note = costshell.model_constants()
    try:
        result = costreport.evaluate_grid(grid, workload, book, today=dt.date.today(), measured=figures,
                                          constants=constants)
    except ValueError as e:
        raise LaunchError(str(e)) from None
    for line in [*result.notes, *(n for n in (note, loader_note) if n)]:
        err.print(f"warning: {line}", markup=False, highlight=False)
    out = out or Path("reports") / f"cost-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and not out.is_dir():
        raise LaunchError(f"--out {out} is a file; name a directory")
    try:
        costreport.write_report(out, costreport.render(result))
    except OSError as e:
        raise LaunchError(f"could not write the report to {out}: {e.strerror or e}") from None

    table = Table(title=f"Pareto frontier of {len(result.rows)} shapes: none is both faster and cheaper")
    for col in ("shape", "strategy", "market", "img/s", "scaling", "time to train", "cost (USD)"):
        table.add_column(col, justify="right" if col in ("img/s", "scaling", "time to train", "cost (USD)") else "left")
    for i in result.pareto:
        r = result.rows[i]
        table.add_row(r.shape, STRATEGY_LABELS[r.strategy], r.market, f"{r.images_per_sec:,.0f}",
                      f"{r.scaling_efficiency:.0%}", f"{r.time_to_train_s / 60:,.0f} min", f"{r.cost_usd:,.2f}")
    console.print(table)
    console.print("prices: " + "; ".join(f"{q.instance_type} {q.label()}" for q in result.prices), markup=False)
    console.print(f"report: {out / 'report.html'} (also report.md, grid.csv and {len(costreport.PLOTS)} PNG plots)",
                  markup=False, highlight=False)


def main(argv: list[str] | None = None) -> int:
    try:
        rv = app(args=argv, prog_name="launch", standalone_mode=False)
    except click.UsageError as e:
        hint = f" (see `{e.ctx.command_path} --help`)" if e.ctx else ""
        print(f"error: {e.format_message()}{hint}", file=sys.stderr)
        return 2
    except (click.exceptions.Abort, KeyboardInterrupt):
        print("error: interrupted", file=sys.stderr)
        return 130
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    if rv == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into a silent Exit(130) outside standalone mode
        print("error: interrupted", file=sys.stderr)
    return rv if isinstance(rv, int) else 0
