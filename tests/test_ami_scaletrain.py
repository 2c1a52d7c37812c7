"""ami/components/scaletrain.sh run for real (issue 14, item 5): its build phase against a venv that holds what the
image's pytorch and horovod components leave there (torch, horovod and their dependencies, nothing else), with
the source archive made from this working tree as the CDK asset is, then its validate phase: the trainer must
import, and torch and horovod must still be the ones installed before.

The venv's torch and horovod are this project's own (.venv), seen through a .pth file: pip treats them as installed
and can neither replace nor remove them (they lie outside the venv), so a script that tried to would fail here.
The rest of the `train` extra comes from the package index, as on the build instance."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from importlib.metadata import Distribution, PackageNotFoundError, distribution
from pathlib import Path

import pytest
from imagesandbox import sandbox
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ami/ is a CDK app beside the package
    sys.path.insert(0, str(ROOT))

from ami import paths, render  # noqa: E402

pytest.importorskip("horovod.torch", reason="the trainer's Horovod (make setup builds it)")

SCRIPT = ROOT / "ami" / "components" / "scaletrain.sh"
# What the CDK asset leaves out of the source archive (ami/stack.py SOURCE_EXCLUDE), as far as it concerns files
# git knows.
NOT_IN_SOURCE = ("tests/", "docs/", "bench/", ".ci/")


def installed_closure(names: list[str]) -> list[Distribution]:
    """``names`` and everything they require, as installed here."""
    seen: dict[str, Distribution] = {}
    todo = list(names)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        try:
            dist = seen[name] = distribution(name)
        except PackageNotFoundError:
            continue  # an optional requirement this environment does without, as the image would
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def source_archive(path: Path) -> None:
    """The project's source as the image downloads it: this working tree's files, tests and docs left out."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in files:
            if name and not name.startswith(NOT_IN_SOURCE) and (ROOT / name).is_file():
                z.write(ROOT / name, name)


def venv_python(venv: Path, code: str) -> subprocess.CompletedProcess:
    # From the venv's directory: a `python -c` in this checkout would import launcher/ from it.
    return subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True, text=True, timeout=120,
                          env=clean_env(), cwd=venv)


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("image")
    # What pytorch.sh and horovod.sh leave: torch, horovod and their requirements, seen by the venv through a .pth.
    preinstalled = root / "preinstalled"
    preinstalled.mkdir()
    for dist in installed_closure(["torch", "horovod"]):
        site = Path(str(dist.locate_file("")))
        for top in {Path(f).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            if not (preinstalled / top).exists() and (site / top).exists():
                (preinstalled / top).symlink_to(site / top)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300, env=clean_env())
    site_packages = Path(venv_python(venv, "import sysconfig; print(sysconfig.get_paths()['purelib'])").stdout.strip())
    (site_packages / "zz-image.pth").write_text(f"{preinstalled}\n")
    source_archive(root / "source.zip")
    env = {**clean_env(), **render.component_env(
        render.load_versions(), next(c for c in render.COMPONENTS if c.key == "scaletrain")),
        "SCALETRAIN_VENV": str(venv), "SCALETRAIN_SRC": str(root / "src"),
        "SCALETRAIN_SOURCE_ZIP": str(root / "source.zip"),
        "SCALETRAIN_PROFILE": str(root / "etc" / "profile.d" / "scaletrain.sh")}
    before = venv_python(venv, "import torch, horovod; print(torch.__version__, torch.__file__, horovod.__file__); "
                               "import simplejpeg")
    # Image Builder runs the component in the recipe's working directory, /opt/scaletrain; here the image's root.
    build = subprocess.run([*sandbox(root), "bash", str(SCRIPT), "build"], env=env, capture_output=True, text=True,
                           timeout=1200, cwd=root)
    return {"root": root, "venv": venv, "site": site_packages, "preinstalled": preinstalled, "env": env,
            "before": before, "build": build}


def test_the_fake_image_is_what_the_earlier_components_leave(image) -> None:
    """torch and horovod import in the venv; the train extra's own packages and scaletrain are not there yet."""
    before = image["before"]
    assert f"{image['preinstalled']}/torch/" in before.stdout
    assert "No module named 'simplejpeg'" in before.stderr


def test_build_installs_the_train_extra_so_the_trainer_imports(image) -> None:
    build = image["build"]
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    # Even from a checkout, the venv's own install is what counts.
    validate = subprocess.run([*sandbox(image["root"]), "bash", str(SCRIPT), "validate"], env=image["env"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert validate.returncode == 0, validate.stderr
    imported = venv_python(image["venv"], "import simplejpeg, training.train, launcher; print(launcher.__file__)")
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith(str(image["site"]))  # installed from the archive, not this checkout


def test_build_keeps_the_torch_and_horovod_the_image_built(image) -> None:
    assert image["build"].returncode == 0, image["build"].stderr[-3000:]
    after = venv_python(image["venv"], "import torch, horovod; print(torch.__version__, torch.__file__, "
                                       "horovod.__file__)")
    assert after.stdout == image["before"].stdout
    assert not list(image["site"].glob("torch*")) and not list(image["site"].glob("horovod*"))


def test_build_writes_the_login_profile_from_ami_paths(image) -> None:
    assert image["build"].returncode == 0, image["build"].stderr[-3000:]
    profile = Path(image["env"]["SCALETRAIN_PROFILE"]).read_text()
    assert profile == (f'export PATH="{":".join(paths.BIN_PATH)}:$PATH"\n'
                       f'export LD_LIBRARY_PATH="{":".join(paths.LIB_PATH)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"\n')
    # A login shell gets exactly what the launcher's non-login commands put first (ami.paths.path_export).
    login = subprocess.run(["bash", "-c", f'. "{image["env"]["SCALETRAIN_PROFILE"]}"; echo "$PATH"'],
                           capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, timeout=30)
    assert login.stdout.strip() == ":".join(paths.BIN_PATH) + ":/usr/bin:/bin"
