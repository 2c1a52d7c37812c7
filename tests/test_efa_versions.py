"""An image without the scaletrain:* version tags (an AMI copied to another region keeps none): the EFA settings come
from the versions the node itself shows, read from real output formats; nothing readable means current software's
settings and a warning, never the oldest ones."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from golden import assert_golden

from ami import paths
from ami.render import image_env, load_versions
from infra import catalog
from launcher.execute import remote, run
from launcher.plans import efa, flightrec
from launcher.plans.efa import SoftwareVersions

DATA = Path(__file__).parent / "data" / "efa-versions"
P4D = catalog.get("p4d.24xlarge")


def probe_output(*, image_env_text: str = "", fi_info: str = "", packages: str = "", ofi_nccl: str = "") -> str:
    """What efa.VERSION_PROBE prints: each source after its marker line (empty where the node has none)."""
    parts = {"image.env": image_env_text, "fi_info": fi_info, "efa_installed_packages": packages,
             "ofi-nccl": ofi_nccl}
    return "".join(f"@@@scaletrain-versions {name}\n{text}" for name, text in parts.items())


def recorded(name: str) -> str:
    return (DATA / name).read_text()


IMAGE_ENV = "".join(f"{k}={v}\n" for k, v in image_env(load_versions()).items())
CASES = {
    "nothing readable": probe_output(),
    "the project's image (image.env)": probe_output(image_env_text=IMAGE_ENV),
    "fi_info 1.19 only": probe_output(fi_info=recorded("fi_info-version-1.19.0amzn3.0.txt")),
    "EFA installer 1.22.0, rpm": probe_output(packages=recorded("efa_installed_packages-1.22.0-rhel8.txt")),
    "EFA installer 1.5.1, old deb": probe_output(packages=recorded("efa_installed_packages-1.5.1-ubuntu.txt")),
    "EFA installer with the plugin, deb": probe_output(
        packages=recorded("efa_installed_packages-ubuntu2204-assembled.txt")),
    "plugin 1.7.3-aws beside EFA installer 1.22.0": probe_output(
        packages=recorded("efa_installed_packages-1.22.0-rhel8.txt"),
        ofi_nccl="Initializing aws-ofi-nccl 1.7.3-aws\n"),
    "fi_info wins over the package list": probe_output(
        fi_info=recorded("fi_info-version-1.19.0amzn3.0.txt"),
        packages=recorded("efa_installed_packages-1.5.1-ubuntu.txt")),
}


def test_versions_read_from_recorded_output_golden():
    lines = []
    for case, text in CASES.items():
        v = efa.parse_version_probe(text)
        lines.append(f"{case}: aws-ofi-nccl={v.aws_ofi_nccl} libfabric={v.libfabric} "
                     f"p4d env={json.dumps(efa.fabric_env(P4D, v), sort_keys=True)}")
    assert_golden("efa-versions.txt", "\n".join(lines) + "\n")
    parsed = {case: efa.parse_version_probe(text) for case, text in CASES.items()}
    assert parsed["the project's image (image.env)"] == SoftwareVersions(
        aws_ofi_nccl=load_versions().aws_ofi_nccl, libfabric=load_versions().libfabric)
    assert parsed["EFA installer 1.22.0, rpm"] == SoftwareVersions(libfabric="1.17.0")
    assert parsed["EFA installer 1.5.1, old deb"] == SoftwareVersions(libfabric="1.8.0amzn1.0")
    assert parsed["EFA installer with the plugin, deb"] == SoftwareVersions(aws_ofi_nccl="1.14.0",
                                                                            libfabric="2.1.0amzn5.0")
    assert parsed["fi_info wins over the package list"].libfabric == "1.19.0amzn3.0"


def test_unknown_software_gets_current_settings_not_the_oldest():
    # The issue: no tags used to mean FI_PROVIDER=efa and NCCL_PROTO=simple, which only aws-ofi-nccl <= 1.5 needs
    # and which keeps NCCL off its low-latency protocols.
    nothing = efa.parse_version_probe(CASES["nothing readable"])
    assert efa.unknown_versions(nothing) == ["aws-ofi-nccl", "libfabric"]
    env = efa.fabric_env(P4D, nothing)
    assert "NCCL_PROTO" not in env and "FI_PROVIDER" not in env
    old = efa.parse_version_probe(probe_output(ofi_nccl="NET/OFI Initializing aws-ofi-nccl 1.5.0-aws\n"))
    assert efa.fabric_env(P4D, old)["NCCL_PROTO"] == "simple"


def test_the_probe_runs_in_a_shell_and_reads_a_binary_plugin(tmp_path):
    # VERSION_PROBE as a node runs it, over a fake root: fi_info a script printing recorded output, the plugin a
    # binary with its version string between NUL bytes, no image.env, no EFA installer record.
    root = tmp_path / "root"
    fi_info = root / paths.FI_INFO.lstrip("/")
    fi_info.parent.mkdir(parents=True)
    fi_info.write_text(f"#!/bin/sh\ncat '{DATA / 'fi_info-version-1.19.0amzn3.0.txt'}'\n")
    fi_info.chmod(0o755)
    plugin = root / paths.OFI_NCCL_PREFIX.lstrip("/") / "lib" / "libnccl-net-ofi.so"
    plugin.parent.mkdir(parents=True)
    plugin.write_bytes(b"\x7fELF\x00\x01junk\x00Initializing aws-ofi-nccl 1.14.0\x00NET/OFI %s\x00\xff\xfe")
    script = efa.VERSION_PROBE
    for prefix in ("/opt/amazon", "/opt/aws-ofi-nccl", "/etc/scaletrain"):
        script = script.replace(prefix, f"{root}{prefix}")
    out = subprocess.run(["bash", "-c", script], capture_output=True, check=True).stdout.decode()
    assert efa.parse_version_probe(out) == SoftwareVersions(aws_ofi_nccl="1.14.0", libfabric="1.19.0amzn3.0")
    # Programs by absolute path: the probe runs in a non-login shell that has no PATH to the image's tools.
    assert f"{paths.FI_INFO} --version" in efa.VERSION_PROBE


# --- The shell: read on node0 when the tags are missing ---------------------------------------------------------


@pytest.fixture
def untagged_p4d():
    from test_aws_plans import cluster

    c = cluster("p4d.24xlarge")
    return c.model_copy(update={"aws": c.aws.model_copy(update={"software": {}})})


def test_launch_train_reads_the_versions_on_node0_when_the_image_has_no_tags(untagged_p4d, monkeypatch, capsys):
    asked = []

    def check(cluster, node, command, **kw):
        asked.append((node.name, command))
        return 0, CASES["EFA installer with the plugin, deb"]

    monkeypatch.setattr(remote, "check", check)
    env, mca = run.fabric_settings(untagged_p4d, untagged_p4d.workers[0])
    assert asked == [("node0", efa.VERSION_PROBE)]
    assert env == {"FI_EFA_USE_HUGE_PAGE": "0", **flightrec.ENV} and ("btl", "tcp,self") in mca
    assert "aws-ofi-nccl 1.14.0, libfabric 2.1.0amzn5.0" in capsys.readouterr().out


def test_nothing_readable_is_current_software_and_a_warning(untagged_p4d, monkeypatch, capsys):
    monkeypatch.setattr(remote, "check", lambda *a, **kw: (0, CASES["nothing readable"]))
    env, _ = run.fabric_settings(untagged_p4d, untagged_p4d.workers[0])
    assert env == {"FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0", **flightrec.ENV}
    err = capsys.readouterr().err
    assert err.startswith("warning: the image has no scaletrain:* tags and node0 shows no aws-ofi-nccl or "
                          "libfabric version; using the EFA settings for current software") and err.count("\n") == 1


def test_tagged_images_and_tcp_clusters_ask_the_node_nothing(monkeypatch):
    from test_aws_plans import cluster

    monkeypatch.setattr(remote, "check", lambda *a, **kw: pytest.fail("asked the node"))
    tagged = cluster("p4d.24xlarge")
    assert run.fabric_settings(tagged, tagged.workers[0])[0] == {"FI_EFA_USE_HUGE_PAGE": "0", **flightrec.ENV}
    tcp = cluster("p4d.24xlarge", efa=False)
    tcp = tcp.model_copy(update={"aws": tcp.aws.model_copy(update={"software": {}})})
    # no EFA: no fabric settings, but the GPU ranks still keep NCCL's flight recorder (launcher/plans/flightrec.py)
    assert run.fabric_settings(tcp, tcp.workers[0]) == (flightrec.ENV, [])


# --- Which types get GPUDirect RDMA's setting, at the family boundary (issue 37 item 10) ----------------------------
# AWS's EC2 User Guide, "Elastic Fabric Adapter", Supported instance types
# (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa.html#efa-instance-types): RDMA read and write are supported
# on p4d.24xlarge, p4de.24xlarge, p5.48xlarge, p5e.48xlarge and p5en.48xlarge; p3dn.24xlarge, g5.48xlarge and c5n
# support EFA without RDMA read. p3.16xlarge has no EFA at all (Amazon EC2 P3 Instances: "up to 100 Gbps" on p3dn
# only). The aws-ofi-nccl cheatsheet sets FI_EFA_USE_DEVICE_RDMA=1 on the RDMA ones with older software.
OLD = SoftwareVersions(aws_ofi_nccl="1.6.0", libfabric="1.17.1")       # needs the RDMA variable, not FI_PROVIDER


@pytest.mark.parametrize(("instance", "env"), [
    ("p5en.48xlarge", {"FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"}),
    ("p5.48xlarge", {"FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"}),
    ("p4de.24xlarge", {"FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"}),
    ("p4d.24xlarge", {"FI_EFA_USE_DEVICE_RDMA": "1", "FI_EFA_USE_HUGE_PAGE": "0"}),
    ("p3dn.24xlarge", {"FI_EFA_USE_HUGE_PAGE": "0"}),                    # EFA, no GPUDirect RDMA
    ("g5.48xlarge", {"FI_EFA_USE_HUGE_PAGE": "0"}),
    ("p3.16xlarge", {}),                                               # no EFA: NCCL's sockets over ENA
])  # fmt: skip
def test_gpudirect_rdma_is_set_on_the_families_aws_lists_and_no_other(instance, env):
    assert efa.fabric_env(catalog.get(instance), OLD) == env
    assert (catalog.get(instance).family in efa.RDMA_FAMILIES) is ("FI_EFA_USE_DEVICE_RDMA" in env)


@pytest.mark.parametrize(("ofi_nccl", "libfabric", "rdma", "provider"), [
    ("1.5.0", "1.17.0", True, True),       # cheatsheet: FI_PROVIDER=efa, NCCL_PROTO=simple for aws-ofi-nccl <= 1.5.0
    ("1.6.0", "1.17.0", True, False),
    ("1.6.9", "1.18.0", True, False),      # FI_EFA_USE_DEVICE_RDMA: not for aws-ofi-nccl >= 1.7.0 AND libfabric >= 1.18
    ("1.7.0", "1.17.9", True, False),
    ("1.7.0", "1.18.0", False, False),
    ("1.7.0", None, True, False),          # one version unknown: the harmless setting stays
])  # fmt: skip
def test_the_software_versions_at_their_boundaries(ofi_nccl, libfabric, rdma, provider):
    for name in ("p5en.48xlarge", "p4d.24xlarge"):
        env = efa.fabric_env(catalog.get(name), SoftwareVersions(aws_ofi_nccl=ofi_nccl, libfabric=libfabric))
        assert ("FI_EFA_USE_DEVICE_RDMA" in env) is rdma
        assert ("FI_PROVIDER" in env) is provider and ("NCCL_PROTO" in env) is provider
