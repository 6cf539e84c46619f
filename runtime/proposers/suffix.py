"""Suffix decoding (ArcticInference; vLLM's ``method: suffix``): drafts from what followed this context before.

Two places to look, as ArcticInference does:

* the request's own tokens (prompt + output so far): a ``TokenStore`` per request;
* the global cache of finished responses (``ResponseCache``, one per engine,
  LRU-bounded; ``global_cache=False`` turns it off, ``seed_file`` fills it
  from earlier responses at start). Each response goes in behind the last
  ``cached_prompt_tokens`` tokens of its prompt: ArcticInference caches the
  response alone, so a new response's first tokens, before it has repeated
  enough of an earlier one to match, are never drafted; with the prompt's
  end in front, a prompt that ends as an earlier one did drafts that
  response from its first token.

Each round, each store proposes its best frequency-scored draft for the
request's last tokens (runtime/suffix_index.py: the budget grows with the
match length, nodes below ``min_token_prob`` are dropped) and the draft with
the higher score wins (the request's own on a tie). No model runs.

Trees: a target built with tree attention (``--speculative_decoding_mode
medusa``, ``eagle`` or ``peagle``) verifies the whole frequency tree in one
call (runtime/tree.py: a greedy request keeps the longest path of the
target's argmaxes, a sampled one draws the target's own token at each node
and goes on into the child holding it). Otherwise the draft is the tree's
most frequent path, a chain. A sampled request's drafts are verified by
token compare, which for a deterministic draft is rejection sampling with a
one-hot q: the output is distributed as the target's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np

from ...formats.config_strings import INT64, shown, shown_value
from ...formats.errors import ConfigStringError
from ..request import Request
from ..suffix_cache import ResponseCache
from ..suffix_index import SpecParams, SuffixDraft, TokenStore, best_draft
from .base import Draft, Proposer, TargetOutput
from .method import Flag, Method, OpenContext

SUFFIX_FORM = ("[max_draft_len, max_tree_depth] or a JSON object with any of max_draft_len, max_tree_depth, max_spec_factor, "
               "max_spec_offset, min_token_prob, global_cache, max_cached_tokens, max_cached_responses, cached_prompt_tokens, seed_file")
SUFFIX_EXAMPLE = '{"max_draft_len": 8, "min_token_prob": 0.1, "global_cache": true}'


@dataclass(frozen=True)
class SuffixConfig:
    max_draft_len: int = 8  # nodes per round at most (and the target's max_draft_len)
    max_tree_depth: int = 24  # match + draft at most this many tokens (vLLM's suffix_decoding_max_tree_depth)
    max_spec_factor: float = 1.0  # drafts <= factor * match length + offset
    max_spec_offset: float = 0.0
    min_token_prob: float = 0.1
    global_cache: bool = True  # also draft from finished responses
    max_cached_tokens: int = 1_000_000  # the global cache's caps (least recently used leave first)
    max_cached_responses: int = 10_000
    # the last this many prompt tokens join the global cache in front of each response: a new prompt that ends
    # as an earlier one did then drafts that response from its first token (responses alone match only once
    # the new response has repeated a few of their tokens)
    cached_prompt_tokens: int = 16
    seed_file: str | None = None  # JSON lines of earlier responses to start the global cache with

    @property
    def params(self) -> SpecParams:
        return SpecParams(self.max_tree_depth, self.max_spec_factor, self.max_spec_offset, self.min_token_prob)


def parse_suffix_config(text: str, flag: str = "--suffix_config") -> SuffixConfig:
    """``[max_draft_len, max_tree_depth]`` (the --ngram_config style) or a JSON object of SuffixConfig's fields."""

    def fail(why: str) -> ConfigStringError:
        return ConfigStringError(f"{flag} {shown(text)} is malformed ({why}); expected {SUFFIX_FORM}, e.g. {flag} '{SUFFIX_EXAMPLE}'.")

    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise fail(err.msg) from None
    except RecursionError:  # json nests by recursion; the form nests one level
        raise fail("nested too deeply") from None
    names = [f.name for f in fields(SuffixConfig)]
    if isinstance(value, list):
        if not 1 <= len(value) <= 2:
            raise fail(f"a list holds 1 or 2 numbers, found {len(value)}")
        value = dict(zip(names, value, strict=False))
    if not isinstance(value, dict):
        raise fail("neither a list nor an object")
    unknown = sorted(set(value) - set(names))
    if unknown:
        raise fail(f"unknown key {unknown[0]!r}")
    kinds = {"global_cache": bool, "seed_file": str, "max_spec_factor": float, "max_spec_offset": float, "min_token_prob": float}
    for key, v in value.items():
        want = kinds.get(key, int)
        number = isinstance(v, (int, float)) and not isinstance(v, bool) and -INT64 <= v < INT64 and math.isfinite(v)  # and fits a C long
        ok = isinstance(v, bool) if want is bool else isinstance(v, str) if want is str else number and (want is float or float(v).is_integer())
        if not ok:
            what = 'true or false' if want is bool else 'a path' if want is str else 'a finite number' if want is float else 'an integer'
            raise fail(f"{key} must be {what}, found {shown_value(v, 40)}")
        if want is int:
            value[key] = int(v)
    cfg = SuffixConfig(**value)
    for bad, why in ((cfg.max_draft_len < 1, f"max_draft_len must be >= 1, found {cfg.max_draft_len}"),  # each says only what failed
                     (cfg.max_tree_depth < 2, f"max_tree_depth must be >= 2, found {cfg.max_tree_depth}"),
                     (not 0.0 <= cfg.min_token_prob <= 1.0, f"min_token_prob must be in [0, 1], found {cfg.min_token_prob}"),
                     (cfg.max_spec_factor < 0, f"max_spec_factor must be >= 0, found {cfg.max_spec_factor}"),
                     (cfg.cached_prompt_tokens < 0, "cached_prompt_tokens must be >= 0 (0: responses alone)"),
                     (cfg.max_cached_tokens < 1, "max_cached_tokens must be >= 1 (turn the cache off with global_cache: false)"),
                     (cfg.max_cached_responses < 1, "max_cached_responses must be >= 1 (turn the cache off with global_cache: false)")):
        if bad:
            raise fail(why)
    return cfg


class SuffixProposer(Proposer):
    name = "suffix"
    draft_len_name = "suffix max_draft_len"  # its default draft length is its config's limit
    scores_drafts = True  # each node carries its estimated acceptance: draft_len=auto trims the draft it returns

    def __init__(self, config: SuffixConfig = SuffixConfig(), trees: bool = False, cache: ResponseCache | None = None):
        """trees: the target verifies trees (tree attention); cache: a global cache to share (default: a new one
        when config.global_cache)."""
        self.config = config
        self.max_draft_len = config.max_draft_len
        self.default_draft_len = config.max_draft_len
        self.params = config.params
        self.trees = trees
        if cache is None and config.global_cache:
            cache = ResponseCache(config.max_cached_tokens, config.max_cached_responses)
        self.cache = cache if config.global_cache else None
        self.stores: dict[str, TokenStore] = {}
        self.prompt_len: dict[str, int] = {}

    def add(self, requests: Sequence[Request]) -> None:
        for r in requests:
            store = self.stores[r.request_id] = TokenStore()
            store.append(list(r.prompt_ids) + list(r.output_ids))
            self.prompt_len[r.request_id] = len(r.prompt_ids)

    def remove(self, request_id: str) -> None:
        """The request ended: its response joins the global cache, behind its prompt's last tokens."""
        store, prompt_len = self.stores.pop(request_id, None), self.prompt_len.pop(request_id, None)
        if store is None or prompt_len is None:
            return  # an add cut short before it took this one
        start = 1 + prompt_len  # position 0 is the store's separator
        if self.cache is not None and store.size > start:
            self.cache.add(store.tokens[max(1, start - self.config.cached_prompt_tokens) :])

    def room(self, request: Request) -> int:
        return self.config.max_draft_len

    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        return [self._draft(r, int(k)) for r, k in zip(requests, draft_lens, strict=True)]

    def best(self, request: Request, limit: int, tree: bool) -> SuffixDraft:
        """The better of the request's own draft and the global cache's (the request's own on a tie)."""
        store = self.stores[request.request_id]
        context = store.tokens[-(self.params.max_depth - 1):].tolist()
        draft = best_draft(store, context, limit, self.params, tree)
        if self.cache is not None and limit > draft.score:
            other = self.cache.speculate(context, limit, self.params, tree)
            if other.score > draft.score:
                self.cache.touch(other)
                draft = other
        return draft

    def _draft(self, r: Request, k: int) -> Draft:
        if k <= 0:
            return Draft.empty()
        tree = self.trees
        found = self.best(r, min(k, self.config.max_draft_len), tree)
        tokens = np.array(found.tokens, np.int64)
        scores = np.array(found.probs, np.float64)  # best first: a tree's nodes as taken, a path in order
        if not tree or not len(tokens):
            return Draft(tokens, scores=scores)
        parents = np.array(found.parents, np.int64)
        depths = np.ones(len(parents), np.int64)
        for j, p in enumerate(found.parents):  # parents come first: one pass
            if p >= 0:
                depths[j] = depths[p] + 1
        return Draft(tokens, parents=parents, depths=depths, scores=scores)

    def observe(self, request: Request, draft: Draft, target: TargetOutput) -> None:
        self.stores[request.request_id].append(target.emitted)


# -- the method's registration (runtime/methods.py) -------------------------------------------------------------
def open_suffix(config: SuffixConfig, context: OpenContext) -> SuffixProposer:
    """Suffix decoding on this target: trees where it verifies them; the global cache seeded from the config's file."""
    target = context.target
    proposer = SuffixProposer(config, trees=bool(target.config.build.tree_attention))
    if config.seed_file and proposer.cache is not None:
        encode = None
        if target.tokenizer_path is not None:
            from ...formats.tokenizer import Tokenizer

            encode = Tokenizer(target.path).encode
        proposer.cache.load(config.seed_file, encode)
    return proposer


METHOD = Method(
    name="suffix",
    config=SuffixConfig,
    open=open_suffix,
    proposer=SuffixProposer,
    flag="--suffix_config",
    flags=(Flag("suffix_config", "Suffix decoding (no draft model: drafts what followed the request's last tokens in its own text and in "
                f"earlier responses; its global cache lives as long as the engine): {SUFFIX_FORM}, e.g. '{SUFFIX_EXAMPLE}' "
                "(docs/suffix-decoding.md)."),),
    from_flags=lambda values: parse_suffix_config(values["suffix_config"]) if values.get("suffix_config") else None,
    limit_name="suffix decoding's max_draft_len",
)
