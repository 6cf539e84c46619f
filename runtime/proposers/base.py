"""The proposer interface the engine talks to, keyed by request (vLLM's proposer split).

The engine never asks what kind of proposer it has. Per round it asks for up
to ``draft_lens[i]`` drafts for each of the requests that use this proposer,
verifies them in one target call, and reports back to each request's
proposer what was accepted and what the target computed (``observe``), so a
proposer can update its state: a draft model rolls its KV cache back, an
n-gram pool learns the new tokens, a drafter that reads the target's hidden
states (EAGLE) takes them from the target outputs.

Drafts carry their structure: ``parents[j]`` is the index of draft j's
parent (-1: the request's last accepted token). A chain is ``[-1, 0, 1, ...]``;
a tree verifies several branches in one call (Medusa/EAGLE).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set as AbstractSet
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from ...formats.config_strings import DEFAULT_DRAFT_LEN

if TYPE_CHECKING:
    from ..backends.base import Executor, StepOutput
    from ..kv_cache import KVCache
    from ..pairing import Pairing
    from ..request import Request
    from ..tree import DraftTree


@dataclass
class Draft:
    tokens: np.ndarray  # [k] draft token ids (k may be 0)
    probs: np.ndarray | None = None  # [k, vocab] the draft distributions q (rejection sampling), or None: deterministic drafts
    parents: np.ndarray | None = None  # [k] parent index per draft (-1: the last accepted token); None = a chain
    depths: np.ndarray | None = None  # [k] a tree's depth per draft (1 = a child of the last accepted token)
    scores: np.ndarray | None = None  # [k] each draft's estimated chance of being accepted, best first (suffix decoding's
    #                                   counts): draft_len=auto keeps the prefix that pays (runtime/draft_len.py)
    tree_index: np.ndarray | None = None  # [k] a static tree's draft: each node's index in the proposer's DraftTree
    #                                       (draft_len=auto learns each node's acceptance by it and keeps the nodes that pay)
    fewer_calls: np.ndarray | None = None  # [n, k] a greedy chain refined by n calls (P-EAGLE): row m, the chain m calls
    #                                        would have drafted (--peagle_refine auto learns what each call buys from them)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def drafted(self) -> int:
        """The drafts its proposer drafted for it: a static tree's first nodes up to its last one kept (the nodes a
        sampled node's draws or a grammar left out were drafted too), else its drafts."""
        return int(self.tree_index[-1]) + 1 if self.tree_index is not None and len(self.tree_index) else len(self.tokens)

    def prefix(self, k: int) -> Draft:
        """The first k drafts: still a tree when parents come before children (scored drafts are ordered so). k = 0: the
        shared empty draft (a tree cut to nothing is no tree: the round verifies it as a row without drafts)."""
        if k <= 0:
            return _EMPTY
        cut = lambda a: None if a is None else a[:k]  # noqa: E731
        return Draft(self.tokens[:k], cut(self.probs), cut(self.parents), cut(self.depths), cut(self.scores), cut(self.tree_index),
                     None if self.fewer_calls is None else self.fewer_calls[:, :k])

    def nodes(self, keep: Sequence[int]) -> Draft:
        """A tree's nodes ``keep`` (ascending, each one's parent kept too), renumbered: still a tree, in the same order."""
        if len(keep) == len(self):
            return self
        if not len(keep):
            return _EMPTY
        at = np.asarray(keep, np.int64)
        new = {-1: -1, **{int(j): i for i, j in enumerate(keep)}}
        parents = np.array([new[int(p)] for p in self.parents[at]], np.int64)  # type: ignore[index]  (a tree's)
        pick = lambda a: None if a is None else a[at]  # noqa: E731
        return Draft(self.tokens[at], pick(self.probs), parents, pick(self.depths), pick(self.scores), pick(self.tree_index))

    @staticmethod
    def empty() -> Draft:
        """No drafts (one shared instance: a round asks for it per request, and nothing writes into a draft)."""
        return _EMPTY


_EMPTY = Draft(np.zeros(0, np.int64))
_EMPTY.tokens.flags.writeable = False


@dataclass
class TargetOutput:
    """What the target computed for one request in a verification call. The arrays are views of the call's
    outputs (StepOutput), valid until the target's next call on the engine's cache: a proposer copies what it keeps."""

    logits: np.ndarray  # [k + 1, vocab] the rows of the fed tokens (last accepted token + drafts)
    num_accepted: int  # drafts kept
    emitted: list[int]  # the accepted drafts + the recovered or bonus token
    rows: list[int]  # the rows of the kept tokens in the call (0 = the last accepted token): 0..n for a chain,
    #                  the accepted path for a tree; rows[-1] is the row whose logits gave the recovered/bonus token
    # the target's extra outputs this proposer reads (Proposer.target_outputs), on the same rows: name -> [k + 1, *tail]
    extras: Mapping[str, np.ndarray] = field(default_factory=dict)


def kept_rows(a: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    """A copy of ``a``'s ``rows`` (ascending from 0, as TargetOutput.rows and a round's kept rows are): a slice's copy when
    they are 0..n (a chain, a round without drafts), about a fifth of fancy indexing's cost per request and round."""
    return a[: len(rows)].copy() if rows[-1] == len(rows) - 1 else a[rows]


def kept(a: np.ndarray, rows: Sequence[int]) -> np.ndarray:
    """``a``'s ``rows`` as kept_rows picks them, for a caller that copies them itself: a view when they are 0..n."""
    return a[: len(rows)] if rows[-1] == len(rows) - 1 else a[rows]


class Proposer(Protocol):
    """A drafting method. Its optional parts are declared, never probed for: a proposer class subclasses this
    protocol and overrides the defaults below that apply to it."""

    name: ClassVar[str]  # the method it implements (runtime/methods.py): draft | ngram | medusa | eagle | peagle | suffix
    # a draft model's own engine, beside the target: the Engine pairs it with the target (vocabulary, limits) and
    # sets vocab_limit; None for drafters that use the target's own outputs or the text (n-gram, Medusa, EAGLE)
    executor: Executor | None = None
    vocab_limit: int | None = None  # set by the Engine for a proposer with an executor: the ids both vocabularies share
    tree: DraftTree | None = None  # a static draft tree it drafts for every request (draft_len=auto leaves its size alone)
    # the largest draft_len a request may ask of it, from its own config (n-gram: --ngram_config's max_draft_len; a
    # server refuses more); None: only the target's limit (the rest is capped per round by room())
    max_draft_len: int | None = None
    # its drafts carry each node's estimated chance of being accepted (Draft.scores, best first): with draft_len=auto
    # the round asks for its most and keeps the prefix that pays (suffix decoding)
    scores_drafts: bool = False
    # the target's extra outputs it drafts from, by name (engine_format.extra_io: a medusa target's medusa_logits, an
    # eagle target's eagle_hidden): ``prefilled`` reads them in the prefill's StepOutput.extras, and ``observe`` gets
    # them on the request's fed rows in TargetOutput.extras. Its registration checks the target has them.
    target_outputs: ClassVar[tuple[str, ...]] = ()
    # drafts per round when nothing chose: its config's (a draft-target config's draft_len, n-gram's and suffix
    # decoding's max_draft_len, a Medusa or EAGLE tree's nodes), else DEFAULT_DRAFT_LEN
    default_draft_len: int = DEFAULT_DRAFT_LEN
    draft_len_name: ClassVar[str] = "draft_len"  # how an error names its default draft length (n-gram: its config's)
    # its executor's token ids are not the target's (a draft with another tokenizer drafts through text): the Engine
    # does not check the two vocabularies against each other
    own_vocabulary: ClassVar[bool] = False
    pairing: Pairing | None = None  # how its draft model was paired with the target, when its method checked (runtime/pairing.py)
    # it drafts any number of tokens (a chain, a tree) in one model call (P-EAGLE): draft_len=auto prices a drafting
    # round at one draft step, not one per draft
    drafts_in_one_call: bool = False
    # a sampled request's drafts are drawn from the drafter's own distribution and verified by rejection sampling (a
    # draft model with use_logits, Medusa, EAGLE, P-EAGLE): its sample follows the drafts. False: drafts without their
    # distribution, verified by token compare, whose sample is target-only's for the seed (runtime/sampling.py: TargetDraws)
    samples_drafts: bool = False
    # the most refining calls (P-EAGLE: module calls after the one that drafts, each reading its drafts) the draft policy
    # chooses among per request and round (Request.refine_calls); 0: it refines as configured, or not at all
    auto_refine_calls: int = 0
    # the last propose's refining calls and their seconds, timed apart from the call that drafted
    refined: tuple[int, float] = (0, 0.0)
    # requests whose backlog passed what it keeps unfed (EAGLE: MAX_PENDING pairs of features): the round feeds them
    # (catch_up) whether or not they draft
    overdue: AbstractSet[str] = frozenset()

    @property
    def label(self) -> str:
        """What it drafts with, as specdec-run's tables name it."""
        return self.name

    def add(self, requests: Sequence[Request]) -> None:
        """Start these requests: each has its prompt and the first token the target picked."""

    def prefilled(self, requests: Sequence[Request], step: StepOutput, first_slot: int) -> None:
        """Right after ``add``: the target has just prefilled ``requests`` in slots first_slot.. (row
        ``r.slot - first_slot`` of ``step``, the prefill call's outputs). A proposer that reads the target's own
        outputs (Medusa: its heads on the last prompt row; EAGLE: the prompt's features) overrides this."""

    def remove(self, request_id: str) -> None:
        """The request finished or was aborted: free what it holds. Also called after an ``add`` that an error or an
        interrupt cut short (the engine cannot know how far it got): a request held in part or not at all is no error."""

    def backlog(self, request: Request) -> int:
        """Tokens of the request its own model has not been fed yet (a draft model's prompt, held back until the
        request first drafts under draft_len=auto; the tokens emitted while it did not draft): what ``catch_up``
        would feed. 0 for a proposer without a model of its own."""
        return 0

    def catch_up(self, requests: Sequence[Request]) -> int:
        """Feed these requests' backlogs now (the round times it apart from drafting); the tokens fed."""
        return 0

    def room(self, request: Request) -> int:
        """The most drafts this request can take this round (the proposer's own limits)."""

    def propose(self, requests: Sequence[Request], draft_lens: Sequence[int]) -> list[Draft]:
        """Up to ``draft_lens[i]`` drafts following each request's last token."""

    def observe(self, request: Request, draft: Draft, target: TargetOutput) -> None:
        """The target verified ``draft``: ``target.num_accepted`` kept, ``target.emitted`` appended."""

    def observe_plain(self, requests: Sequence[Request], step: StepOutput, tokens: Sequence[int], vocab_limit: int | None) -> None:
        """``observe`` for the round's requests that took no drafts, all at once, before any of them is appended to:
        request i's one new token is ``tokens[i]``, from row 0 of its slot in ``step`` (the round's verification call;
        logits cut to ``vocab_limit``). This default observes each one as the round would; a proposer with per-request
        work to save overrides it (EAGLE: one row of features a request, no TargetOutput)."""
        names = self.target_outputs
        for r, t in zip(requests, tokens, strict=True):
            extras = {name: step.extras[name][r.slot, :1] for name in names}
            self.observe(r, Draft.empty(), TargetOutput(step.logits[r.slot, :1, :vocab_limit], 0, [t], [0], extras))

    def measure_costs(self, batches: Sequence[int]) -> tuple[dict[int, float], dict[int, float]] | None:
        """Its costs timed before any request (Engine.measure_step_costs): rows -> seconds of a draft step, tokens ->
        seconds of a catch-up feed; None where draft_len=auto learns them online."""
        return None


def adjacent_runs(slots: Sequence[int]) -> list[list[int]]:
    """Sorted cache slots grouped into runs of adjacent ones ([0, 1, 3] -> [[0, 1], [3]]): one ragged call per run
    feeds only the slots that need it, with no other row riding along."""
    runs: list[list[int]] = []
    for s in slots:
        if runs and runs[-1][-1] == s - 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return runs


def free_slot(request_id: str, slot_of: dict[str, int], order: list[str], cache: KVCache,
              copy_slot: Callable[[KVCache, int, int], None]) -> bool:
    """Free a request's slot in a drafter's own cache (order[s]: the request in slot s; slot_of its inverse), keeping the
    running slots 0..n-1: the last request's rows move into the hole (copy_slot(cache, src, dst)). False where the
    request held no slot (an ``add`` cut short before it took this one)."""
    if request_id not in slot_of:
        return False
    slot, last = slot_of.pop(request_id), len(order) - 1
    if slot != last:
        moved = order[last]
        copy_slot(cache, last, slot)
        order[slot], slot_of[moved] = moved, slot
    order.pop()
    cache.lengths[last] = 0
    return True
