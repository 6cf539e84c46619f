"""Loading an engine directory: its files hashed once per stamp (formats/file_stamps.py), or every load with verify="full".

Hash work is counted by wrapping the real sha256_file, never timed.
"""

import json
import os

import pytest
from click.testing import CliRunner

from specdec.cli.run import main as run_main
from specdec.formats import file_stamps
from specdec.formats.engine_format import CONFIG_FILE, load_engine_dir
from specdec.formats.errors import EngineError


@pytest.fixture
def hashed(monkeypatch, tmp_path):
    """The files sha256_file reads, in order; stamps are trusted at once (RACY_NS = 0) unless a test says otherwise."""
    monkeypatch.setenv(file_stamps.CACHE_ENV, str(tmp_path / "stamps"))
    monkeypatch.setattr(file_stamps, "RACY_NS", -1)
    seen = []
    real = file_stamps.sha256_file
    monkeypatch.setattr(file_stamps, "sha256_file", lambda path: seen.append(path.name) or real(path))
    return seen


def listed(engine_copy) -> list[str]:
    return sorted(json.loads((engine_copy / CONFIG_FILE).read_text())["files"])


def test_an_unchanged_engine_is_hashed_once(engine_copy, hashed):
    load_engine_dir(engine_copy)
    assert sorted(hashed) == listed(engine_copy)  # the first load reads every file
    hashed.clear()
    load_engine_dir(engine_copy)
    load_engine_dir(engine_copy)
    assert hashed == []  # the old loader hashed every file on every load
    load_engine_dir(engine_copy, verify="full")
    assert sorted(hashed) == listed(engine_copy)  # the full check still reads everything


@pytest.mark.parametrize("change", ["same size", "truncated", "replaced", "times set back"])
def test_a_changed_file_is_hashed_again_and_caught(engine_copy, hashed, change):
    load_engine_dir(engine_copy)  # stamps recorded
    data = engine_copy / "model.onnx.data"
    before = data.stat()
    raw = bytearray(data.read_bytes())
    raw[100] ^= 0xFF
    if change == "same size":
        with open(data, "r+b") as f:  # in place: same inode, same size
            f.seek(100)
            f.write(raw[100:101])
    elif change == "truncated":
        with open(data, "r+b") as f:
            f.truncate(len(raw) - 1)
    elif change == "replaced":
        (engine_copy / "new").write_bytes(bytes(raw))
        os.replace(engine_copy / "new", data)
    else:  # content changed, then mtime put back as it was: ctime still moves
        data.write_bytes(bytes(raw))
        os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    hashed.clear()
    with pytest.raises(EngineError, match="model.onnx.data is corrupt"):
        load_engine_dir(engine_copy)
    assert hashed == ["model.onnx.data"]  # only the changed file is read again


def test_a_file_changed_just_before_its_hash_is_not_trusted(engine_copy, hashed, monkeypatch):
    """File times tick coarsely: a file written moments before it was hashed may change again within the same tick."""
    monkeypatch.setattr(file_stamps, "RACY_NS", 3600 * 10**9)  # everything here was written within the hour
    load_engine_dir(engine_copy)
    hashed.clear()
    load_engine_dir(engine_copy)
    assert sorted(hashed) == listed(engine_copy)  # nothing was recorded, so everything is hashed again


def test_a_corrupt_file_is_refused_on_every_load(engine_copy, hashed):
    data = engine_copy / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[5] ^= 1
    data.write_bytes(bytes(raw))
    for _ in range(2):  # a failed check records nothing
        with pytest.raises(EngineError, match="corrupt"):
            load_engine_dir(engine_copy)


def test_an_unwritable_cache_still_verifies(engine_copy, hashed, monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(file_stamps.CACHE_ENV, str(tmp_path / "file" / "stamps"))  # cannot be a directory
    load_engine_dir(engine_copy)
    hashed.clear()
    load_engine_dir(engine_copy)
    assert sorted(hashed) == listed(engine_copy)


def test_verify_engine_flag(engine_copy, hashed):
    args = ["--engine_dir", str(engine_copy), "--input_file", str(engine_copy / "ids.csv"), "--max_output_len", "2"]
    (engine_copy / "ids.csv").write_text("5,6,7\n")
    assert CliRunner().invoke(run_main, args).exit_code == 0
    hashed.clear()
    assert CliRunner().invoke(run_main, args).exit_code == 0
    assert hashed == []
    assert CliRunner().invoke(run_main, [*args, "--verify_engine", "full"]).exit_code == 0
    assert sorted(hashed) == listed(engine_copy)
    r = CliRunner().invoke(run_main, [*args, "--verify_engine", "none"])
    assert r.exit_code == 2 and "'none' is not one of 'stamp', 'full'" in r.output
