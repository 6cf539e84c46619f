"""A grammar cuts drafts before the target sees them (runtime/round.py's trim): a chain at its first forbidden
token, a tree to the nodes whose whole path the grammar allows, with each kept node's parent renumbered and its
score (suffix decoding's, read by draft_len=auto) kept."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np

from specdec.formats.tokenizer import Tokenizer
from specdec.runtime.grammar import GrammarCompiler, GrammarSpec
from specdec.runtime.logits import LogitsProcessor
from specdec.runtime.proposers.base import Draft
from specdec.runtime.round import trim
from specdec.runtime.sampling import SamplingConfig

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-pair" / "target"


def request_with(pattern: str) -> SimpleNamespace:
    tok = Tokenizer(DEMO)
    compiler = GrammarCompiler(tok.to_json(), len(tok.vocab()), [tok.eos_token_id])
    state = compiler.compile(GrammarSpec("regex", pattern)).start()
    return SimpleNamespace(processor=LogitsProcessor(SamplingConfig(temperature=0.0), [], state)), tok


def ids(tok: Tokenizer, chars: str) -> list[int]:
    out = [tok.vocab().get(c) for c in chars]
    assert None not in out, chars
    return out


def test_a_tree_keeps_the_paths_the_grammar_allows_with_their_scores():
    r, tok = request_with("[0-9]{1,3}")
    one, two, a, three, x, four, five = ids(tok, "12a3x45")
    # node:      0    1    2  3      4  5     6
    tokens = [one, two, a, three, x, four, five]
    parents = [-1, 0, 0, 2, -1, 1, 5]  # 2 'a' forbidden; 3 under it; 4 'x' forbidden; 6 makes "1245": four digits
    scores = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3]
    d = Draft(np.array(tokens), None, np.array(parents), np.array([1, 2, 2, 3, 1, 3, 4]), np.array(scores))
    got = trim(r, d)
    assert got.tokens.tolist() == [one, two, four]  # "1", "12", "124"
    assert got.parents.tolist() == [-1, 0, 1]
    assert got.depths.tolist() == [1, 2, 3]
    assert got.scores.tolist() == [0.9, 0.8, 0.4]
    assert got.prefix(2).tokens.tolist() == [one, two]  # still a tree whose prefixes are trees (auto's cut)


def test_a_chain_stops_at_its_first_forbidden_token_and_keeps_its_scores():
    r, tok = request_with("[0-9]+")
    d = Draft(np.array(ids(tok, "12a3")), scores=np.array([0.9, 0.8, 0.7, 0.6]))
    got = trim(r, d)
    assert got.tokens.tolist() == ids(tok, "12") and got.scores.tolist() == [0.9, 0.8] and got.parents is None
    probs = np.full((4, len(tok.vocab())), 1.0 / len(tok.vocab()))  # a draft model's chain: its q rows are cut with it
    got = trim(r, Draft(np.array(ids(tok, "1a23")), probs))
    assert got.tokens.tolist() == ids(tok, "1") and got.probs.shape == (1, len(tok.vocab()))


def test_a_draft_the_grammar_allows_is_returned_as_is():
    r, tok = request_with("[0-9]+")
    d = Draft(np.array(ids(tok, "123")), None, np.array([-1, 0, 0]), np.array([1, 2, 2]), np.array([0.5, 0.4, 0.3]))
    assert trim(r, d) is d


def test_a_drawn_tree_loses_a_forbidden_child_with_its_later_siblings():
    """In a sampled tree (drafts with probabilities) a node's children are tried in the order drawn, each against the
    target's residual after the ones before it: a forbidden child takes the siblings drawn after it along (the
    earlier ones stay, and so do the children of other nodes), each kept node with its q row."""
    r, tok = request_with("[0-9]{1,3}")
    one, two, a, three, four, five = ids(tok, "12a345")
    # node:      0    1  2  3      4      5
    tokens = [one, two, a, three, four, five]
    parents = [-1, -1, -1, -1, 0, 0]  # the root's children 1, 2, 'a', 3 (drawn in that order), then 4 and 5 under "1"
    probs = np.arange(6, dtype=np.float64)[:, None] * np.ones((1, len(tok.vocab())))  # row j marks node j
    got = trim(r, Draft(np.array(tokens), probs, np.array(parents), np.array([1, 1, 1, 1, 2, 2])))
    assert got.tokens.tolist() == [one, two, four, five]  # "3", drawn after 'a', is gone with it
    assert got.parents.tolist() == [-1, -1, 0, 0] and got.probs[:, 0].tolist() == [0, 1, 4, 5]
    kept = trim(r, Draft(np.array(tokens), None, np.array(parents), np.array([1, 1, 1, 1, 2, 2])))
    assert kept.tokens.tolist() == [one, two, three, four, five]  # deterministic nodes: only 'a' goes
