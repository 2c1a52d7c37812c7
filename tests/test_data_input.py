"""Unusual input to `launch data sample|convert`, as a new user gives it (issue 26): each ends in one line naming what
was wrong and what is allowed, or in output that is exactly what the command said, never a traceback.

The CLI cases run the real `launch` in a subprocess; the listing's cases (symbolic links, an empty class folder, the
file modes) call the converter itself, which is what every node runs.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
from pathlib import Path

import pytest
from clusterutil import assert_one_line_error, launch

from training.convert import convert, load_manifest
from training.sample import SAMPLE_RECORD, make_sample

SAMPLE = ["--classes", "3", "--per-class", "4", "--val-per-class", "2"]


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def images_under(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*.JPEG")}


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("input") / "src"
    make_sample(root, classes=3, per_class=4, val_per_class=2, seed=1)
    return root


def no_python_names(proc: subprocess.CompletedProcess) -> None:
    """The error names options as the user typed them, not the code's fields or pydantic's phrasing."""
    for leak in ("per_class", "shard_size", "val_per_class", "node_index", "node_count", "Input should"):
        assert leak not in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------------------
# --out that cannot be the directory asked for


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("afile", "--out {tmp}/afile is a file, not a directory"),
        ("/proc/x", "cannot create /proc/x: "),
        ("", "--out is empty: name the directory to write"),
    ],
)
def test_sample_into_what_cannot_be_a_directory_is_one_line(tmp_path, out, message):
    (tmp_path / "afile").touch()
    out = str(tmp_path / out) if out == "afile" else out
    proc = launch(tmp_path / "home", "data", "sample", "--out", out, *SAMPLE)
    assert_one_line_error(proc, message.format(tmp=tmp_path))
    assert (tmp_path / "afile").read_bytes() == b""


@pytest.mark.parametrize("command", ["sample", "convert"])
def test_an_empty_out_is_refused_not_the_current_directory(src, tmp_path, command):
    args = [str(src), "--shard-size", "5"] if command == "convert" else SAMPLE
    before = sorted(os.listdir(Path(__file__).resolve().parent.parent))  # launch runs in the repository root
    assert_one_line_error(launch(tmp_path / "home", "data", command, *args, "--out", ""),
                          "--out is empty: name the directory to write")
    assert sorted(os.listdir(Path(__file__).resolve().parent.parent)) == before


@contextlib.contextmanager
def read_only(path: Path):
    """`path` as a read-only bind mount of itself, as a read-only file system or a snapshot is mounted."""
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", path, path], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", path], check=True)
        yield path
    finally:
        subprocess.run(["umount", path], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="a bind mount needs root")
def test_writing_onto_a_read_only_mount_is_one_line(src, tmp_path):
    with read_only(tmp_path / "ro") as ro:
        assert_one_line_error(launch(tmp_path / "home", "data", "sample", "--out", str(ro / "s"), *SAMPLE),
                              f"cannot create {ro}/s: Read-only file system")
        assert_one_line_error(launch(tmp_path / "home", "data", "sample", "--out", str(ro), *SAMPLE),
                              f"cannot write in {ro}: Read-only file system")
        assert_one_line_error(launch(tmp_path / "home", "data", "convert", str(src), "--out", str(ro / "o")),
                              f"cannot create {ro}/o/.journal: Read-only file system")
    assert not any((tmp_path / "ro").iterdir())


# ---------------------------------------------------------------------------------------------------------
# data sample into a directory that is not empty


def test_sample_into_an_earlier_sample_gives_exactly_the_new_one(tmp_path):
    home, out = tmp_path / "home", tmp_path / "s1"
    launch(home, "data", "sample", "--out", str(out), "--classes", "3", "--per-class", "20", check=True)
    (out / "shards").mkdir()
    (out / "shards" / "mine.txt").write_text("the user's own, beside the sample")
    proc = launch(home, "data", "sample", "--out", str(out), "--classes", "2", "--per-class", "8", check=True)
    assert "wrote 16 training and 4 validation images in 2 classes" in proc.stdout
    make_sample(tmp_path / "fresh", classes=2, per_class=8)
    fresh = files_under(tmp_path / "fresh")
    assert {k: v for k, v in files_under(out).items() if not k.startswith("shards/")} == fresh
    assert (out / "shards" / "mine.txt").read_text() == "the user's own, beside the sample"
    assert len(images_under(out / "train")) == 16  # the case: 26 (then 60) where it said 8 per class


def test_sample_refuses_a_folder_it_did_not_write_and_keeps_it(tmp_path):
    home = tmp_path / "home"
    (tmp_path / "photos" / "train").mkdir(parents=True)
    (tmp_path / "photos" / "train" / "holiday.JPEG").write_bytes(b"the user's")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep me")
    for name in ("photos", "notes"):
        assert_one_line_error(launch(home, "data", "sample", "--out", str(tmp_path / name), *SAMPLE),
                              f"--out {tmp_path / name} is not empty and holds no sample of launch data sample",
                              "a new or empty directory")
    assert (tmp_path / "photos" / "train" / "holiday.JPEG").read_bytes() == b"the user's"
    assert sorted(p.name for p in (tmp_path / "photos").rglob("*")) == ["holiday.JPEG", "train"]
    assert (tmp_path / "notes" / "todo.txt").read_text() == "keep me"

    # An earlier sample with a file the user added among its images: not ours to delete, so refused too.
    make_sample(tmp_path / "s", classes=2, per_class=2)
    added = tmp_path / "s" / "train" / "n01440764" / "n01440764_99.JPEG"
    added.write_bytes(b"added")
    assert_one_line_error(launch(home, "data", "sample", "--out", str(tmp_path / "s"), *SAMPLE),
                          "holds files launch data sample did not write", "train/n01440764/n01440764_99.JPEG")
    assert added.read_bytes() == b"added"


def test_an_empty_directory_takes_a_sample(tmp_path):
    (tmp_path / "empty").mkdir()
    launch(tmp_path / "home", "data", "sample", "--out", str(tmp_path / "empty"), *SAMPLE, check=True)
    assert len(images_under(tmp_path / "empty")) == 3 * (4 + 2)
    assert (tmp_path / "empty" / SAMPLE_RECORD).is_file()


# ---------------------------------------------------------------------------------------------------------
# Options: the names the user typed, the ranges allowed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--per-class", "0"], "--per-class must be >= 1, got 0"),
        (["--per-class", "2", "--val-per-class", "-1"], "--val-per-class must be >= 0, got -1"),
        (["--classes", "1"], "--classes must be between 2 and 1000, got 1"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        # Upper bounds, checked before anything is written (20 digits wrote ~6,900 images, then 'Value too large').
        (["--classes", "2", "--per-class", "99999999999999999999"],
         "--per-class must be <= 10000, got 99999999999999999999 (allowed: 1 to 10000)"),
        (["--per-class", "10001"], "--per-class must be <= 10000, got 10001 (allowed: 1 to 10000)"),
        (["--per-class", "2", "--val-per-class", "10001"],
         "--val-per-class must be <= 10000, got 10001 (allowed: 0 to 10000)"),
        (["--classes", "1001"], "--classes must be between 2 and 1000, got 1001"),
    ],
)
def test_sample_options_out_of_range_name_the_option(tmp_path, args, message):
    proc = launch(tmp_path / "home", "data", "sample", "--out", str(tmp_path / "s"), *args)
    assert_one_line_error(proc, message)
    assert proc.returncode == 2  # a usage error, as every command says a bad option value
    no_python_names(proc)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--workers", "0"], "--workers must be >= 1, got 0"),
        (["--workers", "-1"], "--workers must be >= 1, got -1"),
        (["--seed", "-1"], "--seed must be >= 0, got -1"),
        (["--shard-size", "0"], "--shard-size must be >= 1, got 0"),
        (["--resize", "0"], "--resize must be >= 1, got 0"),
        (["--quality", "101"], "--quality must be between 1 and 100, got 101"),
        (["--node-index", "2", "--node-count", "2"], "--node-index must be between 0 and 1 (--node-count 2), got 2"),
        (["--node-count", "0"], "--node-count must be >= 1, got 0"),
    ],
)
def test_convert_options_out_of_range_name_the_option(src, tmp_path, args, message):
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "o"), *args)
    assert_one_line_error(proc, message)
    assert proc.returncode == 2
    no_python_names(proc)
    assert not (tmp_path / "o").exists()


def test_convert_with_cluster_checks_its_options_before_asking_the_nodes(tmp_path):
    proc = launch(tmp_path / "home", "data", "convert", "/fsx/raw", "--out", "/fsx/o", "--cluster", "nosuch",
                  "--shard-size", "0")
    assert_one_line_error(proc, "--shard-size must be >= 1, got 0")


def test_the_smallest_allowed_options_are_accepted(src, tmp_path):
    """The other side of each boundary: --workers 1, --seed 0, --shard-size 1, --per-class 1 work."""
    launch(tmp_path / "home", "data", "sample", "--out", str(tmp_path / "s"), "--classes", "2", "--per-class", "1",
           "--val-per-class", "0", "--seed", "0", check=True)
    proc = launch(tmp_path / "home", "data", "convert", str(tmp_path / "s"), "--out", str(tmp_path / "o"),
                  "--workers", "1", "--seed", "0", "--shard-size", "1", check=True)
    assert "(train: 2 samples in 2 shards); 0 inputs rejected" in proc.stdout


def test_the_largest_allowed_sample_options_are_accepted():
    """The other side of the upper bounds (writing 2 x 10,000 images takes a minute: the check itself is asked)."""
    from training.sample import MAX_PER_CLASS, check_sample_options

    assert MAX_PER_CLASS == 10_000
    check_sample_options(1000, 10_000, 10_000, 0)
    check_sample_options(2, 1, 0, 0)


def test_sample_help_states_the_real_val_default():
    proc = launch(Path("/tmp"), "data", "sample", "--help", check=True)
    assert "default: a fifth of --per-class, at least 2" in " ".join(proc.stdout.split())


# ---------------------------------------------------------------------------------------------------------
# What SRC is


def test_convert_of_a_file_says_it_is_a_file(tmp_path):
    (tmp_path / "afile").write_text("x")
    assert_one_line_error(launch(tmp_path / "home", "data", "convert", str(tmp_path / "afile"), "--out",
                                 str(tmp_path / "o")),
                          f"SRC {tmp_path}/afile is a file; SRC is the directory that holds train/ and val/")
    tar = tmp_path / "dl" / "ILSVRC2012_img_val.tar"
    tar.parent.mkdir()
    tar.write_bytes(b"x")
    assert_one_line_error(launch(tmp_path / "home", "data", "convert", str(tar), "--out", str(tmp_path / "o")),
                          f"SRC {tar} is a file;", f"pass the directory that holds it: {tmp_path}/dl")


def test_convert_of_a_device_or_fifo_says_it_is_not_a_directory(tmp_path):
    """/dev/null and a FIFO exist: 'does not exist' was the wrong reason."""
    os.mkfifo(tmp_path / "fifo")
    for src, kind in (("/dev/null", "a character device"), (str(tmp_path / "fifo"), "a FIFO")):
        assert_one_line_error(launch(tmp_path / "home", "data", "convert", src, "--out", str(tmp_path / "o")),
                              f"SRC {src} is not a directory ({kind}); SRC is the directory that holds train/")
    assert_one_line_error(launch(tmp_path / "home", "data", "convert", str(tmp_path / "none"), "--out",
                                 str(tmp_path / "o")), f"SRC {tmp_path}/none does not exist")
    assert not (tmp_path / "o").exists()


def test_an_empty_src_is_refused_not_the_current_directory(tmp_path):
    before = sorted(os.listdir(Path(__file__).resolve().parent.parent))  # launch runs in the repository root
    proc = launch(tmp_path / "home", "data", "convert", "", "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "SRC is empty: name the directory that holds ImageNet")
    assert proc.returncode == 2
    assert sorted(os.listdir(Path(__file__).resolve().parent.parent)) == before
    assert not (tmp_path / "o").exists()
    # "." is a name: it is the current directory because it was asked for (the repository root has no train/).
    assert "SRC is empty" not in launch(tmp_path / "home", "data", "convert", ".", "--out", str(tmp_path / "o")).stderr


@pytest.mark.parametrize(("extra", "named"), [
    (["{src}"], "leave out SRC {src}"),
    (["--cluster", "c1"], "leave out --cluster c1"),
    (["{src}", "--cluster", "c1"], "leave out SRC {src} and --cluster c1"),
])
def test_merge_names_the_argument_it_does_not_take(src, tmp_path, extra, named):
    args = [a.format(src=src) for a in extra]
    proc = launch(tmp_path / "home", "data", "convert", *args, "--out", str(tmp_path / "o"), "--merge",
                  "--node-count", "2")
    assert_one_line_error(proc, f"--merge takes only --out and --node-count; {named.format(src=src)}")
    assert proc.returncode == 2


def test_random_bytes_named_like_the_val_tar_are_not_a_tar_before_labels_are_asked_for(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ILSVRC2012_img_val.tar").write_bytes(os.urandom(5000))
    proc = launch(tmp_path / "home", "data", "convert", str(tmp_path / "src"), "--out", str(tmp_path / "o"))
    assert_one_line_error(proc, "ILSVRC2012_img_val.tar is not an uncompressed tar")
    assert "labels" not in proc.stderr


@pytest.mark.parametrize("inside", ["train/shards", "val/shards", "train"])
def test_out_where_the_listing_reads_images_is_refused(src, tmp_path, inside):
    """Shards in SRC/train would be read as a class of images by the next run (the issue's "twice")."""
    out = src / inside
    before = files_under(src)
    split = inside.split("/")[0]
    assert_one_line_error(launch(tmp_path / "home", "data", "convert", str(src), "--out", str(out)),
                          f"--out {out} is inside {src}/{split}, where the images are read from",
                          "outside SRC's train/ and val/")
    assert files_under(src) == before


def test_out_beside_train_and_val_in_src_converts_twice(tmp_path):
    """Beside train/ and val/ the listing never looks: allowed, and a second run keeps every shard."""
    src = tmp_path / "src"
    make_sample(src, classes=3, per_class=4, val_per_class=2, seed=1)
    for _ in range(2):
        proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(src / "shards"),
                      "--shard-size", "5", check=True)
    assert "0 inputs rejected" in proc.stdout and "resuming: 5 finished shards verified and kept" in proc.stderr


# ---------------------------------------------------------------------------------------------------------
# The listing: symbolic links, empty class folders


def test_broken_and_looping_symbolic_links_are_rejected_with_their_reason(tmp_path):
    src = tmp_path / "src"
    make_sample(src, classes=3, per_class=2, val_per_class=1, seed=1)
    tench = src / "train" / "n01440764"
    (tench / "dangling.JPEG").symlink_to("/nonexistent/x.JPEG")
    (tench / "a.JPEG").symlink_to("b.JPEG")
    (tench / "b.JPEG").symlink_to("a.JPEG")
    (tench / "here").symlink_to(".")  # a class folder linking to itself
    (src / "train" / "n01443537" / "fine.JPEG").symlink_to(tench / "n01440764_1.JPEG")  # a good link is an input
    (src / "train" / "n09999999").symlink_to("n09999999")  # a class folder that is a link to itself
    (src / "train" / "n09999998").symlink_to("/nonexistent")  # one whose target is gone

    manifest = convert(src, tmp_path / "out", shard_size=4)
    rejected = {r["path"]: r["reason"] for r in manifest["rejected"]}
    assert rejected["train/n01440764/dangling.JPEG"] == "broken symbolic link: /nonexistent/x.JPEG does not exist"
    assert rejected["train/n01440764/a.JPEG"] == "symbolic link loop"
    assert rejected["train/n01440764/b.JPEG"] == "symbolic link loop"
    assert rejected["train/n09999999"] == "symbolic link loop"
    assert rejected["train/n09999998"] == "broken symbolic link: /nonexistent does not exist"
    assert rejected["train/n01440764/here/n01440764_1.JPEG"] == "in a subfolder of its class folder"
    assert manifest["splits"]["train"]["samples"] == 3 * 2 + 1
    assert manifest["classes"] == ["n01440764", "n01443537", "n01484850"]


def test_a_broken_link_in_a_flat_val_folder_is_rejected_not_skipped(tmp_path):
    src = tmp_path / "src"
    make_sample(src, classes=2, per_class=1, val_per_class=1, seed=1)
    flat = src / "val"
    for folder in list(flat.iterdir()):
        for image in folder.iterdir():
            image.rename(flat / image.name)
        folder.rmdir()
    (flat / "ILSVRC2012_val_00000009.JPEG").symlink_to("/nonexistent")
    (src / "LOC_val_solution.csv").write_text("ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 1 2 3 4\n"
                                              "ILSVRC2012_val_00000002,n01443537 1 2 3 4\n")
    manifest = convert(src, tmp_path / "out")
    assert manifest["rejected"] == [{"path": "val/ILSVRC2012_val_00000009.JPEG", "split": "val",
                                     "reason": "broken symbolic link: /nonexistent does not exist"}]


def test_an_empty_class_folder_is_listed_as_rejected_and_said(src, tmp_path):
    copy = tmp_path / "src"
    make_sample(copy, classes=3, per_class=2, val_per_class=1, seed=1)
    (copy / "train" / "n09999999").mkdir()
    proc = launch(tmp_path / "home", "data", "convert", str(copy), "--out", str(tmp_path / "o"), check=True)
    assert "rejected train/n09999999/: empty class folder" in proc.stderr
    assert "1 input rejected" in proc.stdout
    manifest = convert(copy, tmp_path / "o2")
    assert manifest["classes"][-1] == "n09999999"  # its index stays what the folder's name gives it
    assert manifest["rejected"] == [{"path": "train/n09999999/", "split": "train",
                                     "reason": "empty class folder: no train images of n09999999"}]


# ---------------------------------------------------------------------------------------------------------
# What the output looks like


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_shards_manifest_and_sample_images_follow_the_umask(tmp_path, mask, mode):
    with umask(mask):
        make_sample(tmp_path / "s", classes=2, per_class=2, val_per_class=1)
        convert(tmp_path / "s", tmp_path / "o", shard_size=2, workers=2)
    written = [p for p in [*(tmp_path / "s").rglob("*"), *(tmp_path / "o").iterdir()] if p.is_file()]
    assert {p.name for p in written} >= {"manifest.json", "train-000000.tar", "val-000000.tar", SAMPLE_RECORD}
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in written} == {oct(mode)}


def test_counts_are_in_plain_english(src, tmp_path):
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "o"), "--shard-size", "6",
                  check=True)
    assert f"wrote {tmp_path}/o/manifest.json (train: 12 samples in 2 shards, val: 6 samples in 1 shard); " \
           "0 inputs rejected" in proc.stdout
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "o"), "--shard-size", "6",
                  check=True)
    assert "resuming: 3 finished shards verified and kept" in proc.stderr


def test_a_shard_of_rejected_inputs_only_is_neither_written_nor_listed(tmp_path):
    """Shards of 1: each corrupt image's shard would hold nothing. It was written as an empty tar with count 0 and
    counted ("24 samples in 5 shards"); now it is named in empty_shards, with no file, on a resumed run and a
    2-node conversion alike."""
    from training.convert import merge_manifests

    src = tmp_path / "src"
    make_sample(src, classes=2, per_class=3, val_per_class=1, seed=1)
    for bad in ("train/n01440764/n01440764_2.JPEG", "val/n01443537/ILSVRC2012_val_00000002.JPEG"):
        (src / bad).write_bytes(b"\xff\xd8\xff")
    manifest = convert(src, tmp_path / "out", shard_size=1)
    assert manifest["splits"] == {"train": {"samples": 5, "shards": 5}, "val": {"samples": 1, "shards": 1}}
    assert len(manifest["shards"]) == 6 and all(s["count"] == 1 for s in manifest["shards"])
    assert len(manifest["empty_shards"]) == 2 and len(manifest["rejected"]) == 2
    tars = sorted(p.name for p in (tmp_path / "out").glob("*.tar"))
    assert tars == sorted(s["name"] for s in manifest["shards"])
    assert not set(manifest["empty_shards"]) & set(tars)

    kept = []
    assert convert(src, tmp_path / "out", shard_size=1, on_start=lambda inputs, k: kept.append((inputs, k))) == \
        manifest
    assert kept == [(0, 8)]  # every shard finished, the empty ones too: nothing converted again

    # An empty tar an earlier run left under an empty shard's name goes, and the rest is kept.
    (tmp_path / "out" / manifest["empty_shards"][0]).write_bytes(bytes(1024))
    assert convert(src, tmp_path / "out", shard_size=1) == manifest
    assert sorted(p.name for p in (tmp_path / "out").glob("*.tar")) == tars

    for node in (0, 1):
        convert(src, tmp_path / "two", shard_size=1, node_index=node, node_count=2)
    assert merge_manifests(tmp_path / "two", 2) == manifest
    assert sorted(p.name for p in (tmp_path / "two").glob("*.tar")) == tars
    assert load_manifest(tmp_path / "two")["empty_shards"] == manifest["empty_shards"]
