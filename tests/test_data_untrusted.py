"""The converter trusts nothing it is given (issue 33): what a class folder holds, an ILSVRC tar cut short, an OUT
that holds another conversion, a labels file in another encoding, a SRC or --out that is not one.

Each case ends in one line with the right exit status, or in a rejected input with its reason; nothing is lost or
half written, and nothing is read that the user did not name. The CLI cases run the real `launch` in a subprocess
whose address space is capped (RLIMIT_AS), so a converter that reads /dev/zero fails fast instead of eating the
machine, and with a timeout, so one that blocks on a FIFO fails instead of hanging.
"""

from __future__ import annotations

import io
import json
import os
import resource
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from clusterutil import ROOT, assert_one_line_error
from test_data_layouts import GOLDFISH, SHARK, TENCH, encode, loc_csv, noise, tar_bytes, train_tar, write_files

from training import inputfiles
from training.convert import ArgumentError, convert, merge_manifests
from training.inputfiles import read_regular
from training.outdir import CONVERSION
from training.shards import JOURNAL

MEMORY_CAP = 3 << 30  # bytes of address space a `launch` here may map: torch and Pillow fit, /dev/zero does not


def launch(home: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_CAP, MEMORY_CAP))

    env = {**os.environ, "SCALETRAIN_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "launcher", *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT, preexec_fn=cap)


def files_under(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def folders(root: Path, per_class: int = 2) -> Path:
    """SRC with train/<wnid>/ for three classes and val/<wnid>/, real small JPEGs."""
    for c, wnid in enumerate((TENCH, GOLDFISH, SHARK)):
        write_files(root / "train" / wnid, {f"{wnid}_{i}.JPEG": encode(noise(10 * c + i)) for i in range(per_class)})
        write_files(root / "val" / wnid, {f"ILSVRC2012_val_{c + 1:08d}.JPEG": encode(noise(100 + c))})
    return root


def rejected(manifest: dict) -> dict[str, str]:
    return {r["path"]: r["reason"] for r in manifest["rejected"]}


# --- 1. what a class folder holds ----------------------------------------------------------------------------


def test_a_fifo_and_a_link_to_dev_zero_in_a_class_folder_are_rejected_not_read(tmp_path):
    """Before: the FIFO blocked `launch data convert` for ever, the link read /dev/zero until the kernel killed it."""
    src = folders(tmp_path / "src")
    os.mkfifo(src / "train" / TENCH / "x.JPEG")
    (src / "train" / GOLDFISH / "zero.JPEG").symlink_to("/dev/zero")
    (src / "val" / SHARK / "null.JPEG").symlink_to("/dev/null")
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "out"), "--workers", "1")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert rejected(manifest) == {
        f"train/{TENCH}/x.JPEG": "not a regular file (a FIFO)",
        f"train/{GOLDFISH}/zero.JPEG": "not a regular file (a character device)",
        f"val/{SHARK}/null.JPEG": "not a regular file (a character device)",
    }
    assert manifest["splits"] == {"train": {"samples": 6, "shards": 1}, "val": {"samples": 3, "shards": 1}}
    assert "3 inputs rejected" in proc.stdout


def test_a_fifo_among_flat_val_files_is_rejected(tmp_path):
    src = tmp_path / "src"
    write_files(src / "val", {"ILSVRC2012_val_00000001.JPEG": encode(noise(1))})
    os.mkfifo(src / "val" / "ILSVRC2012_val_00000002.JPEG")
    write_files(src, {"LOC_val_solution.csv": loc_csv([(TENCH, "ILSVRC2012_val_00000001.JPEG", b""),
                                                       (GOLDFISH, "ILSVRC2012_val_00000002.JPEG", b"")])})
    manifest = convert(src, tmp_path / "out")
    assert rejected(manifest) == {"val/ILSVRC2012_val_00000002.JPEG": "not a regular file (a FIFO)"}


def test_no_input_is_read_past_the_size_limit_and_the_manifest_says_it(tmp_path, monkeypatch):
    """At the limit an input is read; one byte over, in a folder or in a tar, it is rejected unread."""
    image = encode(noise(1))
    monkeypatch.setattr(inputfiles, "MAX_INPUT_BYTES", len(image))
    src = tmp_path / "src"
    write_files(src / "train" / TENCH, {f"{TENCH}_1.JPEG": image, f"{TENCH}_2.JPEG": image + b"\0"})
    write_files(src, {"ILSVRC2012_img_val.tar": tar_bytes({"ILSVRC2012_val_00000001.JPEG": image,
                                                           "ILSVRC2012_val_00000002.JPEG": image + b"\0"}),
                      "LOC_val_solution.csv": loc_csv([(TENCH, "ILSVRC2012_val_00000001.JPEG", b""),
                                                       (TENCH, "ILSVRC2012_val_00000002.JPEG", b"")])})
    reads = []
    real = inputfiles.read_regular
    monkeypatch.setattr("training.sources.read_regular", lambda path, size: reads.append(size) or real(path, size))
    manifest = convert(src, tmp_path / "out")
    over = f"too large: {len(image) + 1:,} bytes is over the {len(image):,}-byte input limit"
    assert rejected(manifest) == {f"train/{TENCH}/{TENCH}_2.JPEG": over,
                                  "ILSVRC2012_img_val.tar/ILSVRC2012_val_00000002.JPEG": over}
    assert manifest["splits"] == {"train": {"samples": 1, "shards": 1}, "val": {"samples": 1, "shards": 1}}
    assert manifest["options"]["max_input_bytes"] == len(image)
    assert reads == [len(image)]  # the folder's input at the limit; the one over it was never opened


def test_an_input_that_changed_since_the_listing_is_read_no_further(tmp_path):
    path = tmp_path / "grew.JPEG"
    path.write_bytes(b"x" * 100)
    assert read_regular(path, 100) == b"x" * 100
    with pytest.raises(OSError, match="changed since it was listed: 50 bytes then, more now"):
        read_regular(path, 50)
    with pytest.raises(OSError, match="changed since it was listed: 200 bytes then, 100 now"):
        read_regular(path, 200)
    path.unlink()
    os.mkfifo(path)  # swapped for a FIFO after the listing: refused at once, not blocked in open(2)
    with pytest.raises(OSError, match=r"not a regular file \(a FIFO\)"):
        read_regular(path, 100)


@pytest.mark.parametrize(("name", "message"), [
    ("LOC_val_solution.csv", "LOC_val_solution.csv is a FIFO, not a regular file"),
    ("ILSVRC2012_devkit_t12.tar.gz", "ILSVRC2012_devkit_t12.tar.gz is a FIFO, not a regular file"),
    ("ILSVRC2012_img_val.tar", "ILSVRC2012_img_val.tar is a FIFO, not a regular file"),
    ("ILSVRC2012_img_train.tar", "ILSVRC2012_img_train.tar is a FIFO, not a regular file"),
])
def test_a_fifo_named_like_a_file_the_converter_reads_is_one_line(tmp_path, name, message):
    """Before: the devkit FIFO blocked for ever; a FIFO named like a tar was skipped, its split silently missing."""
    src = tmp_path / "src"
    if name != "ILSVRC2012_img_val.tar":  # flat val files: the labels files are read for them
        write_files(src / "val", {"ILSVRC2012_val_00000001.JPEG": encode(noise(1))})
    src.mkdir(exist_ok=True)
    os.mkfifo(src / name)
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "out"), timeout=60)
    assert_one_line_error(proc, message)
    assert proc.returncode == 1


def test_a_devkit_folder_linking_to_dev_zero_is_one_line(tmp_path):
    src = tmp_path / "src"
    write_files(src / "val", {"ILSVRC2012_val_00000001.JPEG": encode(noise(1))})
    (src / "ILSVRC2012_devkit_t12" / "data").mkdir(parents=True)
    (src / "ILSVRC2012_devkit_t12" / "data" / "ILSVRC2012_validation_ground_truth.txt").symlink_to("/dev/zero")
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "out"), timeout=60)
    assert_one_line_error(proc, "ILSVRC2012_devkit_t12/data/ILSVRC2012_validation_ground_truth.txt: not a regular "
                                "file (a character device)")


# --- 2. ILSVRC tars cut short ---------------------------------------------------------------------------------


def official(tmp_path: Path) -> tuple[Path, bytes, bytes]:
    """SRC with the official tars (3 class tars of 3 images, 3 val images) and LOC_val_solution.csv."""
    items = [(wnid, f"{wnid}_{i}.JPEG", encode(noise(10 * c + i))) for c, wnid in enumerate((TENCH, GOLDFISH, SHARK))
             for i in range(3)]
    val = [(wnid, f"ILSVRC2012_val_{c + 1:08d}.JPEG", encode(noise(50 + c)))
           for c, wnid in enumerate((TENCH, GOLDFISH, SHARK))]
    train, val_tar = train_tar(items), tar_bytes({name: data for _, name, data in val})
    src = tmp_path / "src"
    write_files(src, {"ILSVRC2012_img_train.tar": train, "ILSVRC2012_img_val.tar": val_tar,
                      "LOC_val_solution.csv": loc_csv(val)})
    return src, train, val_tar


def member_offsets(data: bytes) -> dict[str, tuple[int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: (m.offset, m.offset_data + m.size) for m in tar}


def cut_points(train: bytes) -> dict[str, int]:
    at = member_offsets(train)
    return {
        "in half": len(train) // 2,
        "inside its last class tar": (at[f"{SHARK}.tar"][0] + at[f"{SHARK}.tar"][1]) // 2,
        "inside a header": at[f"{SHARK}.tar"][0] + 100,
        "between two class tars": at[f"{SHARK}.tar"][0],
        "inside the end-of-archive marker": at[f"{SHARK}.tar"][1] + 511,
    }


@pytest.mark.parametrize("where", ["in half", "inside its last class tar", "inside a header", "between two class tars",
                                   "inside the end-of-archive marker"])
def test_a_train_tar_cut_short_is_one_line_saying_what_was_read_and_what_is_missing(tmp_path, where):
    """Before: tracebacks (in half, inside the last class tar), or exit 0 with classes missing (the others)."""
    src, train, _ = official(tmp_path)
    cut = cut_points(train)[where]
    (src / "ILSVRC2012_img_train.tar").write_bytes(train[:cut])
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, f"ILSVRC2012_img_train.tar is cut short: its {cut:,} bytes end inside",
                          "download it again")
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    if where == "inside the end-of-archive marker":
        assert f"3 class tars read whole (up to {SHARK}), 0 of the 3 classes LOC_val_solution.csv names missing" \
            in line
    elif where != "in half":
        assert f"2 class tars read whole (up to {GOLDFISH}), 1 of the 3 classes LOC_val_solution.csv names " \
               f"missing ({SHARK})" in line
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_tar_ending_at_its_first_zero_block_is_whole(tmp_path):
    """The boundary of the cut above: one block of zeros after the last member ends a tar (tarfile stops there too)."""
    src, train, val_tar = official(tmp_path)
    end = member_offsets(train)[f"{SHARK}.tar"][1]
    end += -end % 512
    (src / "ILSVRC2012_img_train.tar").write_bytes(train[: end + 512])
    manifest = convert(src, tmp_path / "out")
    assert manifest["splits"]["train"] == {"samples": 9, "shards": 1} and manifest["rejected"] == []


def test_a_train_tar_cut_short_without_val_labels_says_the_classes_after_it_are_missing(tmp_path):
    src, train, _ = official(tmp_path)
    (src / "ILSVRC2012_img_val.tar").unlink()
    (src / "ILSVRC2012_img_train.tar").write_bytes(train[: cut_points(train)["inside a header"]])
    with pytest.raises(ValueError, match=f"2 class tars read whole \\(up to {GOLDFISH}\\), the classes after them "
                                         "missing"):
        convert(src, tmp_path / "out")


def test_a_damaged_header_in_a_train_tar_is_one_line(tmp_path):
    src, train, _ = official(tmp_path)
    at = member_offsets(train)[f"{SHARK}.tar"][0]
    damaged = train[:at] + b"\x07" * 512 + train[at + 512:]
    (src / "ILSVRC2012_img_train.tar").write_bytes(damaged)
    with pytest.raises(ValueError, match=f"is damaged: the block at byte {at:,}, after {GOLDFISH}.tar, is neither"):
        convert(src, tmp_path / "out")


@pytest.mark.parametrize("cut", ["data", "header"])
def test_a_val_tar_cut_short_names_the_images_missing(tmp_path, cut):
    src, _, val_tar = official(tmp_path)
    at = member_offsets(val_tar)["ILSVRC2012_val_00000002.JPEG"]
    end = (at[0] + at[1]) // 2 if cut == "data" else at[0] + 100
    (src / "ILSVRC2012_img_val.tar").write_bytes(val_tar[:end])
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, f"ILSVRC2012_img_val.tar is cut short: its {end:,} bytes end inside",
                          "1 images read whole, 2 of the 3 LOC_val_solution.csv labels missing "
                          "(ILSVRC2012_val_00000002, ILSVRC2012_val_00000003)", "download it again")


def test_a_class_tar_cut_short_inside_a_whole_train_tar_is_rejected_with_what_was_read(tmp_path):
    good = tar_bytes({f"{TENCH}_{i}.JPEG": encode(noise(i)) for i in range(2)})
    three = tar_bytes({f"{GOLDFISH}_{i}.JPEG": encode(noise(10 + i)) for i in range(3)})
    second = member_offsets(three)[f"{GOLDFISH}_1.JPEG"][0]
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "ILSVRC2012_img_train.tar").write_bytes(
        tar_bytes({f"{TENCH}.tar": good, f"{GOLDFISH}.tar": three[: second + 100]}))
    manifest = convert(tmp_path / "src", tmp_path / "out")
    assert rejected(manifest) == {f"ILSVRC2012_img_train.tar/{GOLDFISH}.tar": (
        f"unreadable class tar after 1 member(s): is cut short: its {second + 100:,} bytes end inside the header "
        f"after {GOLDFISH}_0.JPEG (byte {second:,})")}
    assert manifest["splits"]["train"]["samples"] == 3  # the class tar's first image, listed before the cut, is kept


def test_a_class_with_no_training_image_is_said(tmp_path):
    """Val labels name a class the train folders lack, and one class's only image is rejected: both said, in the
    manifest and on stderr; a class with one good image is not."""
    src = tmp_path / "src"
    write_files(src / "train" / TENCH, {f"{TENCH}_1.JPEG": encode(noise(1))})
    write_files(src / "train" / GOLDFISH, {f"{GOLDFISH}_1.JPEG": b"not a jpeg"})
    write_files(src / "val", {"ILSVRC2012_val_00000001.JPEG": encode(noise(2))})
    write_files(src, {"LOC_val_solution.csv": loc_csv([(SHARK, "ILSVRC2012_val_00000001.JPEG", b"")])})
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["classes_without_train_images"] == [GOLDFISH, SHARK]
    assert f"warning: 2 classes of 3 have no training image: {GOLDFISH}, {SHARK}" in proc.stderr


def test_classes_without_train_images_are_merged_from_the_nodes(tmp_path):
    src = tmp_path / "src"
    write_files(src / "train" / TENCH, {f"{TENCH}_{i}.JPEG": encode(noise(i)) for i in range(4)})
    write_files(src / "train" / GOLDFISH, {f"{GOLDFISH}_1.JPEG": encode(noise(9))})
    write_files(src / "train" / SHARK, {f"{SHARK}_1.JPEG": b""})
    for i in range(2):
        convert(src, tmp_path / "out", shard_size=2, node_index=i, node_count=2)
    assert merge_manifests(tmp_path / "out", 2)["classes_without_train_images"] == [SHARK]


# --- 3. OUT holding another conversion ----------------------------------------------------------------------


def test_convert_into_another_conversions_out_is_refused_and_loses_nothing(tmp_path):
    """Before: B's run deleted A's shards and overwrote A's manifest, exit 0."""
    a, b = folders(tmp_path / "a"), folders(tmp_path / "b", per_class=3)
    out = tmp_path / "out"
    launch(tmp_path / "home", "data", "convert", str(a), "--out", str(out), "--shard-size", "2")
    before = files_under(out)
    proc = launch(tmp_path / "home", "data", "convert", str(b), "--out", str(out), "--shard-size", "2")
    assert_one_line_error(proc, f"--out {out} holds a conversion that is not this one (its SRC is {a}, this run's "
                                f"{b}) in manifest.json; convert into another directory, or add --replace")
    assert proc.returncode == 2
    assert files_under(out) == before

    proc = launch(tmp_path / "home", "data", "convert", str(b), "--out", str(out), "--shard-size", "2", "--replace")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["options"]["source"] == str(b) and manifest["splits"]["train"]["samples"] == 9
    assert sorted(files_under(out)) == sorted([e["name"] for e in manifest["shards"]] + ["manifest.json"])


def test_the_same_src_by_another_path_is_the_same_conversion(tmp_path):
    """The boundary of the refusal: SRC through a symbolic link, or relative, resumes what its real path wrote."""
    src = folders(tmp_path / "src")
    (tmp_path / "link").symlink_to(src)
    out = tmp_path / "out"
    first = convert(src, out)
    kept = []
    convert(tmp_path / "link", out, on_start=lambda inputs, k: kept.append(k))
    convert(Path(os.path.relpath(src)), out, on_start=lambda inputs, k: kept.append(k))
    assert kept == [2, 2] and first["options"]["source"] == str(src)


def test_a_killed_run_of_another_conversion_is_refused_too(tmp_path):
    """No manifest yet: the journal's conversion.json says whose the shards are; without it, shards nobody names
    are nobody's to delete."""
    a, b = folders(tmp_path / "a"), folders(tmp_path / "b")
    out = tmp_path / "out"

    def die_after_the_first_shard() -> None:
        if len(list(out.glob("*.tar"))) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(a, out, shard_size=2, on_sample=die_after_the_first_shard)
    assert (out / JOURNAL / CONVERSION).is_file() and not (out / "manifest.json").exists()
    before = files_under(out)
    with pytest.raises(ArgumentError, match=f"its SRC is {a}, this run's {b}\\) in .journal/conversion.json"):
        convert(b, out, shard_size=2)
    assert files_under(out) == before

    (out / JOURNAL / CONVERSION).unlink()
    with pytest.raises(ArgumentError, match="holds train-000000.tar and more, which no manifest names as a conversion"):
        convert(b, out, shard_size=2)
    assert convert(a, out, shard_size=2, replace=True)["options"]["source"] == str(a)


def test_merge_refuses_to_overwrite_another_conversions_manifest(tmp_path):
    a, b = folders(tmp_path / "a"), folders(tmp_path / "b")
    out = tmp_path / "out"
    for i in range(2):
        convert(a, out, node_index=i, node_count=2)
    (out / "manifest.json").write_text(json.dumps({"options": {"source": str(b), "shard_size": 1000, "seed": 0,
                                                               "resize": None, "quality": 95}}))
    with pytest.raises(ArgumentError, match=f"its SRC is {b}, this run's {a}"):
        merge_manifests(out, 2)


def test_what_out_holds_under_a_records_name_is_never_read_unbounded(tmp_path):
    """Siblings of item 1 in OUT: a FIFO named manifest.json, or named like a shard's journal record, blocked the
    run in read_text(); now the first is not this conversion's manifest, the second a record that is not there."""
    src = folders(tmp_path / "src")
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "manifest.json")
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(out), timeout=60)
    assert_one_line_error(proc, f"--out {out} holds a file that is not a manifest this converter wrote in "
                                "manifest.json; convert into another directory, or add --replace")
    assert launch(tmp_path / "home", "data", "convert", str(src), "--out", str(out), "--shard-size", "2",
                  "--replace", timeout=60).returncode == 0
    out = tmp_path / "out2"  # a run killed before its manifest, a FIFO for one of its records

    def die_after_the_first_shard() -> None:
        if len(list(out.glob("*.tar"))) == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        convert(src, out, shard_size=2, on_sample=die_after_the_first_shard)
    (out / JOURNAL / "train-000000.tar.json").unlink()
    os.mkfifo(out / JOURNAL / "train-000000.tar.json")
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(out), "--shard-size", "2", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert not (out / JOURNAL).exists()


def test_a_fifo_under_the_sample_record_name_is_one_line(tmp_path):
    (tmp_path / "out").mkdir()
    os.mkfifo(tmp_path / "out" / ".launch-data-sample.json")
    proc = launch(tmp_path / "home", "data", "sample", "--out", str(tmp_path / "out"), "--classes", "2",
                  "--per-class", "1", timeout=60)
    assert_one_line_error(proc, "is not empty and holds no sample of launch data sample")


def test_replace_reaches_every_node_of_a_cluster_conversion():
    from launcher.cluster import Cluster, Node
    from launcher.plans.dataprep import ConvertSpec, plan_convert

    nodes = [Node(name=f"node{i}", address="127.0.0.1", port=2200 + i, role="worker", slots=1, cpus=4,
                  workdir=f"/w/{i}") for i in range(2)]
    cluster = Cluster(name="c", backend="local", nodes=nodes, user="u", ssh_config="/s", known_hosts="/k",
                      python="/venv/bin/python")
    for replace in (False, True):
        spec = ConvertSpec(src="/fsx/in", out="/fsx/out", replace=replace)
        assert [cmd.endswith("--node-count 2 --replace 2>&1") for _, cmd in plan_convert(cluster, spec)] == \
            [replace, replace]


# --- 8. a labels file in another encoding; SRC and --out that are not ones ---------------------------------------


def test_a_labels_file_that_is_not_utf8_is_one_line_naming_it(tmp_path):
    src = tmp_path / "src"
    write_files(src / "val", {"ILSVRC2012_val_00000001.JPEG": encode(noise(1))})
    write_files(src, {"LOC_val_solution.csv": "ImageId,PredictionString\nILSVRC2012_val_00000001,n01440764 é\n"
                                              .encode("latin-1")})
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, "LOC_val_solution.csv is not UTF-8 text: byte 0xe9 at offset 59")
    # The boundary: the same in UTF-8, with the BOM Excel writes, is read.
    write_files(src, {"LOC_val_solution.csv": "\ufeffImageId,PredictionString\nILSVRC2012_val_00000001,"
                                              "n01440764 é\n".encode()})
    assert convert(src, tmp_path / "out")["splits"] == {"val": {"samples": 1, "shards": 1}}


@pytest.mark.parametrize(("row", "message"), [
    (b"ILSVRC2012_val_00000001,n01440764\0", r"LOC_val_solution.csv line 2: 'n01440764\\x00' is not a WNID"),
    (b"ILSVRC2012_val_00000001,../../etc", r"LOC_val_solution.csv line 2: '../../etc' is not a WNID"),
    (b"ILSVRC2012_val_00000001," + b"n" * 200_000, "LOC_val_solution.csv is not a CSV file: field larger than "
                                                  "field limit"),
])
def test_a_labels_file_that_is_not_kaggles_is_one_line(tmp_path, row, message):
    src = tmp_path / "src"
    write_files(src / "val", {"ILSVRC2012_val_00000001.JPEG": encode(noise(1))})
    write_files(src, {"LOC_val_solution.csv": b"ImageId,PredictionString\n" + row + b"\n"})
    with pytest.raises(ValueError, match=message):
        convert(src, tmp_path / "out")


@pytest.mark.parametrize(("args", "message"), [
    ([], "missing argument SRC"),
    (["{tmp}/none"], "SRC {tmp}/none does not exist"),
    (["{tmp}/loop"], "SRC {tmp}/loop: symbolic link loop"),
    (["{tmp}/dangling"], "SRC {tmp}/dangling: broken symbolic link: {tmp}/gone does not exist"),
])
def test_a_src_that_is_not_one_is_a_bad_argument(tmp_path, args, message):
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    proc = launch(tmp_path / "home", "data", "convert", *[a.format(tmp=tmp_path) for a in args],
                  "--out", str(tmp_path / "out"))
    assert_one_line_error(proc, message.format(tmp=tmp_path))
    assert proc.returncode == 2
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("out", "message", "code"), [
    ("loop", "--out {tmp}/loop: symbolic link loop", 2),
    ("loop/shards", "cannot create {tmp}/loop/shards/.journal: Too many levels of symbolic links", 1),
])
def test_an_out_through_a_symbolic_link_loop_is_one_line(tmp_path, out, message, code):
    src = folders(tmp_path / "src")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", str(tmp_path / out))
    assert_one_line_error(proc, message.format(tmp=tmp_path))
    assert proc.returncode == code


def test_an_out_that_is_a_device_says_what_it_is(tmp_path):
    src = folders(tmp_path / "src")
    proc = launch(tmp_path / "home", "data", "convert", str(src), "--out", "/dev/null")
    assert_one_line_error(proc, "--out /dev/null is a character device, not a directory")
    assert proc.returncode == 2
