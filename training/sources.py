"""Where ImageNet comes from: every layout people have, listed as inputs without reading any image.

One split, one layout; under SRC, the first that is there wins:

    train   SRC/train/<wnid>/*                  class folders
            SRC/ILSVRC2012_img_train.tar        the official tar (one <wnid>.tar per class), read in place
    val     SRC/val/<wnid>/*                    class folders (after the usual valprep script)
            SRC/val/*                           flat files, labelled by a labels file
            SRC/ILSVRC2012_img_val.tar          the official tar (flat files), read in place, labelled the same way

The Kaggle download's `SRC/ILSVRC/Data/CLS-LOC/{train,val}` stand in for `SRC/{train,val}`. Labels files for
flat validation files, looked for in SRC: `LOC_val_solution.csv` (Kaggle: `ImageId,PredictionString`, the
first WNID of the prediction string is the label), then the devkit (`ILSVRC2012_devkit_t12.tar.gz` or that
folder extracted), whose `data/ILSVRC2012_validation_ground_truth.txt` gives one ILSVRC2012_ID per validation
image, mapped to a WNID by `data/meta.mat`.

A member of a tar is read as bytes [offset, offset + size) of the tar file on disk (tar members are stored
uncompressed and contiguous; a class tar inside the train tar is itself such a member), so reading an input is
one seek and one read whatever the layout, and nothing is ever extracted.

The class list is the sorted union of the WNIDs the layouts name: class folders, class tars, and every WNID in
the labels file (all 1000 for the real files), so class indices do not depend on which files are present.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path

SPLITS = ("train", "val")
TRAIN_TAR, VAL_TAR = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"
KAGGLE_ROOT = Path("ILSVRC", "Data", "CLS-LOC")
LOC_CSV = "LOC_val_solution.csv"
DEVKIT = "ILSVRC2012_devkit_t12"
DEVKIT_GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
DEVKIT_META = "data/meta.mat"
BLOCK = tarfile.BLOCKSIZE  # listing a tar reads one 512-byte header per member, not a default 8 KiB buffer


@dataclass(frozen=True, slots=True)
class Source:
    """One input. `problem` is set when the listing alone shows it cannot become a sample."""

    split: str
    path: str  # where it is, relative to SRC, forward slashes; inside a tar: "<tar>/<member>"
    wnid: str  # "" when unknown (then `problem` says why)
    key: str
    size: int  # bytes
    problem: str | None = None
    container: str | None = None  # the tar (relative to SRC) whose bytes [offset, offset + size) are this input
    offset: int = 0


@dataclass(frozen=True)
class Listing:
    classes: list[str]  # sorted WNIDs
    sources: dict[str, list[Source]]  # per split present, sorted by (key, path)
    inputs: dict[str, str]  # per split: the layout read, e.g. "ILSVRC2012_img_val.tar + LOC_val_solution.csv"


@dataclass(frozen=True)
class ValLabels:
    name: str  # the labels file, relative to SRC
    by_key: dict[str, str]  # image stem -> WNID
    wnids: set[str]  # every WNID the file names


def reading_folders(src: Path) -> list[Path]:
    """The folders under SRC whose every file the listing reads as an image: train/ and val/ (Kaggle's, if there)."""
    root = src / KAGGLE_ROOT if (src / KAGGLE_ROOT).is_dir() else src
    return [root / split for split in SPLITS]


def discover(src: Path) -> Listing:
    """Every input under SRC, per split, with the class list; ValueError (one line) if SRC holds no data set or a
    folder of it cannot be read."""
    try:
        return discover_inputs(Path(src))
    except OSError as exc:
        raise ValueError(f"cannot read {exc.filename or src}: {exc.strerror or exc}") from None


def discover_inputs(src: Path) -> Listing:
    root = src / KAGGLE_ROOT if (src / KAGGLE_ROOT).is_dir() else src
    wnids: set[str] = set()
    sources: dict[str, list[Source]] = {}
    inputs: dict[str, str] = {}
    labels: ValLabels | None = None

    train_dir = root / "train"
    if has_class_folders(train_dir):
        found, named = list_class_folders(src, train_dir, "train")
        sources["train"], inputs["train"] = found, rel(train_dir, src) + "/"
        wnids |= named
    elif (src / TRAIN_TAR).is_file():
        found, named = list_train_tar(src, TRAIN_TAR)
        sources["train"], inputs["train"] = found, TRAIN_TAR
        wnids |= named
    elif train_dir.is_dir() and any(p.is_file() for p in train_dir.iterdir()):
        raise ValueError(f"{train_dir} holds files but no <wnid>/ class folders; sort them into train/<wnid>/ first")

    val_dir = root / "val"
    if has_class_folders(val_dir):
        found, named = list_class_folders(src, val_dir, "val")
        sources["val"], inputs["val"] = found, rel(val_dir, src) + "/"
        wnids |= named
    else:
        flat = val_dir.is_dir() and any(p.is_file() for p in val_dir.iterdir())
        if flat or (src / VAL_TAR).is_file():
            where = f"{rel(val_dir, src)}/" if flat else VAL_TAR
            if not flat:  # random bytes under the tar's name: say that, not that labels are missing
                with open(src / VAL_TAR, "rb", buffering=BLOCK) as f, open_tar(f, VAL_TAR):
                    pass
            labels = find_val_labels(src)
            if labels is None:
                raise ValueError(
                    f"{where} holds validation images without class folders and SRC has no labels file; "
                    f"put {LOC_CSV} or the devkit ({DEVKIT}.tar.gz) in {src}"
                )
            found = list_flat_folder(src, val_dir, labels) if flat else list_val_tar(src, VAL_TAR, labels)
            sources["val"], inputs["val"] = found, f"{where} + {labels.name}"
            wnids |= labels.wnids

    if not sources:
        raise ValueError(
            f"no ImageNet under SRC {src}: expected train/<wnid>/ or val/ folders, {TRAIN_TAR} or {VAL_TAR}"
        )
    return Listing(sorted(wnids), {s: mark_bad_keys(sources[s]) for s in SPLITS if s in sources}, inputs)


def rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()


def has_class_folders(split_dir: Path) -> bool:
    return split_dir.is_dir() and any(p.is_dir() for p in split_dir.iterdir())


def scan(folder: Path | str) -> list[os.DirEntry]:
    """A folder's entries by name; os.scandir's entries know their type without a stat (1.28M files)."""
    with os.scandir(folder) as entries:
        return sorted(entries, key=lambda e: e.name)


def link_problem(path: Path | str) -> str | None:
    """Why a path the listing found cannot be opened as what it names (a symbolic link whose target is gone, or a
    loop of them), or None when it can."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symbolic link loop"
        if exc.errno == errno.ENOENT and os.path.islink(path):
            return f"broken symbolic link: {os.readlink(path)} does not exist"
        return f"unreadable: {exc.strerror or exc}"
    return None


def list_class_folders(src: Path, split_dir: Path, split: str) -> tuple[list[Source], set[str]]:
    """SPLIT/<wnid>/* ; files outside a class folder or in a subfolder of one, broken symbolic links and empty class
    folders are listed with a problem."""
    found: list[Source] = []
    wnids: set[str] = set()
    for entry in scan(split_dir):
        broken = link_problem(entry.path) if entry.is_symlink() else None
        if broken is not None or not entry.is_dir():
            found.append(file_source(src, Path(entry.path), split, "", broken or "outside a class folder"))
            continue
        wnids.add(entry.name)
        before = len(found)
        for f in scan(entry.path):
            broken = link_problem(f.path) if f.is_symlink() else None
            if broken is not None:
                found.append(file_source(src, Path(f.path), split, entry.name, broken))
            elif f.is_dir():
                for p in sorted(q for q in Path(f.path).rglob("*") if not q.is_dir()):
                    found.append(file_source(src, p, split, entry.name, "in a subfolder of its class folder"))
            else:
                found.append(Source(split, rel(Path(f.path), src), entry.name, Path(f.name).stem, f.stat().st_size))
        if len(found) == before:  # the class keeps its index; say that it has nothing in this split
            found.append(Source(split, rel(Path(entry.path), src) + "/", entry.name, entry.name, 0,
                                f"empty class folder: no {split} images of {entry.name}"))
    return found, wnids


def list_flat_folder(src: Path, split_dir: Path, labels: ValLabels) -> list[Source]:
    found = []
    for p in sorted(split_dir.rglob("*")):
        if p.is_dir():
            continue
        wnid = labels.by_key.get(p.stem, "") if p.parent == split_dir else ""
        problem = link_problem(p) if p.is_symlink() else None
        if problem is None and p.parent != split_dir:
            problem = "in a subfolder of the flat validation folder"
        elif problem is None and not wnid:
            problem = f"no label in {labels.name}"
        found.append(file_source(src, p, "val", wnid, problem))
    return found


def file_source(src: Path, path: Path, split: str, wnid: str, problem: str | None) -> Source:
    broken = link_problem(path) if path.is_symlink() else None
    size = 0 if broken is not None else path.stat().st_size
    return Source(split, rel(path, src), wnid, path.stem, size, broken or problem)


def member_stem(name: str) -> str:
    return Path(name).stem


def list_train_tar(src: Path, name: str) -> tuple[list[Source], set[str]]:
    """The official train tar: one uncompressed <wnid>.tar per class, each holding that class's JPEGs."""
    found: list[Source] = []
    wnids: set[str] = set()
    with open(src / name, "rb", buffering=BLOCK) as f, open_tar(f, name) as outer:
        for member in outer:
            path = f"{name}/{member.name}"
            if member.isdir():
                continue
            if not member.isfile() or not member.name.endswith(".tar") or "/" in member.name:
                found.append(Source("train", path, "", member_stem(member.name), member.size,
                                    "not a class tar (<wnid>.tar) at the top of the train tar"))
                continue
            wnid = member.name[: -len(".tar")]
            wnids.add(wnid)
            found.extend(list_class_tar(f, member, path, wnid, name))
    return found, wnids


def list_class_tar(f, member: tarfile.TarInfo, path: str, wnid: str, container: str) -> list[Source]:
    """The members of one class tar inside the train tar, located in the outer file."""
    found: list[Source] = []
    end = member.offset_data + member.size
    try:
        with tarfile.open(fileobj=Window(f, member.offset_data, member.size), mode="r:") as inner:
            for m in inner:
                if m.isdir():
                    continue
                inner_path = f"{path}/{m.name}"
                problem = None
                if not m.isfile():
                    problem = "not a regular file"
                elif "/" in m.name:
                    problem = "in a subfolder of its class tar"
                elif member.offset_data + m.offset_data + m.size > end:
                    problem = "truncated: extends past the end of its class tar"
                found.append(Source("train", inner_path, wnid, member_stem(m.name), m.size, problem, container,
                                    member.offset_data + m.offset_data))
    except (tarfile.TarError, EOFError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        found.append(Source("train", path, wnid, wnid, member.size,
                            f"unreadable class tar after {len(found)} member(s): {reason}"))
    if not found:  # as an empty class folder: the class keeps its index, and the listing says it has no images
        found.append(Source("train", path, wnid, wnid, member.size, f"empty class tar: no train images of {wnid}"))
    return found


def list_val_tar(src: Path, name: str, labels: ValLabels) -> list[Source]:
    found = []
    with open(src / name, "rb", buffering=BLOCK) as f, open_tar(f, name) as tar:
        for m in tar:
            if m.isdir():
                continue
            wnid = labels.by_key.get(member_stem(m.name), "") if "/" not in m.name else ""
            problem = None
            if not m.isfile():
                problem = "not a regular file"
            elif "/" in m.name:
                problem = "in a subfolder of the validation tar"
            elif not wnid:
                problem = f"no label in {labels.name}"
            found.append(Source("val", f"{name}/{m.name}", wnid, member_stem(m.name), m.size, problem, name,
                                m.offset_data))
    return found


def open_tar(f, name: str) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=f, mode="r:")
    except tarfile.TarError as exc:
        raise ValueError(f"{name} is not an uncompressed tar: {' '.join(str(exc).split())}") from None


class Window(io.RawIOBase):
    """A read-only, seekable view of bytes [start, start + size) of an open file: a tar inside a tar."""

    def __init__(self, f, start: int, size: int):
        self.f, self.start, self.size, self.pos = f, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self.size - self.pos))
        self.f.seek(self.start + self.pos)
        data = self.f.read(n)
        buffer[: len(data)] = data
        self.pos += len(data)
        return len(data)


def read_input(src: Path, source: Source, handles: dict) -> bytes:
    """The input's bytes; OSError if it cannot be read whole. `handles` caches open tar files across calls."""
    if source.container is None:
        return (src / source.path).read_bytes()
    f = handles.get(source.container)
    if f is None:
        f = handles[source.container] = open(src / source.container, "rb")  # noqa: SIM115 - the caller closes it
    f.seek(source.offset)
    data = f.read(source.size)
    if len(data) != source.size:
        raise OSError(0, f"short read: {len(data)} of {source.size} bytes")
    return data


def mark_bad_keys(sources: list[Source]) -> list[Source]:
    """Sort by (key, path), then flag keys WebDataset would mangle: a '.' in the stem, or a stem already used.

    Sorting by key rather than by path makes the listing, hence the shards, the same for every layout.
    """
    first_with_key: dict[str, str] = {}
    marked = []
    for s in sorted(sources, key=lambda s: (s.key, s.path)):
        if s.problem is None and "." in s.key:
            s = replace(s, problem="file stem contains '.', which would split the key")
        elif s.problem is None and s.key in first_with_key:
            s = replace(s, problem=f"duplicate key: same stem as {first_with_key[s.key]}")
        elif s.problem is None:
            first_with_key[s.key] = s.path
        marked.append(s)
    return marked


# ---------------------------------------------------------------------------------------------------------
# Labels files for flat validation images.


def find_val_labels(src: Path) -> ValLabels | None:
    if (src / LOC_CSV).is_file():
        return read_loc_csv(src / LOC_CSV, LOC_CSV)
    for name in (f"{DEVKIT}.tar.gz", DEVKIT):
        if (src / name).exists():
            return read_devkit(src / name, name)
    return None


def read_loc_csv(path: Path, name: str) -> ValLabels:
    """Kaggle's LOC_val_solution.csv: `ImageId,PredictionString`, the string being `WNID x y x y [WNID ...]`."""
    by_key: dict[str, str] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if not {"ImageId", "PredictionString"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{name} has no ImageId,PredictionString header")
        for line, row in enumerate(reader, start=2):
            tokens = (row["PredictionString"] or "").split()
            if not row["ImageId"] or not tokens:
                raise ValueError(f"{name} line {line}: expected an image id and a WNID")
            by_key[row["ImageId"]] = tokens[0]
    return ValLabels(name, by_key, set(by_key.values()))


def read_devkit(path: Path, name: str) -> ValLabels:
    """The devkit (its .tar.gz or the extracted folder): ground-truth ILSVRC2012_IDs mapped by meta.mat."""
    if path.is_dir():
        try:
            truth = (path / DEVKIT_GROUND_TRUTH).read_text()
            meta = (path / DEVKIT_META).read_bytes()
        except OSError as exc:
            raise ValueError(f"{name}: cannot read {exc.filename}: {exc.strerror}") from None
    else:
        truth_bytes, meta = devkit_members(path, name)
        truth = truth_bytes.decode("ascii", errors="replace")
    by_id = leaf_synsets(meta, name)
    by_key: dict[str, str] = {}
    for line, text in enumerate(truth.split(), start=1):
        if not text.isdigit() or int(text) not in by_id:
            raise ValueError(f"{name}: line {line} of {DEVKIT_GROUND_TRUTH} is not a class id in meta.mat: {text!r}")
        by_key[f"ILSVRC2012_val_{line:08d}"] = by_id[int(text)]
    return ValLabels(f"{name} ({DEVKIT_GROUND_TRUTH.split('/')[-1]})", by_key, set(by_id.values()))


def devkit_members(path: Path, name: str) -> tuple[bytes, bytes]:
    wanted = {DEVKIT_GROUND_TRUTH: b"", DEVKIT_META: b""}
    try:
        with tarfile.open(path, "r:*") as tar:
            for m in tar:
                for suffix in wanted:
                    if m.isfile() and m.name.endswith("/" + suffix):
                        wanted[suffix] = tar.extractfile(m).read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ValueError(f"{name} is not a readable devkit archive: {' '.join(str(exc).split())}") from None
    missing = [suffix for suffix, data in wanted.items() if not data]
    if missing:
        raise ValueError(f"{name} lacks {', '.join(missing)}")
    return wanted[DEVKIT_GROUND_TRUTH], wanted[DEVKIT_META]


def leaf_synsets(meta: bytes, name: str) -> dict[int, str]:
    """ILSVRC2012_ID -> WNID for the 1000 leaf synsets (num_children == 0) of the devkit's meta.mat."""
    try:
        from scipy.io import loadmat  # only the devkit needs it
    except ImportError:
        raise ValueError(f"{name}: reading {DEVKIT_META} needs scipy (pip install scipy), or use {LOC_CSV}") from None
    try:
        synsets = loadmat(io.BytesIO(meta), squeeze_me=True)["synsets"]
        leaves = {int(s["ILSVRC2012_ID"]): str(s["WNID"]) for s in synsets.ravel() if int(s["num_children"]) == 0}
    except Exception as exc:  # scipy raises many types for a file that is not the devkit's meta.mat
        raise ValueError(f"{name}: {DEVKIT_META} is not the devkit's synset table: {' '.join(str(exc).split())}") \
            from None
    if not leaves:
        raise ValueError(f"{name}: {DEVKIT_META} lists no leaf synsets")
    return leaves
