"""What a drafting method's module declares (its ``METHOD``), and the context its drafter opens in.

TensorRT-LLM's PyTorch backend has one config class per speculative method,
registered by name; the loader and the CLI look a method up, they do not list
methods. Here the table of names is runtime/methods.py, and each method's
module says, in one ``Method``:

    name            what requests, --speculative_method and the server's speculative.method say
    config          its typed config class (DraftModelConfig, NGramConfig, SuffixConfig, MedusaConfig, ...)
    open            config + OpenContext -> its Proposer, beside the target
    flag            the flag that asks for it, for messages (--ngram_config)
    flags           its command-line flags (specdec-run and specdec-serve add them: cli/method_flags.py)
    from_flags      those flags' values -> its config, or None when it was not asked for
    target_devices  the target's device ids its config names (TensorRT-LLM's config strings carry them)

and its proposer says the rest (runtime/proposers/base.py: ``default_draft_len``,
``target_outputs``, ``max_draft_len``, ``label``). ``load_engine`` opens the
drafters of the configs it is given, and the one a target carries
(runtime/methods.py: target_mode) whether or not a config was given.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..methods import registered

if TYPE_CHECKING:
    from ...formats.engine_format import EngineDir
    from ..backends.base import Executor, Placement
    from .base import Proposer


@dataclass(frozen=True)
class Flag:
    """One command-line flag of a method: ``--name`` (and ``--name-with-dashes``), as specdec-run and specdec-serve take it."""

    name: str
    help: str
    type: type = str  # str | int | float | bool (bool: an on/off pair, with ``off``)
    default: Any = None
    aliases: tuple[str, ...] = ()  # more names of the same flag, e.g. --prompt_lookup_config
    off: str | None = None  # a bool's flag that turns it off, e.g. --ngram_keep_newest
    path: bool = False  # a file or directory (shown as PATH)


@dataclass(frozen=True)
class OpenContext:
    """Where a drafter opens: the target engine, where it runs, and how to open engines beside it (runtime/loading.py)."""

    target: EngineDir
    placement: Placement  # the target's
    allow_vocab_mismatch: bool
    open_target: Callable[[], Executor]  # the target's executor (opened once): a drafter that reads the target's outputs
    # an engine of the drafter's own, on these device ids (checked to fit beside the target first)
    open_own: Callable[[EngineDir, list[int]], Executor]
    open_beside: Callable[[EngineDir], Executor]  # an engine the target carries (an EAGLE module), on the target's device
    load: Callable[[Any], EngineDir]  # a path (or an EngineDir) -> the verified EngineDir (the loader's verify mode)


@dataclass(frozen=True)
class Method:
    """A drafting method, as its module declares it (``METHOD``)."""

    name: str
    config: type  # its typed config; load_engine(drafters=[config, ...]) opens the drafter of each
    open: Callable[[Any, OpenContext], Proposer]  # (config, context) -> its proposer
    proposer: type  # the class of the proposer it opens (docs and the mode table name it)
    flag: str  # the flag that asks for it, in messages: --draft_engine_dir, --ngram_config, --medusa_choices
    flags: tuple[Flag, ...] = ()
    from_flags: Callable[[Mapping[str, Any]], Any] = lambda values: None  # the values of ``flags`` by name -> its config, or None when not asked for
    target_devices: Callable[[Any], list[int] | None] = lambda config: None  # the target's device ids its config names
    default_config: Callable[[], Any] | None = None  # a target's own drafter: its config when none was given
    limit_name: str = ""  # how messages name its config's max_draft_len (Proposer.max_draft_len), e.g. "the n-gram pool's max_draft_len"

    @property
    def target_mode(self) -> str | None:
        """Targets built with this speculative_decoding_mode carry its drafter (runtime/methods.py)."""
        return registered(self.name).target_mode

    @property
    def loaded_by(self) -> str:
        """How a server or a run gets this method, for messages."""
        mode = self.target_mode
        return f"a target engine built with --speculative_decoding_mode {mode}" if mode else self.flag


def get_method(name: str) -> Method:
    """The registered method ``name``, its module imported now (KeyError for a name nobody registered)."""
    method = importlib.import_module(registered(name).module).METHOD
    if method.name != name:
        raise ValueError(f"{registered(name).module} implements the method {method.name!r}, registered as {name!r}")
    return method


def method_of(config: Any, names: tuple[str, ...]) -> Method:
    """The method among ``names`` whose config class ``config`` is (TypeError for anything else)."""
    for name in names:
        m = get_method(name)
        if isinstance(config, m.config):
            return m
    raise TypeError(f"{type(config).__name__} is not the config of a drafting method ({', '.join(names)}).")
