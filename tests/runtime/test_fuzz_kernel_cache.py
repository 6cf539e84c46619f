"""Fuzzing the int4 kernel's cache (hardware/cpu_kernels.py): what a cache folder may hold after a full disk, a killed
copy, another program or a user's hand.

Property: a manifest of any content is read into "this is what was compiled" or one reason why not, never an
exception; a library of any damage is compiled again (or refused in one line where no compiler is left) before a
byte of it is loaded, in a child process each (a SIGBUS would be its exit status).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from fuzzing import dumps, fuzz_settings, json_scalars, mutated
from hypothesis import event, given, strategies as st

from specdec.hardware import cpu_kernels as rk

pytestmark = [pytest.mark.fuzz, pytest.mark.skipif(rk.compiler() is None, reason="needs a C compiler")]
PROBE = "from specdec.hardware import cpu_kernels as rk; lib = rk.kernel_library(); print(rk.kernel_name(lib))"


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("kernel-cache")
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env={**os.environ, "SPECDEC_CACHE_DIR": str(root)})
    assert done.returncode == 0, done.stderr
    lib = root / "kernels" / rk.source_digest() / rk.LIBRARY
    return {"root": root, "lib": lib, "bytes": lib.read_bytes(), "manifest": (lib.parent / rk.MANIFEST).read_text(), "name": done.stdout}


@fuzz_settings(150)
@given(st.data())
def test_any_manifest_is_read_or_is_one_reason(cache, data):
    lib, good = cache["lib"], json.loads(cache["manifest"])
    fields = st.fixed_dictionaries({k: st.one_of(st.just(v), json_scalars()) for k, v in good.items()})  # each field of any type
    text = data.draw(st.one_of(mutated(good).map(dumps), fields.map(dumps), st.text(max_size=40),
                               st.binary(max_size=40).map(lambda b: b.decode("latin-1"))))
    (lib.parent / rk.MANIFEST).write_text(text)
    try:
        why = rk.check_cached(lib)
    finally:
        (lib.parent / rk.MANIFEST).write_text(cache["manifest"])
    event("accepted" if why is None else "refused")
    assert why is None or (isinstance(why, str) and why and "\n" not in why)
    if why is None:  # only a manifest that vouches for exactly these bytes
        m = json.loads(text)
        assert m["size"] == len(cache["bytes"]) and m["sha256"] == json.loads(cache["manifest"])["sha256"]


def damage_in_place(lib, data: bytes) -> None:
    """``data`` where the cached library is, as a new file (tests/builder/test_cpu_kernels.py says why: never truncate a
    library some process may have mapped)."""
    tmp = lib.with_name(lib.name + ".damaged")
    tmp.write_bytes(data)
    os.replace(tmp, lib)


@st.composite
def damage(draw, good: bytes) -> bytes:
    kind = draw(st.sampled_from(["cut", "flip", "zeros", "junk", "empty"]))
    if kind == "cut":
        return good[: draw(st.integers(0, len(good) - 1))]
    if kind == "flip":
        at = draw(st.integers(0, len(good) - 1))
        return good[:at] + bytes([good[at] ^ 0xFF]) + good[at + 1 :]
    if kind == "zeros":
        at = draw(st.integers(0, len(good) - 1))
        return good[:at] + bytes(min(4096, len(good) - at)) + good[at + 4096 :]
    if kind == "junk":
        return draw(st.binary(min_size=1, max_size=256))
    return b""


@fuzz_settings(4)
@given(st.data())
def test_a_damaged_library_is_compiled_again_or_refused_in_one_line(cache, data):
    lib = cache["lib"]
    damage_in_place(lib, data.draw(damage(cache["bytes"])))
    no_cc = data.draw(st.booleans())
    env = {**os.environ, "SPECDEC_CACHE_DIR": str(cache["root"]), **({"CC": "/nonexistent/cc"} if no_cc else {})}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env)
    if no_cc:  # nothing to compile with: one line that says what is wrong with the cached file
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
        assert done.returncode == 1 and last.startswith("specdec.hardware.cpu_kernels.KernelBuildError: the cached int4 CPU kernel"), done.stderr
        damage_in_place(lib, cache["bytes"])
    else:
        assert done.returncode == 0 and done.stdout == cache["name"], (done.returncode, done.stderr)
        assert lib.read_bytes() == cache["bytes"]  # compiled again, bit for bit
    assert sorted(p.name for p in lib.parent.iterdir()) == sorted([rk.LIBRARY, rk.MANIFEST])


@pytest.mark.parametrize("text", ['{"size": Infinity, "sha256": "a"}', '{"size": 1e999}', '{"size": NaN, "sha256": "a"}',
                                  '{"size": true, "sha256": "a"}',
                                  '[1]', '"x"', "[" * 100000])
def test_manifests_the_fuzzer_found(cache, text):
    """Found by the fuzzer: {"size": Infinity} (valid JSON to Python) made int() raise OverflowError out of the check."""
    lib = cache["lib"]
    (lib.parent / rk.MANIFEST).write_text(text)
    try:
        assert rk.check_cached(lib) == f"its manifest {rk.MANIFEST} is not one specdec wrote"
    finally:
        (lib.parent / rk.MANIFEST).write_text(cache["manifest"])
