"""Pure rendering of the image: versions file -> Image Builder component documents, AMI tags, the docs table.

``ami/versions.json`` is the one place a version is pinned. Each script in ``ami/components/`` reads what it
needs from environment variables (``: "${NAME:?...}"``); :func:`component_env` maps the versions file to those
variables, and :func:`render_component` writes the AWSTOE document (``schemaVersion: 1.0``) that installs the
script at ``/opt/scaletrain/ami/`` and runs it in the ``build`` phase, again in ``validate``, and, for the image
test, in ``test``. The AMI carries the versions as ``scaletrain:*`` tags (:func:`ami_tags`), which
:func:`software_versions` turns back into what ``launcher.plans.efa.fabric_env`` needs.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from jinja2 import Environment, FileSystemLoader, StrictUndefined
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ami import paths
from launcher.plans.efa import SoftwareVersions, versions_of

HERE = Path(__file__).resolve().parent
VERSIONS_FILE = HERE / "versions.json"
COMPONENTS_DIR = HERE / "components"
SCRIPT_DIR = paths.SCRIPT_DIR
VENV = paths.VENV
SOURCE_ZIP = "/tmp/scaletrain-src.zip"
# The project's source archive: what `pip install` needs on the image, nothing the user built locally (ami/stack.py
# uploads it; the rehearsal nodes install the same).
SOURCE_EXCLUDE = [".git", ".venv", "node_modules", "cdk.out", "**/cdk.out", "runs", "reports", "*.egg-info",
                  "**/__pycache__", "tests", "docs", "bench", ".ci", "*.pyc", ".pytest_cache",
                  ".ruff_cache", ".whl"]
TAG_PREFIX = "scaletrain:"
COMPONENT_DATA_LIMIT = 16_000  # AWS::ImageBuilder::Component Data: at most 16,000 characters inline

BaseName = Literal["ubuntu", "dlami"]
BASES: tuple[str, ...] = ("ubuntu", "dlami")


class Base(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    ssm_parameter: str = Field(pattern=r"^/aws/service/")
    has_nvidia_driver: bool


_VERSION = r"^[0-9][0-9A-Za-z.+~-]*$"


class Versions(BaseModel):
    """ami/versions.json, validated."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    comment: str = Field(alias="_comment")
    image_version: str = Field(pattern=r"^[0-9]+\.[0-9]+$")
    nvidia_driver: str = Field(pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$")
    nvidia_fabricmanager: str = Field(pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?-[0-9A-Za-z.+~]+$")
    cuda: str = Field(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")
    cuda_apt_package: str = Field(pattern=r"^cuda-toolkit-[0-9]+-[0-9]+$")
    nccl: str = Field(pattern=_VERSION)
    nccl_cuda_tag: str = Field(pattern=r"^cuda[0-9]+\.[0-9]+$")
    nccl_tests: str = Field(pattern=_VERSION)
    efa_installer: str = Field(pattern=_VERSION)
    libfabric: str = Field(pattern=_VERSION)
    openmpi: str = Field(pattern=_VERSION)
    aws_ofi_nccl: str = Field(pattern=_VERSION)
    torch: str = Field(pattern=_VERSION)
    torch_index: str = Field(pattern=r"^https://.*/cu[0-9]+$")
    torch_arch_list: str = Field(pattern=r"^(sm|compute)_[0-9]+[af]?( (sm|compute)_[0-9]+[af]?)*$")
    horovod: str = Field(pattern=_VERSION)
    beegfs: str = Field(pattern=_VERSION)
    lustre_client: str = Field(pattern=r"^[0-9]+\.[0-9]+$")
    aws_cli: str = Field(pattern=r"^2\.[0-9]+\.[0-9]+$")
    slurm: str = Field(pattern=r"^2[2-9]\.[0-9]{2}\.[0-9]+$")  # dynamic nodes (slurmd -Z): 22.05 and later
    ubuntu: Literal["22.04"]
    bases: dict[BaseName, Base]

    @model_validator(mode="after")
    def _fabric_manager_is_the_drivers(self) -> Versions:
        # Fabric Manager starts only against a driver of exactly its own version (NVIDIA Fabric Manager User Guide,
        # https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html: the service "checks the
        # currently loaded kernel driver stack version for compatibility ... and aborts" otherwise). The pin is
        # the driver's version plus the Debian revision of NVIDIA's CUDA repository (570.172.08-1).
        if self.nvidia_fabricmanager.rpartition("-")[0] != self.nvidia_driver:
            raise ValueError(f"nvidia_fabricmanager {self.nvidia_fabricmanager} is not the driver's version "
                             f"{self.nvidia_driver} plus a package revision (e.g. {self.nvidia_driver}-1)")
        return self


def load_versions(path: Path = VERSIONS_FILE) -> Versions:
    return Versions.model_validate(json.loads(Path(path).read_text()))


@dataclass(frozen=True)
class Component:
    """One Image Builder component: a script in ami/components/ and the phases it runs in."""

    key: str                                  # short name; the component is scaletrain-<key>
    description: str
    phases: tuple[str, ...] = ("build", "validate")
    needs_driver_install: bool = False        # left out on a base that ships the NVIDIA driver
    downloads_source: bool = False            # fetch the project's source archive first

    @property
    def script(self) -> str:
        return f"{self.key}.sh"

    @property
    def name(self) -> str:
        return f"scaletrain-{self.key}"


# In recipe order.
COMPONENTS: tuple[Component, ...] = (
    Component("base", "Base packages, the kernel held, /etc/scaletrain/image.env"),
    Component("aws-cli", "AWS CLI v2 from AWS's signed installer, at /usr/local/bin/aws"),
    Component("nvidia", "NVIDIA driver (DKMS) and CUDA toolkit", needs_driver_install=True),
    Component("fabricmanager", "NVIDIA Fabric Manager at the driver's version, enabled (NVSwitch hosts)"),
    Component("efa", "EFA installer: EFA module, libfabric, Open MPI under /opt/amazon"),
    Component("nccl", "NCCL and nccl-tests"),
    Component("aws-ofi-nccl", "aws-ofi-nccl NCCL net plugin for EFA, in /opt/amazon/ofi-nccl: the only one on the "
              "image (the EFA installer's own is purged)"),
    Component("pytorch", "PyTorch (CUDA build) in the training venv"),
    Component("horovod", "Horovod from its sdist with NCCL and MPI, C++17 fix"),
    Component("beegfs", "BeeGFS management, metadata, storage and client"),
    Component("lustre", "Lustre client for FSx for Lustre"),
    Component("slurm", "Slurm (built from SchedMD's source: Ubuntu 22.04's 21.08 has no dynamic nodes) and munge; "
              "rehearsal nodes take Debian's 22.05.8"),
    Component("scaletrain", "scaletrain with its train extra in the training venv; PATH for logins",
              downloads_source=True),
    Component("image-test", "Test: GPUs, Fabric Manager on NVSwitch hosts, EFA provider, Horovod with NCCL, "
              "PyTorch kernels for every GPU the build is for, one-node NCCL allreduce", phases=("test",)),
)


def components_for(versions: Versions, base: str) -> list[Component]:
    """The recipe's components for ``base``: the driver component only where the base has no driver."""
    has_driver = base_info(versions, base).has_nvidia_driver
    return [c for c in COMPONENTS if not (c.needs_driver_install and has_driver)]


def base_info(versions: Versions, base: str) -> Base:
    """A named base, or an AMI id: an AMI id is taken to carry no driver (the driver component installs one)."""
    if base in versions.bases:
        return versions.bases[base]  # type: ignore[index]
    if re.fullmatch(r"ami-[0-9a-f]{8,17}", base):
        return Base(ssm_parameter="/aws/service/none", has_nvidia_driver=False)
    raise ValueError(f"base={base!r}: choose one of {', '.join(BASES)}, or an AMI id (ami-...)")


def parent_image(versions: Versions, base: str) -> str:
    """The recipe's parentImage: ``ssm:<public parameter>`` (resolved by Image Builder at build time) or the id."""
    info = base_info(versions, base)
    return base if base.startswith("ami-") else f"ssm:{info.ssm_parameter}"


def image_env(versions: Versions, base: str = "ubuntu") -> dict[str, str]:
    """Every pinned version, and every path of ami/paths.py, as the variable the scripts read (the image records
    them in /etc/scaletrain/image.env)."""
    return {
        "SCALETRAIN_IMAGE_VERSION": versions.image_version,
        "SCALETRAIN_BASE": base,
        "SCALETRAIN_BASE_HAS_DRIVER": str(base_info(versions, base).has_nvidia_driver).lower(),
        "NVIDIA_DRIVER_VERSION": versions.nvidia_driver,
        "NVIDIA_FABRICMANAGER_VERSION": versions.nvidia_fabricmanager,
        "CUDA_VERSION": versions.cuda,
        "CUDA_APT_PACKAGE": versions.cuda_apt_package,
        "NCCL_VERSION": versions.nccl,
        "NCCL_CUDA_TAG": versions.nccl_cuda_tag,
        "NCCL_TESTS_VERSION": versions.nccl_tests,
        "EFA_INSTALLER_VERSION": versions.efa_installer,
        "LIBFABRIC_VERSION": versions.libfabric,
        "OPENMPI_VERSION": versions.openmpi,
        "AWS_OFI_NCCL_VERSION": versions.aws_ofi_nccl,
        "TORCH_VERSION": versions.torch,
        "TORCH_INDEX": versions.torch_index,
        "HOROVOD_VERSION": versions.horovod,
        "BEEGFS_VERSION": versions.beegfs,
        "LUSTRE_CLIENT_VERSION": versions.lustre_client,
        "SLURM_VERSION": versions.slurm,
        "AWS_CLI_VERSION": versions.aws_cli,
    } | paths.shell_env()


def script_variables(script_text: str) -> list[str]:
    """The variables a component script requires (its ``: "${NAME:?...}"`` lines), in order."""
    return re.findall(r'^: "\$\{([A-Z_][A-Z0-9_]*):\?', script_text, flags=re.MULTILINE)


def gpu_capabilities(kernel_module_type: str) -> list[str]:
    """The compute capabilities of the catalog's GPU types that boot the build with ``kernel_module_type``: V100 types
    (proprietary) resolve that build, every other GPU type the open one (infra.spec.ClusterSpec.image_parameter). The
    image test checks that the image's PyTorch has kernels for each (launcher/doctor/torchprobe.py)."""
    from infra import catalog

    proprietary = kernel_module_type == "proprietary"
    found = {t.compute_capability for t in catalog.gpu_types() if t.needs_proprietary_driver == proprietary}
    return [f"{major}.{minor}" for major, minor in sorted(c for c in found if c is not None)]


def component_env(versions: Versions, component: Component, *, base: str = "ubuntu",
                  kernel_module_type: str = "open") -> dict[str, str]:
    """Exactly the variables ``component``'s script requires, with their values."""
    script_text = (COMPONENTS_DIR / component.script).read_text()
    recorded = image_env(versions, base)
    available = recorded | {
        "NVIDIA_KERNEL_MODULE_TYPE": kernel_module_type,
        "SCALETRAIN_GPU_CAPABILITIES": " ".join(gpu_capabilities(kernel_module_type)),
        "SCALETRAIN_SOURCE_ZIP": SOURCE_ZIP,
        "SCALETRAIN_IMAGE_ENV": "".join(f"{k}={v}\n" for k, v in recorded.items()).rstrip("\n"),
    }
    needed = script_variables(script_text)
    missing = [name for name in needed if name not in available]
    if missing:
        raise ValueError(f"{component.script} reads {', '.join(missing)}, which ami/render.py does not provide")
    return {name: available[name] for name in needed}


_env = Environment(loader=FileSystemLoader(HERE / "templates"), undefined=StrictUndefined, keep_trailing_newline=True,
                   trim_blocks=True, lstrip_blocks=True)


def render_component(versions: Versions, component: Component, *, base: str = "ubuntu",
                     source_url: str | None = None, kernel_module_type: str = "open") -> str:
    """The AWSTOE document for ``component``. ``source_url``: the s3:// URL of the project's source archive."""
    env = component_env(versions, component, base=base, kernel_module_type=kernel_module_type)
    pre_steps = []
    if component.downloads_source:
        if not source_url:
            raise ValueError(f"{component.name} needs the source archive's s3:// URL")
        pre_steps.append({"name": "DownloadSource", "action": "S3Download", "source": source_url,
                          "destination": SOURCE_ZIP})
    exports = "set -euo pipefail\n" + "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
    return _env.get_template("component.yaml.j2").render(
        name=component.name, description=component.description, script=component.script, env=env,
        phases=component.phases, pre_steps=pre_steps, path=f"{SCRIPT_DIR}/{component.script}",
        body=(COMPONENTS_DIR / component.script).read_text(), exports=exports.rstrip("\n"))


def semantic_version(image_version: str, *parts: str) -> str:
    """``MAJOR.MINOR.PATCH`` with PATCH from a hash of ``parts``: Image Builder refuses to change a component or
    recipe under an existing version, so new content gets a new version and the same content keeps its own."""
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()
    return f"{image_version}.{int(digest[:8], 16) % 1_000_000}"


def ami_tags(versions: Versions, base: str) -> dict[str, str]:
    """The tags the image carries: every version it was built with (``from-base`` where the base supplied it)."""
    from_base = base_info(versions, base).has_nvidia_driver
    tags = {
        "image-version": versions.image_version,
        "base": base,
        "nvidia-driver": "from-base" if from_base else versions.nvidia_driver,
        "nvidia-fabricmanager": "from-base" if from_base else versions.nvidia_fabricmanager,
        "cuda": "from-base" if from_base else versions.cuda,
        "nccl": versions.nccl,
        "efa-installer": versions.efa_installer,
        "libfabric": versions.libfabric,
        "openmpi": versions.openmpi,
        "aws-ofi-nccl": versions.aws_ofi_nccl,
        "torch": versions.torch,
        "horovod": versions.horovod,
        "beegfs": versions.beegfs,
        "lustre-client": versions.lustre_client,
        "slurm": versions.slurm,
        "aws-cli": versions.aws_cli,
    }
    return {f"{TAG_PREFIX}{k}": v for k, v in tags.items()}


def software_versions(tags: dict[str, str]) -> SoftwareVersions:
    """What an AMI's tags say about the software that decides the EFA/NCCL environment (launcher.plans.efa)."""
    return versions_of({k.removeprefix(TAG_PREFIX): v for k, v in tags.items() if k.startswith(TAG_PREFIX)})


def components_table() -> str:
    """The Markdown table of components, in recipe order, that ami/README.md carries (checked by the tests)."""
    def notes(c: Component) -> str:
        return ((" (left out on a base with a driver)" if c.needs_driver_install else "")
                + (" (test phase)" if c.phases == ("test",) else ""))
    return "| component | what it installs |\n| --- | --- |\n" + "".join(
        f"| `{c.script}` | {c.description}{notes(c)} |\n" for c in COMPONENTS)


def versions_table(versions: Versions) -> str:
    """The Markdown table of pinned versions that ami/README.md carries (checked by the tests)."""
    rows = [(k, v) for k, v in versions.model_dump(exclude={"comment", "bases"}).items()]
    rows += [(f"base `{name}`", f"`{b.ssm_parameter}`") for name, b in versions.bases.items()]
    return "| what | version |\n| --- | --- |\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)
