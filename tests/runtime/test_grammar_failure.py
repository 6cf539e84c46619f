"""llguidance giving up (runtime/grammar.py): refused at compile when every output meets it, recorded by path when
only some outputs do.

The demo tokenizer (a real BPE), real llguidance, no mocks. The schema's one branch is an integer, the other a $ref
cycle with no finite instance: llguidance finds no error up front, and gives up once an output enters the cycle.
"""

from pathlib import Path

import pytest

from specdec.formats.errors import RequestError
from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.grammar import GrammarCompiler, GrammarSpec

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair" / "target"
ENDLESS = {"type": "object", "properties": {"x": {"$ref": "#/$defs/e"}}, "required": ["x"], "additionalProperties": False}
BRANCHES = {"$defs": {"e": ENDLESS}, "anyOf": [{"type": "integer"}, {"$ref": "#/$defs/e"}]}


@pytest.fixture(scope="module")
def compiler():
    tok = Tokenizer(DEMO)
    return GrammarCompiler(tok.to_json(), len(tok.vocab()), [tok.eos_token_id]), tok


def ids(tok, text):
    return tok.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("kind,source,says", [
    ("regex", "[^\\s\\S]", "no token of this model's vocabulary can begin one"),
    ("json_schema", {"$defs": {"e": ENDLESS}, "$ref": "#/$defs/e"}, "every output must begin '{'"),
    ("lark", 'start: a\na: "x" a', "every output must begin"),
])
def test_what_every_output_meets_is_refused_at_compile(compiler, kind, source, says):
    with pytest.raises(RequestError, match="no output satisfies") as err:
        compiler[0].compile(GrammarSpec(kind, source))
    assert says in str(err.value) and "\n" not in str(err.value)


def test_a_draft_path_that_llguidance_gives_up_on_ends_only_an_output_that_takes_it(compiler):
    c, tok = compiler
    state = c.compile(GrammarSpec("json_schema", BRANCHES)).start()
    brace, quote = ids(tok, "{")[0], ids(tok, '"')[0]
    assert state.allowed()[brace]
    # a round reads its rows in order, each after the drafts before it: a draft enters the cycle, llguidance gives up
    state.allowed([brace])
    state.allowed([brace, quote])
    why = state.failed([brace, quote])
    assert why is not None and "llguidance gave up on the request's json_schema after 2 output tokens" in why
    assert state.failed([brace]) is None and state.failed([]) is None
    # the output takes the integer branch instead: the grammar goes on from a fresh matcher as if nothing happened
    one = ids(tok, "1")
    assert state.valid_prefix(one) == 1
    state.commit(one)
    assert state.committed == one and state.allowed().any() and not state.done


def test_an_output_that_takes_the_path_fails_there(compiler):
    c, tok = compiler
    state = c.compile(GrammarSpec("json_schema", BRANCHES)).start()
    path = ids(tok, '{"')
    for t in path:  # target-only decoding: a mask, a token, its commit
        assert state.allowed()[t]
        state.commit([t])
    # llguidance gave up taking the second token: the round ends the request after it, with finish_reason "error"
    assert state.failed(path) is not None and state.committed == path[:1]
    assert not state.done  # never "complete": a matcher that gave up is no finished grammar


def test_a_draft_verified_then_committed_survives_llguidance_failing_to_roll_back(compiler):
    """Found by the fuzzer (tests/runtime/test_fuzz_grammar.py): once a mask was computed after "{" (a draft being
    verified), llguidance could not roll back past it ("rollback: parser error"), and committing that same "{" then
    raised "internal: the output token ... is not allowed": a 500 in the server. The state starts again instead."""
    c, tok = compiler
    state = c.compile(GrammarSpec("json_schema", BRANCHES)).start()
    brace = ids(tok, "{")[0]
    state.allowed([brace])  # row 1 of a verification: the mask after the draft "{"
    state.commit([brace])  # the target accepted it
    assert state.committed == [brace] and state.failure is None and state.allowed().any()


def test_a_schema_nested_past_pythons_recursion_is_one_line(compiler):
    deep: dict = {"type": "string"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    with pytest.raises(RequestError) as err:
        compiler[0].compile(GrammarSpec("json_schema", deep))
    assert "\n" not in str(err.value) and ("recursion limit" in str(err.value) or "nested too deeply" in str(err.value))
