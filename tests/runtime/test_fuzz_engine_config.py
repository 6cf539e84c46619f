"""Fuzzing an engine's config.json after the build: fields deleted, of another type, numbers at the edges, deep
nesting, with the build stamp (every engine specdec-build writes now) and without it (engines built before it).

Property: the engine loads and decodes exactly as built, or refuses in one clean SpecdecError line (naming the
field), at load or when it is opened; never an ONNX Runtime error, a MemoryError or a traceback.
"""

from __future__ import annotations

import json
import shutil

import pytest
from fuzzing import assert_one_line, dumps, edge_ints, fuzz_settings, mutated, no_hang
from hypothesis import event, given, strategies as st

from specdec.formats.engine_format import CONFIG_FILE, STAMP_FILE
from specdec.formats.errors import SpecdecError
from specdec.runtime import GenerationConfig, load_orchestrator

pytestmark = pytest.mark.fuzz
PROMPTS = [[1, 5, 6, 7], [1, 9, 10]]
CONFIG = GenerationConfig(max_output_len=6, end_ids=())


@pytest.fixture(scope="module")
def built(built_engine):
    outputs, _ = load_orchestrator(built_engine, num_threads=1).generate(PROMPTS, CONFIG)
    return {"dir": built_engine, "config": json.loads((built_engine / CONFIG_FILE).read_text()), "tokens": [o.output_ids for o in outputs]}


LIMITS = [("build", "max_seq_len"), ("build", "max_batch_size"), ("build", "max_input_len"), ("build", "max_draft_len"), ("model", "vocab_size"),
          ("model", "num_layers"), ("model", "hidden_size"), ("model", "head_dim"), ("model", "num_kv_heads")]


@st.composite
def limits_at_the_edges(draw, valid: dict) -> dict:
    """What a user edits hoping for more: a limit or a width set to a number at the edges."""
    edited = json.loads(json.dumps(valid))
    for section, field in draw(st.lists(st.sampled_from(LIMITS), min_size=1, max_size=2, unique=True)):
        edited[section][field] = draw(st.one_of(edge_ints(), st.sampled_from([2 * valid[section][field], valid[section][field] + 1])))
    return edited


@fuzz_settings(40)
@given(data=st.data(), stamped=st.booleans())
def test_an_edited_config_decodes_as_built_or_is_one_line(built, tmp_path_factory, data, stamped):
    valid = {k: built["config"][k] for k in ("model", "build")}  # what a user edits (files, versions, extra are not read for limits)
    edited = {**built["config"], **data.draw(st.one_of(mutated(valid), limits_at_the_edges(valid)))}
    engine = tmp_path_factory.mktemp("edited") / "engine"
    shutil.copytree(built["dir"], engine)
    if not stamped:  # an engine built before the build stamp
        (engine / STAMP_FILE).unlink()
        edited["files"] = {k: v for k, v in edited["files"].items() if k != STAMP_FILE}
    (engine / CONFIG_FILE).write_text(dumps(edited))
    with no_hang(60, edited):
        try:
            outputs, _ = load_orchestrator(engine, num_threads=1).generate(PROMPTS, CONFIG)
        except SpecdecError as err:
            assert_one_line(err, limit=800)
            event(f"refused ({'stamped' if stamped else 'no stamp'})")
            return
    event(f"decoded ({'stamped' if stamped else 'no stamp'})")
    assert [o.output_ids for o in outputs] == built["tokens"], f"decoded otherwise than built: {json.dumps(edited)[:300]}"
