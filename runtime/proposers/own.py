"""Drafters a target engine carries itself, by its build's ``speculative_decoding_mode``.

A medusa target has its Medusa heads in the network; an eagle target has its
EAGLE-3 module as a second engine in its ``eagle/`` folder. What the loader,
the server and the bench need to know of such a drafter is declared once, on
its class (``OwnDrafter``), and which mode carries which method is its
registration's (runtime/methods.py: target_mode): nothing above it branches on
"medusa" or "eagle".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from ..methods import carried_by, own_drafters
from .base import Proposer
from .method import Flag, Method, get_method

if TYPE_CHECKING:
    from ...formats.engine_format import EngineDir
    from ..backends.base import Executor
    from ..tree import DraftTree

# a target's speculative_decoding_mode -> the method of the drafter it carries (runtime/methods.py: target_mode), at import
OWN_DRAFTERS: dict[str, str] = own_drafters()


@dataclass(frozen=True)
class DraftTreeConfig:
    """A target's own drafter's config: a draft tree, or chains."""

    choices: str | Sequence[Sequence[int]] | None = None  # TensorRT-LLM's --medusa_choices format; None: chains


class OwnDrafter(Proposer):
    """A proposer a target engine carries (Medusa, EAGLE): its chains and trees are drafted from the target's own outputs."""

    choices_flag: ClassVar[str]  # the flag of its draft tree, e.g. --medusa_choices
    target: Executor
    samples_drafts = True  # a sampled request's chain, or its tree's children: draws from the drafter's distribution

    @classmethod
    def for_target(cls, target: Executor, choices: str | Sequence[Sequence[int]] | None,
                   open_beside: Callable[[EngineDir], Executor]) -> OwnDrafter:
        """The drafter of the target ``target`` runs. ``open_beside`` opens an engine the drafter needs of its own (EAGLE's
        module) where the target runs; ``choices``: a draft tree, or None for chains."""
        raise NotImplementedError

    def with_tree(self, tree: DraftTree) -> OwnDrafter:
        """The same drafter on the same executors, drafting ``tree``."""
        raise NotImplementedError

    @property
    def max_chain_len(self) -> int:
        """The longest chain it drafts on this target."""
        raise NotImplementedError

    @property
    def default_chain_len(self) -> int:
        """The chain a request gets when nothing chose its length."""
        return self.max_chain_len

    @property
    def default_draft_len(self) -> int:
        """Drafts per round when nothing chose: its tree's nodes, or its default chain."""
        return len(self.tree) if self.tree is not None else self.default_chain_len

    @property
    def label(self) -> str:
        return f"{self.name} {'tree' if self.tree is not None else 'chain'}"


def own_drafter_method(cls: type[OwnDrafter], config: type[DraftTreeConfig], choices_help: str) -> Method:
    """The registration of a drafter a target carries: opened on the target's executor (and, for what it needs of its
    own, beside it), with its tree flag (``cls.choices_flag``) as its one command-line flag."""
    key = cls.choices_flag.removeprefix("--")

    def from_flags(values: Any) -> DraftTreeConfig | None:
        return config(values[key]) if values.get(key) is not None else None

    return Method(name=cls.name, config=config, proposer=cls, flag=cls.choices_flag, flags=(Flag(key, choices_help),), from_flags=from_flags,
                  open=lambda c, context: cls.for_target(context.open_target(), c.choices, context.open_beside), default_config=config)


def own_drafter(mode: str) -> type[OwnDrafter] | None:
    """The drafter class a target built with ``mode`` carries, or None (its drafts come from elsewhere, or none)."""
    name = carried_by(mode)
    return None if name is None else get_method(name).proposer
