"""Where things live on the training image: the one description the image recipe, the launcher's plans and the
rehearsal nodes all read. Pure constants; importing this module touches nothing.

Nothing here may rely on a login shell. ``launch`` reaches nodes with non-interactive, non-login SSH commands,
which read neither ``/etc/profile`` nor ``/etc/profile.d/*`` (bash(1), INVOCATION: a non-interactive shell reads
only ``$BASH_ENV``; sshd(8) runs the command with the user's shell and ``-c``). So every program the launcher
runs on a node is named by its absolute path from here, and ``mpirun`` gets ``--prefix`` so that the remote
``orted`` is found the same way (Open MPI FAQ, "Running MPI jobs", ``--prefix``: "sets PATH and
LD_LIBRARY_PATH on the remote node before invoking orted").

Paths of vendor software are where its installer puts it:
- the EFA installer: libfabric in ``/opt/amazon/efa``, Open MPI in ``/opt/amazon/openmpi``
  (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html, "Install the EFA software");
- aws-ofi-nccl built with ``--prefix=/opt/amazon/ofi-nccl``, where the EFA installer's own copy sits (that copy is
  purged: the image carries the one plugin ami/versions.json pins, ami/components/aws-ofi-nccl.sh);
- CUDA's toolkit at ``/usr/local/cuda`` (NVIDIA CUDA Installation Guide for Linux, "Post-installation Actions");
- AWS CLI v2 at ``/usr/local/bin/aws``, the installer's default ``--bin-dir``
  (https://docs.aws.amazon.com/cli/latest/userguide/getting-started-install.html).
"""

from __future__ import annotations

ROOT = "/opt/scaletrain"
VENV = f"{ROOT}/venv"                      # the trainer's virtual environment, with the `train` extra
PYTHON = f"{VENV}/bin/python"
SOURCE = f"{ROOT}/src"                     # the project's source the image installed from
SCRIPT_DIR = f"{ROOT}/ami"                 # the component scripts, as Image Builder installs them

MPI_PREFIX = "/opt/amazon/openmpi"         # Open MPI from the EFA installer
MPIRUN = f"{MPI_PREFIX}/bin/mpirun"
EFA_PREFIX = "/opt/amazon/efa"             # libfabric and fi_info
FI_INFO = f"{EFA_PREFIX}/bin/fi_info"
OFI_NCCL_PREFIX = "/opt/amazon/ofi-nccl"   # aws-ofi-nccl, the NCCL net plugin for EFA
CUDA_HOME = "/usr/local/cuda"
NCCL_TESTS_ROOT = "/opt/nccl-tests"        # nccl-tests' checkout, built in place
NCCL_TESTS = f"{NCCL_TESTS_ROOT}/build"
AWS_CLI = "/usr/local/bin/aws"             # AWS CLI v2

IMAGE_ENV_FILE = "/etc/scaletrain/image.env"   # every pinned version, as the image was built
KERNEL_CC_FILE = "/etc/scaletrain/kernel-cc"   # the compiler the held kernel was built with (gcc-12), base.sh's
PROFILE_FILE = "/etc/profile.d/scaletrain.sh"  # PATH for people who log in; the launcher never relies on it

# PATH and LD_LIBRARY_PATH for a login shell on the image (written to PROFILE_FILE) and for the launcher's own
# remote commands that need more than one of the image's tools.
BIN_PATH = (f"{VENV}/bin", f"{MPI_PREFIX}/bin", f"{EFA_PREFIX}/bin", f"{CUDA_HOME}/bin")
LIB_PATH = (f"{OFI_NCCL_PREFIX}/lib", f"{EFA_PREFIX}/lib", f"{MPI_PREFIX}/lib", f"{CUDA_HOME}/lib64")


def shell_env() -> dict[str, str]:
    """The variables the image's scripts read for its paths (ami/render.py exports them to every component)."""
    return {
        "SCALETRAIN_VENV": VENV,
        "SCALETRAIN_SRC": SOURCE,
        "SCALETRAIN_MPI_PREFIX": MPI_PREFIX,
        "SCALETRAIN_EFA_PREFIX": EFA_PREFIX,
        "SCALETRAIN_OFI_NCCL_PREFIX": OFI_NCCL_PREFIX,
        "SCALETRAIN_AWS_CLI": AWS_CLI,
        "SCALETRAIN_PROFILE": PROFILE_FILE,
        "SCALETRAIN_CUDA_HOME": CUDA_HOME,
        "SCALETRAIN_NCCL_TESTS_ROOT": NCCL_TESTS_ROOT,
        "SCALETRAIN_IMAGE_ENV_FILE": IMAGE_ENV_FILE,
        "SCALETRAIN_KERNEL_CC_FILE": KERNEL_CC_FILE,
        "SCALETRAIN_BIN_PATH": ":".join(BIN_PATH),
        "SCALETRAIN_LIB_PATH": ":".join(LIB_PATH),
    }


def path_export() -> str:
    """A shell prefix that puts the image's tools on PATH for one remote command (non-login shells lack them)."""
    return (f'export PATH="{":".join(BIN_PATH)}:$PATH" '
            f'LD_LIBRARY_PATH="{":".join(LIB_PATH)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"; ')

# Where the image pipeline publishes the id of the newest image it built, and where the cluster stack resolves
# its default image at deploy time (an SSM String parameter of data type aws:ec2:image:
# https://docs.aws.amazon.com/systems-manager/latest/userguide/parameter-store-ec2-aliases.html).
IMAGE_ID_PARAMETER = "/scaletrain/image/ami-id"
# The image built with NVIDIA's proprietary kernel modules publishes to its own parameter. V100 GPUs (p3, p3dn) need
# those modules: the open ones drive Turing and newer only (https://github.com/NVIDIA/open-gpu-kernel-modules,
# "Supported GPUs"), so a V100 cluster resolves this one and never an image whose driver cannot load on it.
IMAGE_ID_PARAMETER_PROPRIETARY = "/scaletrain/image-proprietary/ami-id"


def image_id_parameter(nvidia_kernel_modules: str) -> str:
    """Where an image built with ``nvidia_kernel_modules`` (open or proprietary) is published."""
    return IMAGE_ID_PARAMETER_PROPRIETARY if nvidia_kernel_modules == "proprietary" else IMAGE_ID_PARAMETER
