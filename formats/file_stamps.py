"""Engine files checked against their sha256, each hashed once per file stamp.

Hashing every file of a multi-GB engine costs seconds at every start. So after
a file's sha256 has matched config.json, its stamp (size, mtime, ctime, inode,
device) is recorded in the user's cache, and a later load that finds the same
stamp and the same expected sha256 does not read the file again.

What this trusts: any change made through the file system (a write, a
truncation, a copy or rename over the file, ``touch -d``) changes the file's
ctime, which no user can set back, so a changed file is hashed again and a
tampered one is caught. What it cannot see: bytes changed below the file
system (a failing disk, writes to the block device) or a forged cache by
someone who can write the user's cache directory. ``full`` (``--verify_engine
full``) hashes every file, every load, as before; the stamp check is the
default. A file changed less than ``RACY_NS`` before it was hashed is not
recorded: file times tick coarsely (a jiffy; 2 s on FAT), so a second change
in the same tick would leave the stamp as it was ("racy git").

The cache lives in ``$SPECDEC_CACHE_DIR``, else ``$XDG_CACHE_HOME/specdec/verified``,
else ``~/.cache/specdec/verified``: one small JSON file per directory of engine files.
If it cannot be written, every load hashes every file.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from .errors import EngineError

VERIFY_MODES = ("stamp", "full")  # stamp: hash a file once per stamp (the default); full: hash every file every load
CACHE_ENV = "SPECDEC_CACHE_DIR"
RACY_NS = 2_000_000_000  # a file changed this soon before its hash began may change again unseen in the same tick


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specdec" / "verified"


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


class _Records:
    """The verified stamps of the files of one directory: {file name: [stamp..., sha256]}."""

    def __init__(self, directory: Path):
        real = os.path.realpath(directory)
        self.path = cache_dir() / (hashlib.sha256(real.encode()).hexdigest()[:32] + ".json")
        self.directory = real
        try:
            data = json.loads(self.path.read_text())
            self.files = data["files"] if data.get("directory") == real and isinstance(data.get("files"), dict) else {}
        except (OSError, ValueError, KeyError, TypeError):
            self.files = {}
        self.changed = False

    def remember(self, name: str, entry: list) -> None:
        self.changed |= self.files.get(name) != entry
        self.files[name] = entry

    def forget(self, name: str) -> None:
        self.changed |= self.files.pop(name, None) is not None

    def save(self) -> None:
        if not self.changed:
            return
        try:  # written whole and moved into place: concurrent loads see the old file or the new one
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".stamps-")
            with os.fdopen(fd, "w") as f:
                json.dump({"directory": self.directory, "files": self.files}, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # an unwritable cache only costs the next load a full hash


def verify_files(root: Path, files: dict[str, str], mode: str, config_name: str) -> None:
    """Check that every file in ``files`` (relative path -> sha256) exists under ``root`` and holds those bytes.

    ``mode``: "stamp" hashes only files whose stamp differs from the one recorded at their last good hash;
    "full" hashes every file. Raises EngineError naming the first missing or corrupt file.
    """
    if mode not in VERIFY_MODES:
        raise EngineError(f"engine verification {mode!r}: expected one of {', '.join(VERIFY_MODES)}.")
    records: dict[Path, _Records] = {}
    for rel, expected in files.items():
        f = root / rel
        try:
            st = f.stat()
        except OSError:
            st = None
        if st is None or not f.is_file():
            raise EngineError(f"engine file {f} is missing (listed in {config_name}). Copy the whole engine directory, or rebuild it.")
        if f.parent not in records:
            records[f.parent] = _Records(f.parent)
        rec = records[f.parent]
        if mode == "stamp" and rec.files.get(f.name) == [*_stamp(st), expected]:
            continue
        began = time.time_ns()
        if sha256_file(f) != expected:
            rec.forget(f.name)
            for r in records.values():
                r.save()
            raise EngineError(f"engine file {f} is corrupt: its sha256 does not match {config_name}. Copy the engine directory again, or rebuild it.")
        after = f.stat()
        if _stamp(after) == _stamp(st) and began - max(st.st_mtime_ns, st.st_ctime_ns) > RACY_NS:
            rec.remember(f.name, [*_stamp(st), expected])
        else:
            rec.forget(f.name)  # changed while hashed, or too recently to trust its stamp
    for r in records.values():
        r.save()
