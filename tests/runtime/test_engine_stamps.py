"""Loading an engine directory: its files hashed once per stamp (runtime/file_stamps.py), or every load with verify="full".

Hash work is counted by wrapping the real sha256_file, never timed.
"""

import json
import os
import shutil

import pytest
from click.testing import CliRunner
from conftest import spec_build

from specdec.builder.build import build_engine
from specdec.cli.run import main as run_main
from specdec.runtime import file_stamps
from specdec.runtime.engine_format import CONFIG_FILE, load_engine_dir
from specdec.runtime.errors import EngineError


@pytest.fixture(scope="module")
def built(tmp_path_factory, llama_ckpt):
    out = tmp_path_factory.mktemp("format") / "engine"
    build_engine(llama_ckpt, out, spec_build(2), say=lambda _: None)
    return out


@pytest.fixture
def engine(built, tmp_path):
    """A fresh copy of the built engine (its own inodes and times), and a private stamp cache."""
    shutil.copytree(built, tmp_path / "engine")
    return tmp_path / "engine"


@pytest.fixture
def hashed(monkeypatch, tmp_path):
    """The files sha256_file reads, in order; stamps are trusted at once (RACY_NS = 0) unless a test says otherwise."""
    monkeypatch.setenv(file_stamps.CACHE_ENV, str(tmp_path / "stamps"))
    monkeypatch.setattr(file_stamps, "RACY_NS", -1)
    seen = []
    real = file_stamps.sha256_file
    monkeypatch.setattr(file_stamps, "sha256_file", lambda path: seen.append(path.name) or real(path))
    return seen


def listed(engine) -> list[str]:
    return sorted(json.loads((engine / CONFIG_FILE).read_text())["files"])


def test_an_unchanged_engine_is_hashed_once(engine, hashed):
    load_engine_dir(engine)
    assert sorted(hashed) == listed(engine)  # the first load reads every file
    hashed.clear()
    load_engine_dir(engine)
    load_engine_dir(engine)
    assert hashed == []  # the old loader hashed every file on every load
    load_engine_dir(engine, verify="full")
    assert sorted(hashed) == listed(engine)  # the full check still reads everything


@pytest.mark.parametrize("change", ["same size", "truncated", "replaced", "times set back"])
def test_a_changed_file_is_hashed_again_and_caught(engine, hashed, change):
    load_engine_dir(engine)  # stamps recorded
    data = engine / "model.onnx.data"
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
        (engine / "new").write_bytes(bytes(raw))
        os.replace(engine / "new", data)
    else:  # content changed, then mtime put back as it was: ctime still moves
        data.write_bytes(bytes(raw))
        os.utime(data, ns=(before.st_atime_ns, before.st_mtime_ns))
    hashed.clear()
    with pytest.raises(EngineError, match="model.onnx.data is corrupt"):
        load_engine_dir(engine)
    assert hashed == ["model.onnx.data"]  # only the changed file is read again


def test_a_file_changed_just_before_its_hash_is_not_trusted(engine, hashed, monkeypatch):
    """File times tick coarsely: a file written moments before it was hashed may change again within the same tick."""
    monkeypatch.setattr(file_stamps, "RACY_NS", 3600 * 10**9)  # everything here was written within the hour
    load_engine_dir(engine)
    hashed.clear()
    load_engine_dir(engine)
    assert sorted(hashed) == listed(engine)  # nothing was recorded, so everything is hashed again


def test_a_corrupt_file_is_refused_on_every_load(engine, hashed):
    data = engine / "model.onnx.data"
    raw = bytearray(data.read_bytes())
    raw[5] ^= 1
    data.write_bytes(bytes(raw))
    for _ in range(2):  # a failed check records nothing
        with pytest.raises(EngineError, match="corrupt"):
            load_engine_dir(engine)


def test_an_unwritable_cache_still_verifies(engine, hashed, monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv(file_stamps.CACHE_ENV, str(tmp_path / "file" / "stamps"))  # cannot be a directory
    load_engine_dir(engine)
    hashed.clear()
    load_engine_dir(engine)
    assert sorted(hashed) == listed(engine)


def test_verify_engine_flag(engine, hashed):
    args = ["--engine_dir", str(engine), "--input_file", str(engine / "ids.csv"), "--max_output_len", "2"]
    (engine / "ids.csv").write_text("5,6,7\n")
    assert CliRunner().invoke(run_main, args).exit_code == 0
    hashed.clear()
    assert CliRunner().invoke(run_main, args).exit_code == 0
    assert hashed == []
    assert CliRunner().invoke(run_main, [*args, "--verify_engine", "full"]).exit_code == 0
    assert sorted(hashed) == listed(engine)
    r = CliRunner().invoke(run_main, [*args, "--verify_engine", "none"])
    assert r.exit_code == 2 and "'none' is not one of 'stamp', 'full'" in r.output
