"""Drafters a target engine carries itself, by its build's ``speculative_decoding_mode``.

A medusa target has its Medusa heads in the network; an eagle target has its
EAGLE-3 module as a second engine in its ``eagle/`` folder. What the loader,
the server and the bench need to know of such a drafter is declared once, on
its class (``OwnDrafter``), and the mode -> class table is below: nothing
above it branches on "medusa" or "eagle".
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Callable, ClassVar, Sequence

from .base import Proposer

if TYPE_CHECKING:
    from ..backends.base import Executor
    from ...formats.engine_format import EngineDir
    from ..tree import DraftTree

# a target's speculative_decoding_mode -> the class of the drafter it carries, imported when such a target loads
OWN_DRAFTERS: dict[str, str] = {
    "medusa": f"{__package__}.medusa.MedusaProposer",
    "eagle": f"{__package__}.eagle.EagleProposer",
}


class OwnDrafter(Proposer):
    """A proposer a target engine carries (Medusa, EAGLE): its chains and trees are drafted from the target's own outputs."""

    choices_flag: ClassVar[str]  # the flag of its draft tree, e.g. --medusa_choices
    target: "Executor"

    @classmethod
    def for_target(cls, target: "Executor", choices: "str | Sequence[Sequence[int]] | None",
                   open_beside: Callable[["EngineDir"], "Executor"]) -> "OwnDrafter":
        """The drafter of the target ``target`` runs. ``open_beside`` opens an engine the drafter needs of its own (EAGLE's
        module) where the target runs; ``choices``: a draft tree, or None for chains."""
        raise NotImplementedError

    def with_tree(self, tree: "DraftTree") -> "OwnDrafter":
        """The same drafter on the same executors, drafting ``tree`` for greedy requests."""
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


def own_drafter(mode: str) -> type[OwnDrafter] | None:
    """The drafter class a target built with ``mode`` carries, or None (its drafts come from elsewhere, or none)."""
    path = OWN_DRAFTERS.get(mode)
    if path is None:
        return None
    module, name = path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)
