"""V100 nodes could not run the image's PyTorch (issue 37 item 1): torch 2.7.1 from the cu128 index has no sm_70
kernels, so every kernel failed with "no kernel image is available" on p3 and p3dn while the image test (on a g5) and
`launch doctor` passed. The decision, an arch list against a compute capability, at its boundaries; the pin against
the catalog's GPUs; the doctor's and the image test's use of it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # ami/ is a CDK app beside the package
    sys.path.insert(0, str(ROOT))

from ami import render  # noqa: E402
from infra import catalog  # noqa: E402
from launcher.doctor import checks, gpuarch  # noqa: E402
from launcher.doctor.gpuarch import Arch, check_torch_arch, parse_arch, serving_entry  # noqa: E402
from launcher.doctor.probes import Probe  # noqa: E402

VERSIONS = render.load_versions()
# torch.cuda.get_arch_list() of PyTorch's x86_64 wheels per (release, index): TORCH_CUDA_ARCH_LIST of
# .ci/manywheel/build_cuda.sh, as RELEASE.md's "PyTorch CUDA Support Matrix" and torch.cuda's PYTORCH_RELEASES_CODE_CC
# list them. 2.7's cu128 dropped Volta (pytorch/pytorch#147607); 2.8 to 2.10 brought it back (#157968, #160269) and
# 2.11 drops it again (#172352), while cu126 keeps Maxwell to Hopper throughout.
CU126 = "sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90"
PUBLISHED = {
    ("2.7", "cu126"): CU126,
    ("2.7", "cu128"): "sm_75 sm_80 sm_86 sm_90 sm_100 sm_120 compute_120",
}


# --- an arch list entry against a compute capability ----------------------------------------------------------------

@pytest.mark.parametrize(("entry", "arch"), [
    ("sm_70", Arch("sm", 7, 0, "")), ("sm_86", Arch("sm", 8, 6, "")), ("compute_70", Arch("compute", 7, 0, "")),
    ("sm_90a", Arch("sm", 9, 0, "a")), ("sm_100f", Arch("sm", 10, 0, "f")), ("compute_120", Arch("compute", 12, 0, "")),
    ("sm70", None), ("sm_", None), ("gfx90a", None), ("sm_90x", None),
])  # fmt: skip
def test_entries_parse_into_kind_major_minor_and_suffix(entry, arch):
    assert parse_arch(entry) == arch


@pytest.mark.parametrize(("arch_list", "capability", "served_by"), [
    ("sm_70 sm_75", (7, 0), "sm_70"),                  # sm_70 present: the V100 runs it
    ("sm_75 sm_80 sm_86 sm_90", (7, 0), None),         # absent, as in 2.7's cu128 wheels: nothing runs
    ("sm_75", (7, 0), None),                           # a cubin never runs below its own minor
    ("sm_70", (7, 5), "sm_70"),                        # ... and runs on every later minor of its major
    ("sm_80", (8, 6), "sm_80"), ("sm_86", (8, 0), None),
    ("compute_70", (7, 0), "compute_70"),              # PTX only: JIT-compiled for 7.0 ...
    ("compute_70", (9, 0), "compute_70"),              # ... and for any later capability
    ("compute_75", (7, 0), None),                      # but never for an earlier one
    ("sm_70 compute_70", (7, 0), "sm_70"),             # a cubin is chosen before PTX
    ("sm_90", (9, 0), "sm_90"), ("sm_90a", (9, 0), "sm_90a"),
    ("sm_90", (9, 1), "sm_90"), ("sm_90a", (9, 1), None),    # architecture-specific: 9.0 exactly
    ("sm_90", (10, 0), None), ("compute_90", (10, 0), "compute_90"), ("compute_90a", (10, 0), None),
    ("sm_100f", (10, 3), "sm_100f"), ("sm_100a", (10, 3), None),    # family-specific: the same major
    ("", (7, 0), None),
])  # fmt: skip
def test_an_arch_list_serves_a_capability_by_cuda_s_compatibility_rules(arch_list, capability, served_by):
    assert serving_entry(arch_list.split(), capability) == served_by


# --- the pin, against the catalog's GPUs -----------------------------------------------------------------------------

def test_every_gpu_of_the_catalog_has_its_compute_capability():
    assert {t.gpu_model: t.compute_capability for t in catalog.gpu_types()} == {
        "V100": (7, 0), "V100-32GB": (7, 0), "A100-40GB": (8, 0), "A100-80GB": (8, 0), "H100": (9, 0),
        "H200": (9, 0), "A10G": (8, 6)}
    assert catalog.get("c5n.18xlarge").compute_capability is None


def test_the_pinned_torch_is_the_build_whose_arch_list_versions_json_records():
    release = ".".join(VERSIONS.torch.split(".")[:2])
    index = VERSIONS.torch_index.rsplit("/", 1)[1]
    assert VERSIONS.torch_arch_list == PUBLISHED[(release, index)]


@pytest.mark.parametrize("name", [t.name for t in catalog.gpu_types()])
def test_the_pinned_torch_has_kernels_for_every_gpu_type_of_the_catalog(name):
    capability = catalog.get(name).compute_capability
    assert serving_entry(VERSIONS.torch_arch_list.split(), capability), (
        f"{name}'s {capability} is not served by torch {VERSIONS.torch} from {VERSIONS.torch_index}")


def test_the_old_pin_left_every_v100_without_kernels():
    old = PUBLISHED[("2.7", "cu128")].split()
    assert [t.name for t in catalog.gpu_types() if serving_entry(old, t.compute_capability) is None] == [
        "p3.2xlarge", "p3.8xlarge", "p3.16xlarge", "p3dn.24xlarge"]


def test_each_build_is_tested_for_the_capabilities_of_the_types_that_boot_it():
    assert render.gpu_capabilities("proprietary") == ["7.0"]  # p3, p3dn
    assert render.gpu_capabilities("open") == ["8.0", "8.6", "9.0"]
    test = next(c for c in render.COMPONENTS if c.key == "image-test")
    env = render.component_env(VERSIONS, test, kernel_module_type="proprietary")
    assert env["SCALETRAIN_GPU_CAPABILITIES"] == "7.0"


# --- the check `launch doctor` and the image test make ----------------------------------------------------------

def probe(arch_list: str = CU126, gpus: tuple = ((7, 0),) * 8, kernel: str = "ok", cuda: str | None = "12.6",
          rc: int = 0) -> Probe:
    out = {"torch": "2.7.1+cu126", "cuda": cuda, "arch_list": arch_list.split(), "gpus": [list(g) for g in gpus],
           "kernel": [kernel] * len(gpus)}
    return Probe("/venv/lib/torch/cuda/__init__.py:283: UserWarning: ...\n" + json.dumps(out) + "\n", rc)


def test_a_v100_node_with_sm_70_kernels_passes_and_says_which_entry_serves_it():
    c = check_torch_arch(probe(), [(7, 0)], what="p3dn.24xlarge's V100-32GB")
    assert c.status == "ok", c
    assert c.detail == ("torch 2.7.1+cu126 (CUDA 12.6) serves compute capability 7.0 (p3dn.24xlarge's V100-32GB) "
                        "with sm_70; a kernel ran on 8 GPU(s)")


def test_a_v100_node_with_2_7_s_cu128_build_fails_naming_the_arch_list():
    c = check_torch_arch(probe(PUBLISHED[("2.7", "cu128")]), [(7, 0)], what="p3.16xlarge's V100")
    assert c.failed
    assert c.detail.startswith("torch 2.7.1+cu126 has no kernels for compute capability 7.0 (p3.16xlarge's V100): "
                               "its arch list is sm_75 sm_80")


def test_the_image_test_needs_every_capability_of_its_build_not_only_its_own_gpu():
    # on a g5 (8.6) building the open image, an arch list without sm_90 would fail the p5 nodes
    c = check_torch_arch(probe("sm_80 sm_86", gpus=((8, 6),)), [(8, 0), (8, 6), (9, 0)])
    assert c.failed and "compute capability 9.0" in c.detail
    assert check_torch_arch(probe(CU126, gpus=((8, 6),)), [(8, 0), (8, 6), (9, 0)]).status == "ok"


def test_ptx_alone_passes_and_says_it_is_compiled_at_first_use():
    c = check_torch_arch(probe("sm_80 compute_70"), [(7, 0)])
    assert c.status == "ok" and "(PTX, compiled at first use: 7.0 by compute_70)" in c.detail


def test_a_gpu_of_the_node_the_build_does_not_serve_fails_even_where_the_needs_pass():
    c = check_torch_arch(probe("sm_80 sm_90", gpus=((7, 0),)), [(8, 0)])
    assert c.failed and "no kernels for this node's GPUs (compute capability 7.0)" in c.detail


@pytest.mark.parametrize(("kw", "fragment"), [
    ({"kernel": "CUDA error: no kernel image is available for execution on the device"},
     "a kernel failed on GPU 0 (8 of 8): CUDA error: no kernel image is available"),
    ({"kernel": "wrong result 0.0"}, "a kernel failed on GPU 0 (8 of 8): wrong result 0.0"),
    ({"cuda": None}, "torch 2.7.1+cu126 is not a CUDA build"),
    ({"gpus": ()}, "sees no GPU"),
])  # fmt: skip
def test_a_kernel_that_fails_a_cpu_build_or_no_gpu_fails(kw, fragment):
    c = check_torch_arch(probe(**kw), [(7, 0)])
    assert c.failed and fragment in c.detail, c


def test_a_probe_that_did_not_print_its_answer_fails_with_its_last_line():
    c = check_torch_arch(Probe("Traceback ...\nimport torch: ImportError: libcudart.so.12: cannot open\n", 1), [(7, 0)])
    assert c.failed and c.detail == "the torch probe failed: import torch: ImportError: libcudart.so.12: cannot open"
    assert check_torch_arch(Probe("", 127), [(7, 0)]).detail == "the torch probe failed: exit 127"
    assert check_torch_arch(probe(), []).status == "skip"


def test_the_probe_is_the_doctors_on_aws_and_not_the_health_checks():
    commands = checks.probe_commands("aws", "/opt/scaletrain/venv/bin/python", "/opt/amazon/openmpi/bin/mpirun",
                                     workdir=False)
    assert "torch-arch" in commands and "get_arch_list" in commands["torch-arch"]
    assert "torch-arch" not in checks.probe_commands("local", "python", "mpirun", workdir=False)
    from launcher.doctor import health

    args = health.argparse.Namespace(backend="aws", python="/opt/scaletrain/venv/bin/python",
                                     mpirun="/opt/amazon/openmpi/bin/mpirun", shared_mount=None, storage="fsx")
    assert "torch-arch" not in health.health_probes(args)  # a CUDA context on every GPU under a running job


def test_the_probe_runs_with_a_real_torch_and_its_answer_parses():
    import subprocess

    torch = pytest.importorskip("torch")
    done = subprocess.run([sys.executable, "-c", gpuarch.TORCH_ARCH_PY], capture_output=True, text=True, timeout=300)
    c = check_torch_arch(Probe(done.stdout + done.stderr, done.returncode), [(7, 0)])
    if torch.version.cuda is None:  # this machine's CPU build (the Makefile's)
        assert c.failed and c.detail == f"torch {torch.__version__} is not a CUDA build", c
    else:  # a GPU machine's: the answer parsed, whatever the verdict on 7.0
        assert not c.detail.startswith("the torch probe failed"), c


def test_launch_doctor_fails_every_v100_worker_whose_torch_has_no_sm_70(monkeypatch):
    from test_aws_plans import cluster as aws_cluster

    from launcher.doctor import runner
    from launcher.execute import remote

    c = aws_cluster("p3dn.24xlarge")
    answers = {"2.7.1+cu128": PUBLISHED[("2.7", "cu128")], "2.7.1+cu126": CU126}
    for version, arch_list in answers.items():
        out = probe(arch_list).output.replace("2.7.1+cu126", version)
        marked = f"@@@scaletrain-doctor begin torch-arch\n{out}@@@scaletrain-doctor end torch-arch 0\n"
        monkeypatch.setattr(remote, "run_all", lambda cluster, nodes, command, marked=marked: [
            remote.NodeResult(n.name, 0, marked, "") for n in nodes])
        monkeypatch.setattr(remote, "check", lambda cluster, node, command, **kw: (1, "not run here"))
        found = [ch for ch in runner.diagnose(c, storage="none") if ch.name == gpuarch.NAME]
        assert sorted(ch.node for ch in found) == sorted(n.name for n in c.workers)
        if version.endswith("cu128"):
            assert all(ch.failed and "no kernels for compute capability 7.0 (p3dn.24xlarge's V100-32GB)" in ch.detail
                       for ch in found), found
        else:
            assert all(ch.status == "ok" for ch in found), found
