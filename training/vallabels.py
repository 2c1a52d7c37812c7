"""Labels files for flat validation images (training.sources lists the images they label).

Looked for in SRC: `LOC_val_solution.csv` (Kaggle: `ImageId,PredictionString`, the first WNID of the prediction
string is the label), then the devkit (`ILSVRC2012_devkit_t12.tar.gz` or that folder extracted), whose
`data/ILSVRC2012_validation_ground_truth.txt` gives one ILSVRC2012_ID per validation image, mapped to a WNID by
`data/meta.mat`. Each is read whole but bounded (training.inputfiles), and anything wrong with it is one line
naming the file.
"""

from __future__ import annotations

import csv
import gzip
import io
import re
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from training.inputfiles import MAX_LABELS_BYTES, read_limited, regular_or_absent

LOC_CSV = "LOC_val_solution.csv"
DEVKIT = "ILSVRC2012_devkit_t12"
DEVKIT_GROUND_TRUTH = "data/ILSVRC2012_validation_ground_truth.txt"
DEVKIT_META = "data/meta.mat"
WNID = re.compile(r"[A-Za-z0-9_-]+")  # WordNet ids are n + 8 digits; other data sets' class names, word characters


@dataclass(frozen=True)
class ValLabels:
    name: str  # the labels file, relative to SRC
    by_key: dict[str, str]  # image stem -> WNID
    wnids: set[str]  # every WNID the file names


def find_val_labels(src: Path) -> ValLabels | None:
    if regular_or_absent(src / LOC_CSV, LOC_CSV):
        return read_loc_csv(src / LOC_CSV, LOC_CSV)
    if regular_or_absent(src / f"{DEVKIT}.tar.gz", f"{DEVKIT}.tar.gz"):
        return read_devkit(src / f"{DEVKIT}.tar.gz", f"{DEVKIT}.tar.gz")
    if (src / DEVKIT).exists():
        return read_devkit(src / DEVKIT, DEVKIT)
    return None


def decode_text(data: bytes, name: str) -> str:
    """UTF-8 text (a BOM, as Excel writes one, is dropped); ValueError naming the file and the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{name} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start:,}; "
                         f"save it as UTF-8 (Kaggle's file is plain ASCII)") from None


def read_loc_csv(path: Path, name: str) -> ValLabels:
    """Kaggle's LOC_val_solution.csv: `ImageId,PredictionString`, the string being `WNID x y x y [WNID ...]`."""
    text = decode_text(read_limited(path, name), name)
    by_key: dict[str, str] = {}
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if not {"ImageId", "PredictionString"} <= set(reader.fieldnames or ()):
            raise ValueError(f"{name} has no ImageId,PredictionString header")
        for line, row in enumerate(reader, start=2):
            tokens = (row["PredictionString"] or "").split()
            if not row["ImageId"] or not tokens:
                raise ValueError(f"{name} line {line}: expected an image id and a WNID")
            if not WNID.fullmatch(tokens[0]):  # it becomes a class name, a folder name in the shards' manifest
                raise ValueError(f"{name} line {line}: {tokens[0][:40]!r} is not a WNID (e.g. n01440764)")
            by_key[row["ImageId"]] = tokens[0]
    except csv.Error as exc:  # a NUL byte, a field over csv's limit, an unclosed quote at the end
        raise ValueError(f"{name} is not a CSV file: {' '.join(str(exc).split())}") from None
    return ValLabels(name, by_key, set(by_key.values()))


def read_devkit(path: Path, name: str) -> ValLabels:
    """The devkit (its .tar.gz or the extracted folder): ground-truth ILSVRC2012_IDs mapped by meta.mat."""
    if path.is_dir():
        truth_bytes = read_limited(path / DEVKIT_GROUND_TRUTH, f"{name}/{DEVKIT_GROUND_TRUTH}")
        meta = read_limited(path / DEVKIT_META, f"{name}/{DEVKIT_META}")
    else:
        truth_bytes, meta = devkit_members(path, name)
    truth = truth_bytes.decode("ascii", errors="replace")  # a stray byte is then named as a line that is no id
    by_id = leaf_synsets(meta, name)
    by_key: dict[str, str] = {}
    for line, text in enumerate(truth.split(), start=1):
        if not text.isdigit() or int(text) not in by_id:
            raise ValueError(f"{name}: line {line} of {DEVKIT_GROUND_TRUTH} is not a class id in meta.mat: {text!r}")
        by_key[f"ILSVRC2012_val_{line:08d}"] = by_id[int(text)]
    return ValLabels(f"{name} ({DEVKIT_GROUND_TRUTH.split('/')[-1]})", by_key, set(by_id.values()))


class Bounded(io.RawIOBase):
    """A read-only stream of at most `limit` bytes of another; OSError past it (a decompression bomb named like the
    devkit stops there, not at the end of the disk or of memory)."""

    def __init__(self, f, limit: int):
        self.f, self.limit, self.left = f, limit, limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self.f.read(min(len(buffer), self.left + 1))
        if len(data) > self.left:
            raise OSError(0, f"more than {self.limit:,} bytes uncompressed")
        self.left -= len(data)
        buffer[: len(data)] = data
        return len(data)


def devkit_members(path: Path, name: str) -> tuple[bytes, bytes]:
    wanted = {DEVKIT_GROUND_TRUTH: b"", DEVKIT_META: b""}
    raw = read_limited(path, name)  # the devkit is 2.5 MB; read whole, then its uncompressed stream bounded too
    stream = gzip.GzipFile(fileobj=io.BytesIO(raw)) if raw[:2] == b"\x1f\x8b" else io.BytesIO(raw)
    try:
        # "r|": one pass, no seeking, so the bounded stream is read once (tarfile's stream mode).
        with tarfile.open(fileobj=io.BufferedReader(Bounded(stream, MAX_LABELS_BYTES)), mode="r|") as tar:
            for m in tar:
                for suffix in wanted:
                    if m.isfile() and m.name.endswith("/" + suffix):
                        wanted[suffix] = tar.extractfile(m).read()
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        reason = " ".join(str(getattr(exc, "strerror", None) or exc).split()) or type(exc).__name__
        raise ValueError(f"{name} is not a readable devkit archive: {reason}") from None
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
