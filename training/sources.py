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

Nothing under SRC is trusted (training.inputfiles): only regular files of at most MAX_INPUT_BYTES are inputs, and
anything else is listed with its reason. A tar has no index, so the listing reads it to its end-of-archive marker:
one cut short (a download that stopped) or with a damaged header is an error naming how much was read and what is
missing, never a conversion of the half that is there.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

from training.inputfiles import follow, not_an_input, open_regular, read_regular, regular_or_absent, too_large
from training.vallabels import DEVKIT, LOC_CSV, ValLabels, find_val_labels

SPLITS = ("train", "val")
TRAIN_TAR, VAL_TAR = "ILSVRC2012_img_train.tar", "ILSVRC2012_img_val.tar"
KAGGLE_ROOT = Path("ILSVRC", "Data", "CLS-LOC")
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
    train_cut: TarCut | None = None
    sources: dict[str, list[Source]] = {}
    inputs: dict[str, str] = {}
    labels: ValLabels | None = None

    train_dir = root / "train"
    if has_class_folders(train_dir):
        found, named = list_class_folders(src, train_dir, "train")
        sources["train"], inputs["train"] = found, rel(train_dir, src) + "/"
        wnids |= named
    elif regular_or_absent(src / TRAIN_TAR, TRAIN_TAR):
        try:
            found, named = list_train_tar(src, TRAIN_TAR)
        except TarCut as exc:  # said once the labels file (if any) has said which classes to expect
            train_cut = exc
        else:
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
        if flat or regular_or_absent(src / VAL_TAR, VAL_TAR):
            where = f"{rel(val_dir, src)}/" if flat else VAL_TAR
            if not flat:  # random bytes under the tar's name: say that, not that labels are missing
                with open_regular(src / VAL_TAR, BLOCK) as f, open_tar(f, VAL_TAR):
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

    if train_cut is not None:
        raise ValueError(train_cut.describe(labels)) from None
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
    return follow(path)[1]


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
            else:  # a regular file of at most MAX_INPUT_BYTES, after links; anything else is listed with why not
                found.append(file_source(src, Path(f.path), split, entry.name, None))
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
    """A file as an input: rejected for a link that leads nowhere, for `problem`, or for what it is (not a regular
    file, over the size limit). One stat(2), as the listing of 1.28M files had before."""
    st, broken = follow(path)
    size = st.st_size if st is not None and stat.S_ISREG(st.st_mode) else 0
    return Source(split, rel(path, src), wnid, path.stem, size, broken or problem or not_an_input(st))


def member_stem(name: str) -> str:
    return Path(name).stem


def list_train_tar(src: Path, name: str) -> tuple[list[Source], set[str]]:
    """The official train tar: one uncompressed <wnid>.tar per class, each holding that class's JPEGs. TarCut if it
    ends before its end-of-archive marker."""
    found: list[Source] = []
    wnids: set[str] = set()
    with open_regular(src / name, BLOCK) as f, open_tar(f, name) as outer:
        try:
            for member in whole_members(outer, f, os.fstat(f.fileno()).st_size, name):
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
        except TarCut as exc:
            exc.read = wnids - {member_stem(exc.inside or "")}
            raise
    return found, wnids


def list_class_tar(f, member: tarfile.TarInfo, path: str, wnid: str, container: str) -> list[Source]:
    """The members of one class tar inside the train tar, located in the outer file. One that is damaged or cut
    short inside a whole train tar is rejected with its reason, and the members listed before it stay inputs."""
    found: list[Source] = []
    end = member.offset_data + member.size
    window = Window(f, member.offset_data, member.size)
    try:
        with tarfile.open(fileobj=window, mode="r:") as inner:
            for m in whole_members(inner, window, member.size, path):
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
                else:
                    problem = too_large(m.size)
                found.append(Source("train", inner_path, wnid, member_stem(m.name), m.size, problem, container,
                                    member.offset_data + m.offset_data))
    except (tarfile.TarError, EOFError, TarCut) as exc:
        reason = " ".join(str(exc).removeprefix(f"{path} ").split()) or type(exc).__name__
        found.append(Source("train", path, wnid, wnid, member.size,
                            f"unreadable class tar after {len(found)} member(s): {reason}"))
    if not found:  # as an empty class folder: the class keeps its index, and the listing says it has no images
        found.append(Source("train", path, wnid, wnid, member.size, f"empty class tar: no train images of {wnid}"))
    return found


def list_val_tar(src: Path, name: str, labels: ValLabels) -> list[Source]:
    found = []
    with open_regular(src / name, BLOCK) as f, open_tar(f, name) as tar:
        try:
            for m in whole_members(tar, f, os.fstat(f.fileno()).st_size, name):
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
                else:
                    problem = too_large(m.size)
                found.append(Source("val", f"{name}/{m.name}", wnid, member_stem(m.name), m.size, problem, name,
                                    m.offset_data))
        except TarCut as exc:
            read = {s.key for s in found if s.path != f"{name}/{exc.inside}"}
            missing = sorted(set(labels.by_key) - read)
            raise ValueError(f"{exc}; {len(read):,} images read whole, {len(missing):,} of the "
                             f"{len(labels.by_key):,} {labels.name} labels missing{examples(missing)}; "
                             f"download it again") from None
    return found


def open_tar(f, name: str) -> tarfile.TarFile:
    try:
        return tarfile.open(fileobj=f, mode="r:")
    except tarfile.TarError as exc:
        raise ValueError(f"{name} is not an uncompressed tar: {' '.join(str(exc).split())}") from None


class TarCut(ValueError):
    """A tar that ends, or turns into something else, before its end-of-archive marker."""

    def __init__(self, message: str, inside: str | None):
        super().__init__(message)
        self.inside = inside  # the member whose data the file ends in, if it does
        self.read: set[str] = set()  # train tar: the classes whose tars were read whole

    def describe(self, labels: ValLabels | None) -> str:
        """The train tar's error: what was read, and what is missing (the labels file names every class)."""
        done = f"{len(self.read):,} class tars read whole" + (f" (up to {max(self.read)})" if self.read else "")
        if labels is not None:
            missing = sorted(labels.wnids - self.read)
            lost = (f"{len(missing):,} of the {len(labels.wnids):,} classes {labels.name} names missing"
                    f"{examples(missing)}")
        else:
            lost = "the classes after them missing (the official tar holds 1,000)"
        return f"{self}; {done}, {lost}; download it again"


def examples(names: list[str], shown: int = 3) -> str:
    return f" ({', '.join(names[:shown])}{', ...' if len(names) > shown else ''})" if names else ""


def whole_members(tar: tarfile.TarFile, f, size: int, name: str) -> Iterator[tarfile.TarInfo]:
    """`tar`'s members, then TarCut unless the tar ended at its end-of-archive marker (a block of zeros).

    tarfile stops without a word at a header cut short or one that is not a header, anywhere but at the start
    (Lib/tarfile.py, TarFile.next: TruncatedHeaderError and InvalidHeaderError are raised only at offset 0), and
    raises ReadError only while skipping a member whose data the file ends in. POSIX ustar ends an archive with
    "two consecutive 512-byte blocks of binary zeros" (pax, ustar Interchange Format:
    https://pubs.opengroup.org/onlinepubs/9699919799/utilities/pax.html); one is required here, as tarfile itself
    stops at the first.
    """
    while True:
        try:
            member = tar.next()
        except (tarfile.TarError, EOFError):
            last = tar.members[-1] if tar.members else None
            if last is not None and last.offset_data + last.size > size:
                raise TarCut(f"{name} is cut short: its {size:,} bytes end inside {last.name}, which needs "
                             f"{last.offset_data + last.size:,}", last.name) from None
            raise TarCut(f"{name} is damaged after {last.name if last else 'its start'}", None) from None
        if member is None:
            break
        yield member
    f.seek(tar.offset)
    block = f.read(BLOCK)
    after = f"after {tar.members[-1].name}" if tar.members else "at its start"
    if len(block) < BLOCK:
        raise TarCut(f"{name} is cut short: its {size:,} bytes end inside the header {after} (byte {tar.offset:,})",
                     None)
    if block != bytes(BLOCK):
        raise TarCut(f"{name} is damaged: the block at byte {tar.offset:,}, {after}, is neither a tar header nor "
                     f"the end-of-archive marker", None)


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
    """The input's bytes, never more than the listing saw (at most MAX_INPUT_BYTES); OSError if it cannot be read
    whole or is no longer a regular file of that size. `handles` caches open tar files across calls."""
    if source.container is None:
        return read_regular(src / source.path, source.size)
    f = handles.get(source.container)
    if f is None:
        f = handles[source.container] = open_regular(src / source.container)  # the caller closes it
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
