"""Rehearsal nodes, executed: build the root with the image recipe's scripts, make the network, boot the nodes.

The decisions are in launcher/plans/rehearsal.py; this module runs debootstrap, chroot, ip and unshare. The built
root is cached under the user's cache directory in two layers, each keyed by what it is made from: the system
(debootstrap and every component before the project's) and the project (ami/components/scaletrain.sh on the
project's source archive). A node is an overlay of the two with its own upper directory, so a second
`launch local up` builds nothing and a replaced node starts from the image again.
"""

from __future__ import annotations

import contextlib
import fnmatch
import io
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ami import render
from launcher.errors import LaunchError
from launcher.plans import bootlog
from launcher.plans import rehearsal as plan

REPO = Path(__file__).resolve().parents[2]
# The project's source archive, as the image pipeline uploads it (ami/stack.py: the same exclusions).
SOURCE_EXCLUDE = render.SOURCE_EXCLUDE


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaletrain" / "rehearsal"


def say(text: str) -> None:
    print(f"[rehearsal] {text}", file=sys.stderr, flush=True)


def run_tool(cmd: list[str], what: str, *, log: Path | None = None, timeout: float | None = None) -> str:
    try:
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)
    except FileNotFoundError:
        raise LaunchError(f"{what}: {cmd[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise LaunchError(f"{what}: timed out after {timeout:.0f} s") from None
    if log is not None:
        with open(log, "a") as f:
            f.write(f"$ {' '.join(cmd)}\n{proc.stdout}")
    if proc.returncode != 0:
        raise LaunchError(f"{what} failed (exit {proc.returncode}): {bootlog.last_lines(proc.stdout)}")
    return proc.stdout


def check_host() -> None:
    plan.root_required(os.geteuid())
    problem = plan.missing_tools({t: shutil.which(t) is not None
                                  for t in ("ip", "unshare", "debootstrap", "chroot", "mount")})
    if problem:
        raise LaunchError(problem)


# -- the root ---------------------------------------------------------------------------------------------------------

def _excluded(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(rel.rsplit("/", 1)[-1], pat) for pat in SOURCE_EXCLUDE)


def source_archive() -> bytes:
    """The project's source as a zip, deterministic (sorted names, fixed times), what scaletrain.sh installs."""
    files = []
    for top, dirs, names in os.walk(REPO):
        base = Path(top).relative_to(REPO).as_posix()
        prefix = "" if base == "." else f"{base}/"
        dirs[:] = sorted(d for d in dirs if not _excluded(prefix + d))
        files += [prefix + n for n in names if not _excluded(prefix + n)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for rel in sorted(files):
            path = REPO / rel
            info = zipfile.ZipInfo(rel, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (path.stat().st_mode & 0o777) << 16
            z.writestr(info, path.read_bytes())
    return buf.getvalue()


def _scripts(steps: list[plan.Step]) -> dict[str, bytes]:
    return {s.script: (REPO / "ami" / s.source / s.script).read_bytes() for s in steps}


def horovod_wheel() -> Path | None:
    """The Horovod wheel scripts/build-horovod.sh cached for this machine's torch and Python, if there is one."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "scaletrain" / "wheels"
    found = sorted(base.glob(f"horovod-*-torch{plan.REHEARSAL_TORCH}_cpu-cp*/horovod-*.whl"))
    return found[-1] if found else None


def _pip_sources() -> list[Path]:
    """Local package sources this machine's pip is configured with (find-links, file:// indexes, its config),
    bound read-only into the root while it is built, so that the build takes what a `pip install` here takes."""
    found: set[Path] = set()
    for conf in (Path("/etc/xdg/pip"), Path("/etc/pip.conf")):
        if conf.exists():
            found.add(conf)
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    values = [line.split("=", 1)[1].strip().strip("'\"") for line in out.splitlines() if "=" in line]
    values += [v for k, v in os.environ.items() if k.startswith("PIP_")]
    for value in values:
        for item in value.split():
            item = item.removeprefix("file://")
            if item.startswith("/") and not item.startswith("/etc/ssl/") and Path(item).exists():
                found.add(Path(item) if Path(item).is_dir() else Path(item).parent)
    return sorted(p for p in found if not any(p != q and q in p.parents for q in found))


BUILD_CA = "/tmp/build-ca.crt"  # in the root, while it is built


def _pip_env() -> dict[str, str]:
    """This machine's pip settings, and its CA bundle for anything that speaks TLS to a package registry (a proxy
    that re-signs TLS is trusted here, and must be in the build too); build time only."""
    env = {k: v for k, v in os.environ.items() if k.startswith("PIP_")}
    ca = {"PIP_CERT": BUILD_CA, "SSL_CERT_FILE": BUILD_CA, "REQUESTS_CA_BUNDLE": BUILD_CA, "CURL_CA_BUNDLE": BUILD_CA}
    return {**env, **ca} if _host_ca() else env


def _host_ca() -> Path | None:
    for candidate in (os.environ.get("PIP_CERT"), os.environ.get("SSL_CERT_FILE"),
                      "/etc/ssl/certs/ca-certificates.crt"):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    return None


def _put_build_ca(root: Path) -> None:
    ca = _host_ca()
    if ca:
        shutil.copy2(ca, root / BUILD_CA.lstrip("/"))


@contextlib.contextmanager
def _build_mounts(root: Path, log: Path, binds: list[Path]):
    """/proc, /sys, /dev and the pip sources in the root being built; undone whatever happens."""
    made: list[Path] = []
    try:
        for fs, target in (("proc", "proc"), ("sysfs", "sys")):
            run_tool(["mount", "-t", fs, fs, str(root / target)], f"mounting {target} in the build root", log=log)
            made.append(root / target)
        for src, target in [(Path("/dev"), root / "dev"), (Path("/dev/pts"), root / "dev/pts"),
                            *((p, root / str(p).lstrip("/")) for p in binds)]:
            if src.is_dir():
                target.mkdir(parents=True, exist_ok=True)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                target.touch()
            run_tool(["mount", "--bind", str(src), str(target)], f"binding {src} into the build root", log=log)
            made.append(target)
            if src not in (Path("/dev"), Path("/dev/pts")):
                run_tool(["mount", "-o", "remount,bind,ro", str(target)], f"making {src} read-only", log=log)
        yield
    finally:
        for target in reversed(made):
            subprocess.run(["umount", "-l", str(target)], stdin=subprocess.DEVNULL, capture_output=True)


def _chroot_step(root: Path, step: plan.Step, log: Path) -> None:
    cmd = ["chroot", str(root), *plan.step_command(step)]
    env_pip = [f"{k}={v}" for k, v in _pip_env().items()]
    if env_pip:  # the same pip settings as this machine (the index, local wheels), build time only
        i = cmd.index("bash")
        cmd[i:i] = env_pip
    start = time.monotonic()
    _put_build_ca(root)
    say(f"running {step.script} in the root")
    with open(log, "a") as f:
        f.write(f"\n== {step.script}\n")
    try:
        run_tool(cmd, f"the image recipe's {step.script}", log=log, timeout=3600)
    except LaunchError as e:
        raise LaunchError(f"building the rehearsal root: {e}; full log {log}") from None
    say(f"{step.script} done in {time.monotonic() - start:.0f} s")


def _install_scripts(root: Path, steps: list[plan.Step]) -> None:
    target = root / plan.SCRIPT_DIR.lstrip("/")
    target.mkdir(parents=True, exist_ok=True)
    for name, data in _scripts(steps).items():
        (target / name).write_bytes(data)
        (target / name).chmod(0o755)


def _service_policy(root: Path, on: bool) -> None:
    """policy-rc.d: packages installed into a root being built start no services (Debian's invoke-rc.d policy)."""
    p = root / "usr/sbin/policy-rc.d"
    if on:
        p.write_text("#!/bin/sh\nexit 101\n")
        p.chmod(0o755)
    else:
        p.unlink(missing_ok=True)


@dataclass(frozen=True)
class Layers:
    system: Path                             # a root directory
    project: Path                            # an overlay upper directory on top of it

    def lowerdirs(self) -> list[str]:
        return [str(self.project), str(self.system)]


def _tmp(parent: Path, name: str) -> Path:
    parent.mkdir(parents=True, exist_ok=True)
    t = parent / f".{name}.{os.getpid()}.tmp"
    if t.exists():
        _remove(t)
    return t


def _remove(path: Path) -> None:
    subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


def ensure_root(progress: Callable[[str], None] = say) -> Layers:
    """The rehearsal root for the recipe as it is now: from the cache, or built (minutes, once)."""
    check_host()
    versions = render.load_versions()
    wheel = horovod_wheel()
    in_root_wheel = f"/tmp/wheels/{wheel.name}" if wheel else None
    system_steps, project_step = plan.build_steps(versions, horovod_wheel=in_root_wheel)
    scripts = _scripts([*system_steps, *([project_step] if project_step else [])])
    extra = {"wheel": wheel.read_bytes()[:1 << 20] + wheel.name.encode() if wheel else b""}
    sys_key = plan.digest(plan.system_inputs(system_steps, scripts, extra))
    archive = source_archive()
    proj_key = plan.digest({"system": sys_key.encode(), "source": archive,
                            "step": scripts[project_step.script] + repr(sorted(project_step.env.items())).encode()
                            if project_step else b"none"})
    cache = cache_root()
    system = cache / f"system-{sys_key}"
    project = cache / f"project-{proj_key}"
    try:
        if not system.is_dir():
            _build_system(system, system_steps, wheel, progress)
        if not project.is_dir():
            if project_step is None:  # the recipe installs no project: an empty layer
                (project / "upper").mkdir(parents=True)
            else:
                _build_project(project, system, project_step, archive, progress)
    except OSError as e:  # a full disk, a cache directory we may not write: one line, not a traceback
        raise LaunchError(f"building the rehearsal root in {cache}: {e}") from None
    for used in (system, project):  # a layer's mtime says when a cluster last booted from it (_prune reads it)
        os.utime(used)
    _prune(cache, keep={system.name, project.name})
    return Layers(system / "root", project / "upper")


PRUNE_AFTER_S = 24 * 3600


def _prune(cache: Path, keep: set[str]) -> None:
    """Layers of older recipes and sources go (each change of the source makes a project layer), but only beyond
    the newest three and once no cluster has booted from them for a day: a running node's root is an overlay of
    them."""
    now = time.time()
    for kind in ("project-*", "system-*"):
        layers = sorted((p for p in cache.glob(kind) if p.name not in keep), key=lambda p: p.stat().st_mtime)
        for old in layers[:-2]:
            if now - old.stat().st_mtime > PRUNE_AFTER_S:
                _remove(old)


def _settle(tmp: Path, dest: Path) -> None:
    """Move a finished layer into place; when another `launch` built the same layer meanwhile, keep that one."""
    try:
        os.replace(tmp, dest)
    except OSError:
        if not dest.is_dir():
            raise
        _remove(tmp)


def recorded_layers(lowerdirs: list[str]) -> Layers:
    """The layers a cluster's nodes booted from: a replacement boots from the same image, whatever the source is now.
    """
    if len(lowerdirs) != 2 or not all(Path(d).is_dir() for d in lowerdirs):
        raise LaunchError(f"the rehearsal root this cluster booted from is no longer in {cache_root()}; bring the "
                          f"cluster down and up again (`launch local down`, `launch local up`)")
    for d in lowerdirs:
        os.utime(Path(d).parent)
    return Layers(Path(lowerdirs[1]), Path(lowerdirs[0]))


def _build_system(dest: Path, steps: list[plan.Step], wheel: Path | None, progress: Callable[[str], None]) -> None:
    tmp = _tmp(dest.parent, dest.name)
    root = tmp / "root"
    log = tmp / "build.log"
    tmp.mkdir(parents=True)
    progress(f"building the rehearsal root in {dest} (debootstrap and the image recipe: minutes, once)")
    start = time.monotonic()
    try:
        base = _debootstrap(dest.parent, progress)
        run_tool(["cp", "-a", str(base), str(root)], "copying the Debian base", log=log)
        shutil.copy2("/etc/resolv.conf", root / "etc/resolv.conf")
        _install_scripts(root, steps)
        binds = _pip_sources()
        if wheel:
            (root / "tmp/wheels").mkdir(parents=True, exist_ok=True)
            shutil.copy2(wheel, root / "tmp/wheels" / wheel.name)
        _service_policy(root, True)
        with _build_mounts(root, log, binds):
            for step in steps:
                _chroot_step(root, step, log)
        _service_policy(root, False)
        _clean(root)
        (tmp / "recipe.json").write_text(json.dumps([s.script for s in steps]))
        _settle(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise
    progress(f"rehearsal root built in {time.monotonic() - start:.0f} s")


def _debootstrap(cache: Path, progress: Callable[[str], None]) -> Path:
    """Debian's minimal root with the packages the recipe's base image ships, cached by what it is made from."""
    mirror = os.environ.get("SCALETRAIN_DEBIAN_MIRROR", plan.MIRROR)
    key = plan.digest({"debootstrap": f"{plan.SUITE} {mirror} {' '.join(plan.BASE_PACKAGES)}".encode()})
    dest = cache / f"debian-{key}"
    if (dest / "root").is_dir():
        return dest / "root"
    tmp = _tmp(cache, dest.name)
    tmp.mkdir(parents=True)
    start = time.monotonic()
    try:
        run_tool(["debootstrap", "--variant=minbase", f"--include={','.join(plan.BASE_PACKAGES)}", plan.SUITE,
              str(tmp / "root"), mirror], f"debootstrap of Debian {plan.SUITE} from {mirror}",
             log=tmp / "debootstrap.log", timeout=1800)
        _settle(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise
    progress(f"debootstrap done in {time.monotonic() - start:.0f} s")
    return dest / "root"


def _clean(root: Path) -> None:
    for p in ("tmp/wheels", "var/cache/apt/archives", "root/.cache", BUILD_CA.lstrip("/")):
        _remove(root / p)
    (root / "tmp").mkdir(exist_ok=True, mode=0o1777)
    (root / "etc/resolv.conf").write_text("")  # the nodes have no resolver, as a VPC without DNS to the internet


def _build_project(dest: Path, system: Path, step: plan.Step, archive: bytes,
                   progress: Callable[[str], None]) -> None:
    tmp = _tmp(dest.parent, dest.name)
    upper, work, merged = tmp / "upper", tmp / "work", tmp / "merged"
    log = tmp / "build.log"
    for d in (upper, work, merged):
        d.mkdir(parents=True)
    start = time.monotonic()
    progress("installing the project into the rehearsal root (ami/components/scaletrain.sh)")
    mounted = False
    try:
        run_tool(["mount", "-t", "overlay", "overlay", "-o",
              f"lowerdir={system / 'root'},upperdir={upper},workdir={work}", str(merged)],
             "mounting the build overlay", log=log)
        mounted = True
        shutil.copy2("/etc/resolv.conf", merged / "etc/resolv.conf")
        (merged / render.SOURCE_ZIP.lstrip("/")).write_bytes(archive)
        _install_scripts(merged, [step])
        with _build_mounts(merged, log, _pip_sources()):
            _chroot_step(merged, step, log)
        (merged / render.SOURCE_ZIP.lstrip("/")).unlink()
        (merged / BUILD_CA.lstrip("/")).unlink(missing_ok=True)
        _remove(merged / "root/.cache")
        (merged / "etc/resolv.conf").write_text("")
    finally:
        if mounted:
            subprocess.run(["umount", str(merged)], capture_output=True)
    try:
        _remove(work)
        _settle(tmp, dest)
    except BaseException:
        _remove(tmp)
        raise
    progress(f"project layer built in {time.monotonic() - start:.0f} s")
