"""Fuzzing the parsers of TensorRT-LLM's config strings and draft-tree choices (tests/fuzzing.py says how).

Property: any string gives a correct value or one clean SpecdecError line; nothing else escapes
(RecursionError, OverflowError, ...), whatever the nesting, the size of the numbers or the characters.
"""

from __future__ import annotations

import math
import re

import pytest
from fuzzing import any_text, assert_one_line, deeply_nested, dumps, edge_ints, fuzz_settings, json_values, mutated, no_hang
from hypothesis import given, strategies as st

from specdec.formats.config_strings import DraftTargetConfig, NGramConfig, parse_draft_target_config, parse_ngram_config
from specdec.formats.errors import ConfigStringError, RequestError
from specdec.runtime.proposers.suffix import parse_suffix_config
from specdec.runtime.suffix_cache import ResponseCache
from specdec.runtime.tree import DraftTree, parse_choices

pytestmark = pytest.mark.fuzz

# -- config strings ------------------------------------------------------------------------------


def _lists(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=5)


def config_values() -> st.SearchStrategy:
    """The config strings' own grammar (ints, bools, nested lists), with numbers at the edges."""
    return st.recursive(st.one_of(edge_ints(), st.booleans()), _lists, max_leaves=10)


@st.composite
def written(draw, value) -> str:
    """``value`` written as a user might: any spacing, either spelling of the booleans."""
    space = st.sampled_from(["", " ", "  ", "\t", "\n"])
    if isinstance(value, bool):
        return draw(st.sampled_from(["True", "true"] if value else ["False", "false"]))
    if isinstance(value, int):
        return str(value)
    return "[" + ",".join(draw(space) + draw(written(v)) + draw(space) for v in value) + "]"


config_texts = st.one_of(
    any_text(200),
    config_values().flatmap(written),
    deeply_nested(),
    st.sampled_from(["[4,[0],[0],False]", "[10,2,[0]]", "[4,[0],[0],False", "[4,[0],[0],False]]", "[٣,[0],[0],False]", "[4,[0],[0],None]",
                     "[1" + "0" * 5000 + ",[0],[0],False]", "[-9223372036854775809,[0],[0],False]", "[4,[0],[0],False] x"]),
)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@fuzz_settings(300)
@given(config_texts)
def test_config_strings_give_a_config_or_one_clean_line(text):
    with no_hang():
        for parse in (parse_draft_target_config, parse_ngram_config):
            try:
                cfg = parse(text)
            except ConfigStringError as err:
                assert_one_line(err)
                assert "expected [" in str(err)  # the form, with an example
                continue
            if isinstance(cfg, DraftTargetConfig):
                assert _int(cfg.draft_len) and cfg.draft_len >= 1 and isinstance(cfg.use_logits, bool)
                assert all(_int(d) and -(2**63) <= d < 2**63 for d in cfg.draft_devices + cfg.target_devices)
            else:
                assert isinstance(cfg, NGramConfig) and cfg.max_draft_len >= 1 and cfg.max_matching_ngram_size >= 1
                assert all(_int(d) for d in cfg.devices)


@fuzz_settings(100)
@given(st.integers(1, 2**63 - 1), st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=3),
       st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=3), st.booleans(), st.data())
def test_every_well_formed_config_string_parses_to_what_it_says(draft_len, draft_devices, target_devices, use_logits, data):
    text = data.draw(written([draft_len, draft_devices, target_devices, use_logits]))
    assert parse_draft_target_config(text) == DraftTargetConfig(draft_len, draft_devices, target_devices, use_logits)
    text = data.draw(written([draft_len, draft_len, target_devices]))
    assert parse_ngram_config(text) == NGramConfig(draft_len, draft_len, target_devices)
    # an empty device list is refused (it used to be read as device 0)
    with pytest.raises(ConfigStringError, match="device list"):
        parse_draft_target_config(data.draw(written([draft_len, [], target_devices, use_logits])))
    with pytest.raises(ConfigStringError, match="device list"):
        parse_ngram_config(data.draw(written([draft_len, draft_len, []])))


@pytest.mark.parametrize("text", ["[" * 5000 + "]" * 5000, "[1" + "0" * 5000 + ",[0],[0],False]", "[4,[0],[99999999999999999999],False]"])
def test_config_strings_past_the_limits_are_refused_in_one_line(text):
    # regressions: 5000 brackets raised RecursionError; 5001 digits a ValueError about sys.set_int_max_str_digits
    # inside a 5000-character message; a device id past 64 bits was accepted, to overflow a C long downstream
    with pytest.raises(ConfigStringError) as info:
        parse_draft_target_config(text)
    assert_one_line(info.value, limit=400)


# -- draft-tree choices ---------------------------------------------------------------------------

paths = st.lists(st.lists(edge_ints(), max_size=4), max_size=8)
choices_texts = st.one_of(
    any_text(120),
    json_values().map(dumps),
    paths.map(dumps),
    deeply_nested(),
    st.sampled_from(["[[0],[0,0],[1]]", f"[[{2**70}]]", f"[[0],[0,{2**63}]]", "[[NaN]]", "[[1e400]]", '"\\ud800"', "[[0]]" * 3, "[[true]]"]),
)


@fuzz_settings(300)
@given(choices_texts)
def test_tree_choices_give_a_tree_or_one_clean_line(text):
    with no_hang():
        try:
            tree = parse_choices(text, "--eagle_choices")
        except RequestError as err:
            assert_one_line(err)
            assert str(err).startswith("--eagle_choices")
            return
    assert isinstance(tree, DraftTree) and len(tree) >= 1
    as_paths = set(tree.paths)
    for j, path in enumerate(tree.paths):  # every node's parent is in the tree, before it, and is its path's prefix
        parent = int(tree.parents[j])
        assert (parent == -1) == (len(path) == 1)
        assert parent < j and (parent == -1 or tree.paths[parent] == path[:-1])
        assert path[:-1] in as_paths or len(path) == 1
        assert tree.depths[j] == len(path) and tree.ranks[j] == path[-1]


@pytest.mark.parametrize("text", [f"[[{2**70}]]", f"[[0],[0,{2**63}]]", "[" * 5000 + "]" * 5000])
def test_tree_choices_past_the_limits_are_refused_in_one_line(text):
    # regressions: indices past 64 bits raised OverflowError (numpy), deep nesting RecursionError
    with pytest.raises(RequestError) as info:
        parse_choices(text)
    assert_one_line(info.value, limit=400)


# -- --suffix_config ---------------------------------------------------------------------------------

SUFFIX_VALID = {"max_draft_len": 8, "max_tree_depth": 24, "max_spec_factor": 1.0, "max_spec_offset": 0.0, "min_token_prob": 0.1,
                "global_cache": True, "max_cached_tokens": 1000, "max_cached_responses": 10}
suffix_texts = st.one_of(any_text(80), json_values().map(dumps), deeply_nested(), deeply_nested("{\"a\":", "}"),
                         mutated(SUFFIX_VALID).map(dumps), st.lists(edge_ints(), max_size=3).map(dumps),
                         st.sampled_from(["[8, 24]", "[8]", f"[{10**400}, 24]", '{"max_spec_factor": NaN}', '{"max_spec_offset": Infinity}']))


@fuzz_settings(300)
@given(suffix_texts)
def test_suffix_config_gives_a_config_or_one_clean_line(text):
    with no_hang(what=text):
        try:
            cfg = parse_suffix_config(text)
        except ConfigStringError as err:
            assert_one_line(err)
            return
    assert cfg.max_draft_len >= 1 and cfg.max_tree_depth >= 2 and 0 <= cfg.min_token_prob <= 1
    assert math.isfinite(cfg.max_spec_factor) and cfg.max_spec_factor >= 0 and math.isfinite(cfg.max_spec_offset)  # an offset may be negative


# -- the suffix cache's seed file (JSON lines) -----------------------------------------------------------

seed_lines = st.one_of(mutated({"token_ids": [5, 6, 7]}).map(dumps), mutated({"text": "w5 w6"}).map(dumps), json_values().map(dumps), any_text(40),
                       st.sampled_from(["[" * 100_000 + "]" * 100_000, '{"text": "\\ud800"}', f'{{"token_ids": [{2**70}]}}']))


@fuzz_settings(150)
@given(st.lists(seed_lines, min_size=1, max_size=3), st.booleans())
def test_suffix_seed_lines_load_or_fail_in_one_line(tmp_path_factory, lines, with_tokenizer):
    path = tmp_path_factory.mktemp("seed") / "seed.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", "surrogatepass"))
    cache = ResponseCache()
    with no_hang(what=lines):
        try:
            added = cache.load(path, (lambda text: [5] * (len(text) % 7 + 1)) if with_tokenizer else None)
        except RequestError as err:
            assert_one_line(err)
            assert cache.num_tokens == 0  # every line checked before any is added
            return
    assert 0 <= added <= len(lines) and cache.num_tokens == sum(cache.lengths)


@pytest.mark.parametrize(("content", "message"), [
    (b"[" * 100_000 + b"]" * 100_000, "seed.jsonl:1 nests JSON too deeply"),  # regression: RecursionError
    (b'{"text": "w5 \xff"}', "seed.jsonl:1 is not UTF-8 text (byte 0xff)"),  # regression: UnicodeDecodeError
    (b'{"token_ids": [1180591620717411303424]}', "seed.jsonl:1 is neither"),  # past int64: numpy's OverflowError
])
def test_suffix_seed_file_regressions(tmp_path, content, message):
    (tmp_path / "seed.jsonl").write_bytes(content + b"\n")
    with pytest.raises(RequestError, match=re.escape(message)) as info:
        ResponseCache().load(tmp_path / "seed.jsonl")
    assert_one_line(info.value)


@pytest.mark.parametrize(("text", "message"), [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),  # RecursionError
    (f"[{10**400}, 24]", "max_draft_len must be an integer"),  # float(10**400): OverflowError
    ('{"max_spec_factor": NaN}', "max_spec_factor must be a finite number"),  # was accepted
    ("[" * 200 + "]" * 200, "max_draft_len must be an integer"),  # the 400 brackets, twice, in one 1000-character message
])
def test_suffix_config_regressions(text, message):
    with pytest.raises(ConfigStringError, match=re.escape(message)) as info:
        parse_suffix_config(text)
    assert_one_line(info.value)  # its expected form alone is 300 characters
