"""`launch run --requirements FILE` without a cluster: what a requirements file may say, what is refused because it
would replace the image's own builds, the pip download line for the nodes' platform, and the job's environment made
once under a lock (launcher/plans/requirements.py, launcher/execute/wheels.py, launcher/execute/userenv.py). Wheels
come from a wheelhouse the test builds, never the network."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import tomllib
from clusterutil import ROOT, assert_one_line_error, launch
from packaging.requirements import Requirement
from wheelhouse import offline_env, tiny_wheels

from launcher.errors import LaunchError
from launcher.execute import userenv, wheels
from launcher.plans import requirements as reqs

REHEARSAL = reqs.node_python("debian bookworm", torch="2.13.0", horovod="0.28.1")
IMAGE = reqs.node_python("ubuntu 22.04", torch="2.7.1", horovod="0.28.1")


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    return tiny_wheels(tmp_path_factory.mktemp("wheels"))


def test_the_nodes_python_is_the_images_and_the_rehearsal_roots():
    assert (IMAGE.python, IMAGE.glibc) == ("3.10", (2, 35))
    assert (REHEARSAL.python, REHEARSAL.glibc) == ("3.11", (2, 36))
    with pytest.raises(reqs.RequirementsError, match="known: ubuntu 22.04, debian bookworm"):
        reqs.node_python("ubuntu 24.04", torch="2.7.1", horovod="0.28.1")


def test_the_image_description_names_a_distribution_we_know():
    from ami import render
    from launcher.plans import rehearsal

    assert f"ubuntu {render.load_versions().ubuntu}" in reqs.DISTROS
    assert f"debian {rehearsal.SUITE}" in reqs.DISTROS


def test_platform_tags_reach_the_nodes_glibc_and_no_further():
    tags = IMAGE.platforms()
    assert tags[0] == "manylinux_2_35_x86_64" and "manylinux_2_36_x86_64" not in tags  # glibc 2.35 and below
    assert "manylinux_2_17_x86_64" in tags and "manylinux_2_16_x86_64" not in tags  # 2014 covers 2.17 and older
    assert tags[-2:] == ["manylinux2014_x86_64", "linux_x86_64"]


def test_the_numpy_abi_is_the_one_the_image_installs():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(Requirement(d).specifier for d in project if d.startswith("numpy"))
    assert spec.contains(f"{reqs.NUMPY_ABI}.0.0") and not spec.contains(f"{reqs.NUMPY_ABI + 1}.0.0")


@pytest.mark.parametrize("text, said", [
    ("", "names no package"),
    ("# only a comment\n\n", "names no package"),
    ("einops==0.8.1\nnot a requirement!\n", "req.txt:2: 'not a requirement!' is not a requirement"),
    ("-r other.txt\n", "req.txt:1: -r is not taken here"),
    ("--index-url https://example.org\n", "--index-url is not taken here"),
])
def test_a_file_that_names_nothing_or_does_not_parse_is_one_line(text, said):
    with pytest.raises(reqs.RequirementsError, match=said.replace("(", r"\(").replace("!", "!")):
        reqs.parse(text, "req.txt")


def test_requirements_parse_with_comments_markers_and_extras():
    got = reqs.parse("einops==0.8.1  # tensors\ntimm[hf]>=1.0 ; python_version >= '3.8'\n\nsix\n", "r")
    assert [r.name for r in got] == ["einops", "timm", "six"] and got[1].extras == {"hf"}


@pytest.mark.parametrize("line, refused", [
    ("torch", None), ("torch==2.7.1", None), ("torch>=2.7", None), ("Torch<=2.7.1", None),
    ("torch==2.7.0", "torch==2.7.0 would replace the image's torch 2.7.1"),
    ("torch>2.7.1", "would replace the image's torch 2.7.1"),
    ("horovod==0.28.1", None), ("horovod<0.28.1", "would replace the image's horovod 0.28.1"),
    ("numpy", None), ("numpy>=2", None), ("numpy==2.1.3", None), ("numpy<3", None),
    ("numpy<2", "would replace the image's NumPy 2.x ABI"), ("numpy==1.26.4", "NumPy 2.x ABI"),
    ("numpy>=3", "NumPy 2.x ABI"),
    ("einops==0.8.1", None),
])
def test_what_would_replace_the_images_builds_is_refused(line, refused):
    said = reqs.refused(reqs.parse(line, "r"), IMAGE)
    assert said == refused if refused is None else refused in said


def wheel(filename: str) -> reqs.Wheel:
    return reqs.Wheel(filename, "0" * 64, 10)


def test_the_images_own_wheels_are_not_sent_and_other_versions_are_refused():
    kept, problem = reqs.resolved([wheel("torch-2.7.1-cp310-cp310-manylinux_2_28_x86_64.whl"),
                                   wheel("nvidia_nccl_cu12-2.26.2-py3-none-manylinux2014_x86_64.whl"),
                                   wheel("triton-3.3.1-cp310-cp310-manylinux_2_27_x86_64.whl"),
                                   wheel("numpy-2.2.6-cp310-cp310-manylinux_2_17_x86_64.whl"),
                                   wheel("einops-0.8.1-py3-none-any.whl")], IMAGE)
    assert problem is None and [w.filename for w in kept] == ["einops-0.8.1-py3-none-any.whl",
                                                              "numpy-2.2.6-cp310-cp310-manylinux_2_17_x86_64.whl"]
    _, problem = reqs.resolved([wheel("torch-2.7.0-cp310-cp310-manylinux_2_28_x86_64.whl")], IMAGE)
    assert "need torch 2.7.0, which would replace the image's torch 2.7.1" in problem
    _, problem = reqs.resolved([wheel("numpy-1.26.4-cp310-cp310-manylinux_2_17_x86_64.whl")], IMAGE)
    assert "numpy 1.26.4, which would replace the image's NumPy 2.x ABI" in problem
    # The rehearsal root's torch is a CPU build ('2.13.0+cpu'): the same release as a wheel of 2.13.0.
    local = reqs.node_python("debian bookworm", torch="2.13.0+cpu", horovod="0.28.1")
    assert reqs.resolved([wheel("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl")], local) == ([], None)


def test_a_sets_hash_is_its_content():
    a, b = reqs.Wheel("a-1-py3-none-any.whl", "1" * 64, 1), reqs.Wheel("b-1-py3-none-any.whl", "2" * 64, 1)
    assert reqs.set_hash([a, b], IMAGE) == reqs.set_hash([b, a], IMAGE)
    assert reqs.set_hash([a, b], IMAGE) != reqs.set_hash([a, reqs.Wheel(b.filename, "3" * 64, 1)], IMAGE)
    assert reqs.set_hash([a], IMAGE) != reqs.set_hash([a], REHEARSAL)  # another interpreter, another environment
    doc = reqs.set_document([a, b], IMAGE, "/fsx/scaletrain")
    assert doc["env"] == f"/fsx/scaletrain/envs/{reqs.set_hash([a, b], IMAGE)}" and doc["pins"] == ["a==1", "b==1"]
    assert doc["wheels"] == [f"/fsx/scaletrain/wheels/{'1' * 64}/a-1-py3-none-any.whl",
                             f"/fsx/scaletrain/wheels/{'2' * 64}/b-1-py3-none-any.whl"]


def test_the_download_line_is_for_the_nodes_and_binary_only():
    argv = reqs.download_argv("py", "req.txt", "/tmp/d", IMAGE, ("/w",))
    assert argv[:5] == ["py", "-m", "pip", "download", "--disable-pip-version-check"]
    assert "--only-binary=:all:" in argv and argv[argv.index("--python-version") + 1] == "3.10"
    assert argv.count("--platform") == len(IMAGE.platforms()) and argv[-2:] == ["--find-links", "/w"]
    assert "--index-url" not in argv  # whatever index the user's pip is configured for


def test_the_working_directorys_requirements_txt_is_named_when_unused():
    assert "pass --requirements requirements.txt" in reqs.workdir_notice(True, asked=False, declined=False)
    assert reqs.workdir_notice(True, asked=True, declined=False) is None
    assert reqs.workdir_notice(True, asked=False, declined=True) is None
    assert reqs.workdir_notice(False, asked=False, declined=False) is None


def test_download_takes_wheels_for_the_nodes_from_find_links(tmp_path, wheelhouse, monkeypatch):
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    (tmp_path / "req.txt").write_text("tinypure==1.0\ntinyext\n")
    (tmp_path / "d").mkdir()
    here = reqs.node_python("debian bookworm", torch="2.13.0", horovod="0.28.1")
    got = wheels.download(here, tmp_path / "req.txt", tmp_path / "d", (str(wheelhouse),))
    assert sorted(w.filename for w in got) == ["tinyext-2.0-cp311-cp311-linux_x86_64.whl",
                                               "tinypure-1.0-py3-none-any.whl"]
    # For the image's CPython 3.10, the cp311 build of tinyext is no wheel at all: one line naming it and the fix.
    (tmp_path / "e").mkdir()
    with pytest.raises(LaunchError) as e:
        wheels.download(IMAGE, tmp_path / "req.txt", tmp_path / "e", (str(wheelhouse),))
    assert str(e.value).startswith("no wheel of tinyext for the nodes (CPython 3.10 on manylinux_2_35_x86_64)")
    assert "--find-links DIR" in str(e.value) and "\n" not in str(e.value)


def test_an_environment_is_made_once_by_one_of_many_and_layered_over_the_image(tmp_path, wheelhouse):
    """Four processes at once ask for the same set: one makes it, every one gets it; it imports its own packages and
    this venv's (standing in for the image's) torch; asked again, nothing is made."""
    chosen = [reqs.Wheel(p.name, p.name, p.stat().st_size) for p in sorted(wheelhouse.iterdir())]
    shared = tmp_path / "fsx"
    doc = reqs.set_document(chosen, REHEARSAL, str(shared))
    for w, src in zip(chosen, sorted(wheelhouse.iterdir()), strict=True):
        Path(w.path(str(shared))).parent.mkdir(parents=True)
        shutil.copy(src, w.path(str(shared)))
    Path(doc["env"]).parent.mkdir(parents=True)
    Path(reqs.set_document_path(doc)).write_text(json.dumps(doc))
    probe = [sys.executable, "-c", "from launcher.execute import userenv; import sys; "
             f"e, made = userenv.ensure({reqs.set_document_path(doc)!r}); print('MADE' if made else 'FOUND')"]

    def one(_):
        return subprocess.run(probe, capture_output=True, text=True, cwd=ROOT, env=offline_env()).stdout

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(one, range(4)))
    assert sum("MADE" in o for o in outs) == 1 and sum("FOUND" in o for o in outs) == 3, outs
    env = Path(doc["env"])
    assert not Path(f"{env}{reqs.LOCK_SUFFIX}").exists()
    ran = subprocess.run([str(env / "bin/python"), "-c", "import tinypure, tinyext, torch; "
                          "print(tinypure.VALUE, tinyext.twice(21), torch.__name__)"], capture_output=True, text=True)
    assert ran.stdout.split() == ["42", "42", "torch"], ran.stderr
    assert userenv.ensure(reqs.set_document_path(doc), say=pytest.fail)[1] is False


def test_a_lock_left_by_a_lost_node_is_taken_over(tmp_path, wheelhouse):
    import os
    import time

    chosen = [reqs.Wheel(p.name, p.name, p.stat().st_size) for p in sorted(wheelhouse.iterdir())][:1]
    shared = tmp_path / "fsx"
    doc = reqs.set_document(chosen, REHEARSAL, str(shared))
    Path(chosen[0].path(str(shared))).parent.mkdir(parents=True)
    shutil.copy(wheelhouse / chosen[0].filename, chosen[0].path(str(shared)))
    Path(doc["env"]).parent.mkdir(parents=True)
    Path(reqs.set_document_path(doc)).write_text(json.dumps(doc))
    lock = Path(doc["env"] + reqs.LOCK_SUFFIX)
    lock.mkdir()
    old = time.time() - reqs.LOCK_STALE_S - 5
    os.utime(lock, (old, old))
    said = []
    env, made = userenv.ensure(reqs.set_document_path(doc), say=said.append)
    assert made and said and (env / reqs.READY).exists() and not lock.exists()


def test_a_fresh_lock_is_waited_for(tmp_path, monkeypatch):
    """A lock younger than LOCK_STALE_S is another node at work: nobody takes it over, the wait ends at WAIT_S."""
    doc = {"hash": "h", "env": str(tmp_path / "env"), "pins": [], "wheels": []}
    (tmp_path / "env.json").write_text(json.dumps(doc))
    (tmp_path / "env.lock").mkdir()
    monkeypatch.setattr(reqs, "WAIT_S", 2)
    with pytest.raises(userenv.EnvError, match="not ready within 2 s"):
        userenv.ensure(str(tmp_path / "env.json"))
    assert (tmp_path / "env.lock").exists()


@pytest.mark.parametrize("args, said", [
    (["--requirements", "missing.txt"], "--requirements must be a readable requirements file; missing.txt"),
    (["--requirements", "empty.txt"], "empty.txt names no package"),
    (["--requirements", "bad.txt"], "bad.txt:1: '!!' is not a requirement"),
    (["--requirements", "empty.txt", "--no-requirements"], "say opposite things"),
    (["--find-links", "."], "give --requirements"),
    (["--requirements", "bad.txt", "--find-links", "nowhere"], "--find-links must be a directory of wheels"),
])
def test_bad_requirements_options_are_one_line_and_exit_2(tmp_path, args, said):
    (tmp_path / "empty.txt").write_text("# nothing\n")
    (tmp_path / "bad.txt").write_text("!!\n")
    proc = launch(tmp_path / "home", "run", *args, "--", "true", cwd=tmp_path)
    assert_one_line_error(proc, said)
    assert proc.returncode == 2, proc.stderr
