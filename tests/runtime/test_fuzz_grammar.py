"""Fuzzing structured-output constraints through the runtime's grammar (runtime/grammar.py), no model.

Property, for any JSON schema, regex, Lark grammar or choice list (tests/constraint_strategies.py): compiling gives
a grammar or one clean RequestError line, never another exception; and a compiled grammar can always be decoded
to its end: every mask holds at least one token, tokens drawn from the masks (committed one by one, or verified as
drafts first) are taken, and where llguidance gives up the state says so for exactly that output (``failed``)
and never calls itself complete. The demo tokenizer (a real BPE); the walk's tokens come from Hypothesis.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from constraint_strategies import BRANCHES, choices, json_schemas, lark_grammars, regexes
from fuzzing import assert_one_line, fuzz_settings, no_hang
from hypothesis import event, given, strategies as st

from specdec.formats.errors import RequestError
from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.grammar import GrammarCompiler, GrammarSpec

pytestmark = pytest.mark.fuzz
DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair" / "target"
STEPS = 24


@pytest.fixture(scope="module")
def compiler():
    tok = Tokenizer(DEMO)
    compiler = GrammarCompiler(tok.to_json(), len(tok.vocab()), [tok.eos_token_id])
    compiler.openers = [tok.vocab()[c] for c in ("{", "[")]  # what the walk prefers, to go deep (and into endless branches)
    return compiler


def mask_has(allowed: np.ndarray, token: int) -> bool:
    i = np.searchsorted(allowed, token)
    return bool(i < len(allowed) and allowed[i] == token)


specs = st.one_of(
    json_schemas().map(lambda s: GrammarSpec("json_schema", s)),
    regexes().map(lambda r: GrammarSpec("regex", r)),
    lark_grammars().map(lambda g: GrammarSpec("lark", g)),
    choices().map(lambda c: GrammarSpec("choice", c)),
    st.just(GrammarSpec("json_object")),
    st.just(GrammarSpec("json_schema", BRANCHES)),  # where llguidance gives up on some outputs only
)


@fuzz_settings(60)
@given(spec=specs, data=st.data())
def test_a_constraint_compiles_or_is_one_line_and_a_compiled_one_decodes_to_its_end(compiler, spec, data):
    with no_hang(60, spec):
        try:
            grammar = compiler.compile(spec)
        except RequestError as err:
            assert_one_line(err)
            event("refused")
            return
        state = grammar.start()
        output: list[int] = []
        for _ in range(STEPS):
            mask = state.allowed()
            assert mask.any(), "an empty mask: nothing could be picked"
            if state.failed(output):
                event("llguidance gave up on this output")
                assert not state.done
                return
            allowed = np.flatnonzero(mask)
            # a draft of 1-3 tokens, each from its own position's mask, verified before anything is committed
            draft: list[int] = []
            for _ in range(data.draw(st.integers(1, 3))):
                # any allowed token, or one that opens a nested structure where one is allowed
                openers = [o for o in compiler.openers if mask_has(allowed, o)]
                prefer = data.draw(st.integers(0, 3)) > 0  # mostly: a walk that goes deep is where llguidance gives up
                t = data.draw(st.sampled_from(openers) if openers and prefer else st.sampled_from(allowed.tolist()))
                draft.append(t)
                if t in compiler.end_ids or state.failed(output + draft):
                    break
                allowed = np.flatnonzero(state.allowed(draft))
                assert len(allowed), "an empty mask after an allowed draft"
            keep = data.draw(st.integers(1, len(draft)))  # the target accepts a prefix
            for t in draft[:keep]:
                if state.failed(output):
                    break
                state.commit([t])
                output.append(t)
                if t in compiler.end_ids or state.done:
                    event("complete")
                    return
        event("still going")
