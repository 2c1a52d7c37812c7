"""`launch run --requirements FILE`: a job's own dependencies on nodes that cannot reach a package index, as pure
decisions. The launcher resolves FILE on the user's machine for the nodes' Python and platform (pip download with
--platform, --python-version), refuses what would replace the image's own torch, Horovod or NumPy ABI, and sends the
wheels to the shared storage, each under its content's hash; the job makes one virtual environment per resolved set,
named by the set's hash, layered over the image's, and installs into it with ``pip install --no-index``.

Which Python and platform a node has comes from the one description of the image (ami/versions.json's Ubuntu
release, ami/paths.py's venv) or, on rehearsal nodes, from their root (launcher/plans/rehearsal.SUITE).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

# The CPython and glibc each distribution ships as its python3 and libc6:
# Ubuntu 22.04 (jammy): python3 3.10.6, libc6 2.35 (https://packages.ubuntu.com/jammy/python3,
# https://packages.ubuntu.com/jammy/libc6); Debian 12 (bookworm), the rehearsal root: python3 3.11.2, libc6 2.36
# (https://packages.debian.org/bookworm/python3, https://packages.debian.org/bookworm/libc6).
DISTROS = {"ubuntu 22.04": ("3.10", (2, 35)), "debian bookworm": ("3.11", (2, 36))}
ARCH = "x86_64"                      # every instance type in infra/catalog.py is x86-64, as is this image
# A NumPy built for 1.x and one built for 2.x are different ABIs: an extension compiled against one does not load
# against the other (https://numpy.org/doc/stable/dev/depending_on_numpy.html#numpy-2-0-specific-advice). The
# image's `train` extra asks numpy>=1.26,<3 (pyproject.toml) and pip takes the newest, a 2.x
# (tests/test_requirements.py holds this to pyproject.toml).
NUMPY_ABI = 2
PROTECTED = ("torch", "horovod")     # the image's builds (CUDA torch, Horovod with NCCL): never replaced, never sent
# torch's own CUDA libraries and compiler come with the image's torch (its wheel's Requires-Dist): never sent.
IMAGE_ONLY = re.compile(r"^(nvidia-.*|triton)$")
ENVS = "envs"                        # under the shared root (/fsx/scaletrain): one environment per resolved set
WHEELS = "wheels"                    # ... and every wheel under its sha256
READY = ".scaletrain-ready"          # written last into an environment: it is complete
LOCK_SUFFIX = ".lock"                # mkdir-atomic (POSIX mkdir(2) fails with EEXIST; so does SFTP's MKDIR)
LOCK_BEAT_S = 10                     # how often the node making an environment says it is still at it
LOCK_STALE_S = 120                   # a lock nobody has touched for this long was left by a node that is gone
WAIT_S = 1800                        # how long a rank waits for another node's environment at most


class RequirementsError(ValueError):
    """One line: what in the requirements was wrong, and what is allowed."""


@dataclass(frozen=True)
class NodePython:
    """The interpreter a job's processes run on the nodes, and what the image already holds."""

    python: str                      # "3.10"
    glibc: tuple[int, int]
    arch: str
    image: dict[str, str]            # canonical name -> the image's version (torch, horovod)
    numpy_abi: int = NUMPY_ABI

    def describe(self) -> str:
        return f"CPython {self.python} on manylinux_{self.glibc[0]}_{self.glibc[1]}_{self.arch}"

    def platforms(self) -> list[str]:
        """pip's --platform values: pip expands manylinux2014 to the older tags, but not a manylinux_2_N
        (pip/_internal/utils/compatibility_tags.py), so every perennial tag from 2_17 up to the node's glibc is named
        (PEP 600: a manylinux_x_y wheel runs on glibc >= x.y); linux_ARCH is a wheel built on such a machine, as a
        --find-links wheel of the user's own is."""
        major, minor = self.glibc
        perennial = [f"manylinux_{major}_{m}_{self.arch}" for m in range(minor, 16, -1)]
        return [*perennial, f"manylinux2014_{self.arch}", f"linux_{self.arch}"]


def node_python(distro: str, *, torch: str, horovod: str, arch: str = ARCH) -> NodePython:
    """The nodes' Python for a root of ``distro`` ("ubuntu 22.04": the image; "debian bookworm": rehearsal nodes)."""
    if distro not in DISTROS:
        raise RequirementsError(f"no Python known for nodes of {distro!r}; known: {', '.join(DISTROS)}")
    python, glibc = DISTROS[distro]
    return NodePython(python, glibc, arch, {"torch": torch, "horovod": horovod})


def parse(text: str, source: str) -> tuple[Requirement, ...]:
    """The requirements of a requirements file (one PEP 508 requirement a line; '#' starts a comment). Options
    (-r, -e, --index-url ...) are refused: the launcher's own options say where wheels come from."""
    found: list[Requirement] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        if not line:
            continue
        if line.startswith("-"):
            raise RequirementsError(f"{source}:{number}: {line.split()[0]} is not taken here; name one package a "
                                    f"line (pass wheel directories with --find-links DIR)")
        try:
            found.append(Requirement(line))
        except InvalidRequirement as e:
            raise RequirementsError(f"{source}:{number}: {line!r} is not a requirement ({str(e).splitlines()[0]}); "
                                    f"write e.g. 'einops==0.8.1'") from None
    if not found:
        raise RequirementsError(f"{source} names no package; write one requirement a line, e.g. 'einops==0.8.1'")
    return tuple(found)


def refused(requirements: tuple[Requirement, ...], node: NodePython) -> str | None:
    """Why a requirement would replace what the image holds (torch and Horovod exactly; NumPy's major version), or
    None. Nothing is resolved or sent for such a set."""
    for req in requirements:
        name = canonicalize_name(req.name)
        if name in node.image:
            have = node.image[name]
            if req.url or not req.specifier.contains(have, prereleases=True):
                return (f"{req} would replace the image's {name} {have}: leave {name} out of the requirements "
                        f"(the image's is used), or ask for {name}=={have}")
        elif name == "numpy" and (req.url or not any(req.specifier.contains(v) for v in _abi_versions(req, node))):
            return (f"{req} would replace the image's NumPy {node.numpy_abi}.x ABI, which its torch and every "
                    f"compiled package are built against: ask for numpy>={node.numpy_abi},<{node.numpy_abi + 1}")
    return None


def _abi_versions(req: Requirement, node: NodePython) -> list[str]:
    """Versions of the image's NumPy major to try a specifier with: every minor's first and a late micro, and any
    version the specifier itself names."""
    named = [s.version for s in req.specifier if not s.version.endswith("*")]
    return [*(f"{node.numpy_abi}.{minor}.{micro}" for minor in range(100) for micro in (0, 99)),
            *(v for v in named if Version(v).major == node.numpy_abi)]


def download_argv(python: str, requirements_file: str, dest: str, node: NodePython,
                  find_links: tuple[str, ...] = ()) -> list[str]:
    """pip download on the user's machine: wheels only, for the nodes' interpreter and platform, through whatever
    index the user's pip is configured for (https://pip.pypa.io/en/stable/cli/pip_download/, "--platform",
    "--python-version", "--implementation": with them, --only-binary=:all: is required)."""
    argv = [python, "-m", "pip", "download", "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", node.python, "--implementation", "cp", "--dest", dest, "-r", requirements_file]
    for platform in node.platforms():
        argv += ["--platform", platform]
    for folder in find_links:
        argv += ["--find-links", folder]
    return argv


def pip_failure(output: str, node: NodePython) -> str:
    """One line for what pip download printed when it failed."""
    missing = re.findall(r"No matching distribution found for (\S+)", output)
    if missing:
        name = missing[-1]
        return (f"no wheel of {name} for the nodes ({node.describe()}), and nodes cannot build one (they have no "
                f"internet): build it yourself (`pip wheel {name} -w DIR` on such a machine) and pass "
                f"--find-links DIR")
    errors = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("ERROR:")]
    last = errors[-1] if errors else (output.strip().splitlines() or ["(no output)"])[-1]
    return f"resolving the requirements for the nodes ({node.describe()}) failed: {last}"


@dataclass(frozen=True)
class Wheel:
    filename: str
    sha256: str
    size: int

    def path(self, shared_root: str) -> str:
        """Where it lives on the shared storage: under its content's hash, so a wheel is sent once."""
        return f"{shared_root}/{WHEELS}/{self.sha256}/{self.filename}"


def resolved(wheels: list[Wheel], node: NodePython) -> tuple[list[Wheel], str | None]:
    """(the wheels to send and install, why the set is refused or None). A wheel of the image's torch or Horovod at
    the image's version, and torch's CUDA libraries, stay out: the image's are used. Any other version of them, or
    a NumPy of another major version, is refused."""
    keep: list[Wheel] = []
    for wheel in wheels:
        try:
            name, version, _, _ = parse_wheel_filename(wheel.filename)
        except InvalidWheelFilename:
            return [], f"{wheel.filename} is not a wheel's file name (PEP 427: NAME-VERSION-PYTHON-ABI-PLATFORM.whl)"
        if name in node.image:
            have = node.image[name]
            if Version(have).public != version.public:
                return [], (f"the requirements need {name} {version}, which would replace the image's {name} {have}: "
                            f"pin what depends on it to a release that works with {name} {have}")
            continue
        if name == "numpy" and version.major != node.numpy_abi:
            return [], (f"the requirements need numpy {version}, which would replace the image's NumPy "
                        f"{node.numpy_abi}.x ABI: pin what depends on it to a release built for NumPy "
                        f"{node.numpy_abi}")
        if IMAGE_ONLY.match(name):
            continue
        keep.append(wheel)
    return sorted(keep, key=lambda w: w.filename), None


def set_hash(wheels: list[Wheel], node: NodePython) -> str:
    """The name of a resolved set's environment: the interpreter it is for and every wheel's content."""
    h = hashlib.sha256(f"{node.python} {node.arch}\n".encode())
    for wheel in sorted(wheels, key=lambda w: w.filename):
        h.update(f"{wheel.filename} {wheel.sha256}\n".encode())
    return h.hexdigest()[:16]


def env_path(shared_root: str, digest: str) -> str:
    return f"{shared_root}/{ENVS}/{digest}"


def set_document(wheels: list[Wheel], node: NodePython, shared_root: str) -> dict:
    """What the job reads to make (or find) its environment: ``ENV.json`` beside the environment ENV."""
    digest = set_hash(wheels, node)
    pins = []
    for w in wheels:
        name, version, _, _ = parse_wheel_filename(w.filename)
        pins.append(f"{name}=={version}")
    return {"hash": digest, "env": env_path(shared_root, digest), "python": node.python, "pins": pins,
            "wheels": [w.path(shared_root) for w in wheels]}


def set_document_path(document: dict) -> str:
    return f"{document['env']}.json"


def read_set(text: str) -> dict:
    doc = json.loads(text)
    for key in ("hash", "env", "pins", "wheels"):
        if key not in doc:
            raise ValueError(f"the requirements set has no {key!r}")
    return doc


def layer_pth(image_site_packages: list[str]) -> str:
    """The .pth file that puts the image's venv under the job's environment: a venv's --system-site-packages is its
    base interpreter's (/usr/lib/python3), not the venv it was made from (https://docs.python.org/3/library/venv.html;
    site: "a path configuration file ... lines are added to sys.path", https://docs.python.org/3/library/site.html),
    so torch, Horovod and NCCL come from the image's venv, after the environment's own packages."""
    return "".join(f"{p}\n" for p in image_site_packages)


def venv_argv(python: str, env: str) -> list[str]:
    """The environment, over the image's (``--without-pip``: the image's pip installs into it through the .pth).
    ``--copies``: the interpreter is copied, not linked to the node's /usr/bin, whose absolute link a network file
    system's server resolves in its own tree (OpenSSH's chrooted sftp-server refuses to read it, so the rehearsal
    nodes' sshfs cannot run a linked venv; https://docs.python.org/3/library/venv.html, "--copies")."""
    return [python, "-m", "venv", "--system-site-packages", "--without-pip", "--copies", env]


def install_argv(env: str, document: dict, pins_file: str) -> list[str]:
    """pip install with no index: only the wheels the launcher sent (https://pip.pypa.io/en/stable/cli/pip_install/,
    "--no-index", "--find-links"); what the image has already satisfies the rest."""
    argv = [f"{env}/bin/python", "-m", "pip", "install", "--disable-pip-version-check", "--no-index",
            "--no-warn-script-location", "--quiet"]
    for folder in sorted({str(PurePosixPath(w).parent) for w in document["wheels"]}):
        argv += ["--find-links", folder]
    return [*argv, "-r", pins_file]


def workdir_notice(has_requirements_txt: bool, asked: bool, declined: bool) -> str | None:
    """What `launch run` says when the working directory holds a requirements.txt that no option names."""
    if not has_requirements_txt or asked or declined:
        return None
    return ("note: requirements.txt in the working directory is not installed on the nodes (they have no "
            "internet); pass --requirements requirements.txt to install it, or --no-requirements to say you mean it")
