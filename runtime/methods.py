"""The drafting methods this runtime knows: each one's name and the module that implements it.

    name     module (runtime/proposers/)   targets that carry it
    draft    draft.py                      (a draft model's engine; cross-tokenizer drafting through text)
    ngram    ngram.py                      (prompt lookup)
    medusa   medusa.py                     --speculative_decoding_mode medusa: its Medusa heads
    eagle    eagle.py                      --speculative_decoding_mode eagle: its EAGLE-3 module
    peagle   peagle.py                     --speculative_decoding_mode peagle: its P-EAGLE module (a block per call)
    suffix   suffix.py                     (suffix decoding)

A request that drafts nothing has the method ``TARGET_ONLY`` ("none"): one
token per target call. This table is all a request, a command line or the
server needs to check a method's name, so it imports nothing: the module of a
method is imported when the method is used, and says the rest in its ``METHOD``
(runtime/proposers/method.py: its typed config, how it opens beside a target,
its default draft length, the target outputs it reads, its command-line
flags). Adding a drafter is one module with a Proposer and a METHOD, and one
``register_method`` call (or one line below).
"""

from __future__ import annotations

from dataclasses import dataclass

TARGET_ONLY = "none"  # the method of a request that does not draft


@dataclass(frozen=True)
class Registered:
    module: str  # the dotted path of the module whose METHOD implements it
    # a target built with this speculative_decoding_mode carries the method's drafter (Medusa heads, an EAGLE module):
    # the loader opens it with every such target; None: it drafts for any target that verifies drafts
    target_mode: str | None = None


_PROPOSERS = "specdec.runtime.proposers"
# name -> its module, in the order the loader opens them and picks the default method (draft > ngram > suffix > a
# target's own drafter): the order of this table, the target's own drafters last
_METHODS: dict[str, Registered] = {
    "draft": Registered(f"{_PROPOSERS}.draft"),
    "ngram": Registered(f"{_PROPOSERS}.ngram"),
    "medusa": Registered(f"{_PROPOSERS}.medusa", target_mode="medusa"),
    "eagle": Registered(f"{_PROPOSERS}.eagle", target_mode="eagle"),
    "peagle": Registered(f"{_PROPOSERS}.peagle", target_mode="peagle"),
    "suffix": Registered(f"{_PROPOSERS}.suffix"),
}


def register_method(name: str, module: str, target_mode: str | None = None) -> None:
    """Make ``module`` (a dotted path whose ``METHOD`` is a runtime.proposers.method.Method named ``name``) a drafting
    method: requests, specdec-run, specdec-serve and ``load_engine(drafters=...)`` take it from now on.

    ``target_mode``: targets built with this --speculative_decoding_mode carry its drafter (it opens with them)."""
    if name == TARGET_ONLY or not name.isidentifier():
        raise ValueError(f"a drafting method needs a name other than {TARGET_ONLY!r}, made of letters, digits and '_'; got {name!r}")
    _METHODS[name] = Registered(module, target_mode)


def method_names() -> tuple[str, ...]:
    """Every method a request may name: TARGET_ONLY first, then the registered ones."""
    return (TARGET_ONLY, *_METHODS)


def registered(name: str) -> Registered:
    """The registration of ``name`` (KeyError for a name nobody registered)."""
    return _METHODS[name]


def own_drafters() -> dict[str, str]:
    """speculative_decoding_mode -> the method whose drafter targets built with it carry."""
    return {r.target_mode: name for name, r in _METHODS.items() if r.target_mode is not None}


def carried_by(mode: str) -> str | None:
    """The method whose drafter targets built with ``mode`` carry, or None."""
    return next((name for name, r in _METHODS.items() if r.target_mode == mode), None)


__all__ = ["TARGET_ONLY", "Registered", "carried_by", "method_names", "own_drafters", "register_method", "registered"]
