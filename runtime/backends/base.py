"""What every backend implements, and the checks every executor runs before a call.

An executor runs one engine on one device. The loop above it (runtime/engine.py)
never touches a KV tensor: it asks for a cache of ``num_slots`` rows, feeds
tokens to a contiguous range of slots, moves a slot when a request leaves,
and moves lengths back to roll drafts back. Everything else (where the
cache lives, how inputs reach the device, how outputs come back) is the
executor's.

A backend module (one per (engine backend, device kind), named in the registry
of runtime/backends/__init__.py) implements ``Backend``: it opens executors,
counts its devices and checks a placement before anything is allocated.
This module imports no backend, so it loads on any host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

import numpy as np

from ...formats.engine_format import BuildConfig, EngineDir, ExtraTensor, ModelConfig
from ...formats.errors import EngineError, RequestError
from ..kv_cache import KVCache

DEVICE_KINDS = ("cpu", "cuda")


class Setups:
    """Calls that paid a one-time setup on the way, process-wide: an executor adds one when a call captures a CUDA graph
    (tens of ms beside a step of a few). A timing that spans one is not what the call's shape costs, so draft_len=auto
    leaves it out (runtime/round.py); a graph is per cache, so a draft model's or a new batch bucket's first call of a
    shape comes mid-run, after step_costs timed the engine's own cache."""

    count = 0

NO_EXTRAS: Mapping[str, np.ndarray] = MappingProxyType({})  # an engine without extra inputs or outputs (shared, read-only)


@dataclass(frozen=True)
class StepOutput:
    """What one ``forward()`` computed, on the host. The arrays are buffers of the call's cache, valid until the next
    forward() on that cache (a call on another cache leaves them alone): copy what must be kept longer."""

    logits: np.ndarray  # [n, rows, vocab]: rows = the call's widest row if all_logits, else 1 (each row's last token)
    # the engine's extra outputs by name, as its config declares them (engine_format.extra_io: ExtraTensor): a per_token
    # one is [n, width, *tail] (every fed token), the others [n, rows, *tail] (the logits rows). The executor binds them
    # once per call shape; which a proposer reads is its own business (Proposer.target_outputs).
    extras: Mapping[str, np.ndarray] = field(default_factory=dict)


@runtime_checkable
class Executor(Protocol):
    """One engine on one device (the engine ABI: docs/engine-format.md). Every call the loop and the proposers make
    is here; an executor that cannot do one (trees, extra inputs) refuses it with an EngineError."""

    engine: EngineDir
    model: ModelConfig
    build: BuildConfig
    vocab_size: int
    device: str  # where it runs, for messages: "cpu", "cuda:0"
    tree_attention: bool  # forward(parents=...) verifies trees, and compact_slot keeps any accepted path
    extra_outputs: frozenset[str]  # the names forward() returns in StepOutput.extras (engine_format.extra_io)
    extra_inputs: frozenset[str]  # the names forward(extra_inputs=) needs on every call (engine_format.extra_io)

    def new_cache(self, num_slots: int) -> KVCache:
        """A KV cache of ``num_slots`` rows (<= build.max_batch_size), every length 0."""

    def forward(
        self,
        cache: KVCache,
        tokens: Sequence[Sequence[int]] | np.ndarray,
        all_logits: bool,
        advance: np.ndarray | None = None,
        first_slot: int = 0,
        parents: Sequence[np.ndarray | None] | None = None,
        extra_inputs: Mapping[str, np.ndarray] | None = None,
    ) -> StepOutput:
        """Append ``tokens[i]`` to slot ``first_slot + i``; the logits (and the engine's extra outputs) on the host.

        tokens: one non-empty sequence per slot of the range (ragged allowed).
        ``logits`` is ``[n, num_tokens, vocab]`` if ``all_logits`` (positions past a row's
        own count are padding), else ``[n, 1, vocab]`` for each row's last token.
        The arrays are reused by the next call on ``cache``: copy what must be kept. Rows where
        ``advance`` is False ride along and keep their length (what they wrote is
        stale at once). ``parents``: per row, None or a tree's parent per token
        (``tree_attention`` executors; the others refuse one: ``refuse_trees``).
        ``extra_inputs``: name -> [n, num_tokens, *tail] float32, one array per name of ``extra_inputs`` (required
        by an engine that declares them, e.g. an EAGLE module's hidden_states; executors that bind none refuse any:
        ``refuse_extra_inputs``).
        """

    def copy_slot(self, cache: KVCache, src: int, dst: int) -> None:
        """Copy slot ``src``'s live K/V (its first ``lengths[src]`` positions) to slot
        ``dst`` and set ``lengths[dst]``: the loop keeps running requests in slots
        ``0..n-1`` by moving the last one into a freed slot."""

    def clear_slot(self, cache: KVCache, slot: int) -> None:
        """Zero slot ``slot``'s K/V at every position and set its length to 0. Positions past a slot's length are
        masked, but a masked NaN still poisons attention (a zero weight times NaN is NaN): the loop clears the slot
        of a request that ended on non-finite logits before another request uses it (runtime/scheduler.py)."""

    def compact_slot(self, cache: KVCache, slot: int, start: int, keep: Sequence[int]) -> None:
        """After a verification fed at ``start``: keep the K/V of the call's tokens ``keep`` (ascending, keep[0] = 0)
        in positions start, start + 1, ... and set the slot's length to start + len(keep). A chain's ``keep`` is
        0..n (a rollback, which every executor does: ``compact_chain``); a tree's path needs ``tree_attention``."""

    def new_prefix_pool(self, num_slots: int) -> KVCache:
        """A second cache of ``num_slots`` slots (any number) that holds cached prefixes (runtime/prefix_cache.py): it
        is only copied from and into (``copy_prefix``), never run. An executor that cannot hold a second cache refuses
        with an EngineError (``refuse_prefix_pool``), and prefix caching is off on it."""

    def copy_prefix(self, src: KVCache, src_slot: int, dst: KVCache, dst_slot: int, length: int) -> None:
        """Copy the K/V of positions 0..length-1 of ``src``'s slot ``src_slot`` into ``dst``'s slot ``dst_slot`` and set
        its length: ``src`` and ``dst`` are this executor's caches or prefix pools (the same one, or two of them)."""


def refuse_trees(parents, engine: str) -> None:
    """An executor without tree attention verifies chains only: a forward() with a tree is an error, not a chain."""
    if parents is not None and any(p is not None for p in parents):
        raise EngineError(f"{engine} was built without tree attention, or runs on an executor without it: it verifies chains only "
                          "(rebuild with --speculative_decoding_mode medusa or eagle, and run it with the onnxruntime backend: CPU or --device "
                          "cuda).")


def refuse_extra_inputs(given: Mapping[str, np.ndarray] | None, engine: str) -> None:
    """An executor that binds no extra inputs (engines that declare some run on the onnxruntime executors) refuses any."""
    if given:
        raise EngineError(f"{engine}: this executor takes no extra inputs (given: {', '.join(given)}); engines with extra inputs run on the "
                          "onnxruntime backend, CPU or --device cuda.")


def check_extra_inputs(given: Mapping[str, np.ndarray] | None, declared: Sequence[ExtraTensor], rows: int, tokens: int, engine: str) -> None:
    """A forward()'s extra inputs against the engine's: every declared one, [rows, tokens, *tail], and nothing else."""
    given = given or NO_EXTRAS
    for t in declared:
        arr = given.get(t.name)
        if arr is None or arr.shape != (rows, tokens, *t.tail):
            raise EngineError(f"{engine} takes an extra input {t.name} [{', '.join(map(str, (rows, tokens, *t.tail)))}] on every call"
                              + ("" if arr is None else f", given {list(arr.shape)}") + ".")
    if len(given) != len(declared):
        unknown = sorted(set(given) - {t.name for t in declared})
        known = f" (its extra inputs: {', '.join(t.name for t in declared)})." if declared else "."
        raise EngineError(f"{engine} takes no {', '.join(unknown)} input" + known)


def refuse_prefix_pool(engine: str, why: str) -> None:
    """An executor that cannot hold cached prefixes beside its cache: prefix caching is off on it."""
    raise EngineError(f"prefix caching is not available for {engine}: {why}. Run without it (--no-enable-prefix-caching), "
                      "or on the onnxruntime backend (CPU or --device cuda).")


def compact_chain(cache: KVCache, slot: int, start: int, keep: Sequence[int], engine: str) -> None:
    """compact_slot for an executor without tree attention: a chain's kept tokens already sit in place (a rollback)."""
    if list(keep) != list(range(len(keep))):
        raise EngineError(f"{engine} verifies chains only: it cannot keep the tree path {list(keep)} (tree drafting runs on the onnxruntime backend, "
                          "CPU or --device cuda).")
    cache.rollback(slot, start + len(keep))


def pad_tokens(tokens: Sequence[Sequence[int]] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ragged rows -> (ids [n, width] zero-padded, num_new [n]); every row needs a token."""
    if isinstance(tokens, np.ndarray) and tokens.ndim == 2:
        if tokens.shape[1] < 1:
            raise RequestError("every row needs at least one token per step.")
        return np.ascontiguousarray(tokens, dtype=np.int64), np.full(tokens.shape[0], tokens.shape[1], np.int64)
    batch = len(tokens)
    if batch < 1:
        raise RequestError("a step needs at least one row of tokens.")
    lens = [len(t) for t in tokens]  # a few rows: Python ints cost less than numpy calls, every step
    width = max(lens)
    if min(lens) == width > 0:  # not ragged: one conversion
        return np.array(tokens, np.int64).reshape(batch, width), np.array(lens, np.int64)
    if min(lens) < 1:
        raise RequestError("every row needs at least one token per step.")
    ids = np.zeros((batch, width), np.int64)
    for row, t in enumerate(tokens):
        ids[row, : len(t)] = t
    return ids, np.array(lens, np.int64)


@dataclass
class StepPlan:
    """A checked forward call on slots ``first_slot .. first_slot + n - 1``."""

    ids: np.ndarray  # [n, width] int64, rows zero-padded to the widest (and to min_width)
    num_new: np.ndarray  # [n] real tokens per row
    grow: np.ndarray  # [n] how far each slot's length moves (0 for rows riding along)
    lengths: np.ndarray  # [n] a view of the range's lengths: add grow to it after the run
    tokens: int  # the call's own width: logits of all tokens are [n, tokens, vocab] even where ids were widened

    def trim(self, out: StepOutput, per_token: frozenset[str] = frozenset()) -> StepOutput:
        """``out`` without the columns min_width added, cut to the call's own width on axis 1: the extra outputs named
        in ``per_token`` (ExtraTensor.per_token: one row per fed token) always, the logits and the other extra outputs
        (one per logits row) when every row's logits were asked for. Views, no copy."""
        width = self.ids.shape[1]
        if width == self.tokens:
            return out
        every_row = out.logits.shape[1] == width  # all_logits: the logits rows are the widened tokens too
        tokens = self.tokens
        logits = out.logits[:, :tokens] if every_row else out.logits
        return StepOutput(logits, {name: a[:, :tokens] if every_row or name in per_token else a for name, a in out.extras.items()})

    def widened(self, per_token: np.ndarray) -> np.ndarray:
        """An input of the call's own width ([n, tokens, ...], e.g. an EAGLE module's hidden_states) at ids' width."""
        extra = self.ids.shape[1] - per_token.shape[1]
        return per_token if extra <= 0 else np.concatenate([per_token] + [per_token[:, -1:]] * extra, axis=1)


def plan_step(cache: KVCache, tokens: Sequence[Sequence[int]] | np.ndarray, advance: np.ndarray | None, first_slot: int, engine: str,
              min_width: int = 1) -> StepPlan:
    """What every executor checks before a call: the rows, the slot range, the room in each slot.

    min_width: the engine's BuildConfig.min_step_width. A narrower call gets copies of each row's last token as extra
    columns: they are written past the row's length (stale at once, as a riding row's) and their logits are dropped."""
    ids, num_new = pad_tokens(tokens)
    n, width = ids.shape
    if first_slot < 0 or first_slot + n > len(cache.lengths):
        raise RequestError(f"slots {first_slot}..{first_slot + n - 1} are outside the cache's {cache.num_slots} slots.")
    grow = num_new if advance is None else np.where(advance, num_new, 0)
    if width < min_width:
        ids = np.concatenate([ids] + [ids[:, -1:]] * (min_width - width), axis=1)
    cache.check_room(grow, ids.shape[1], first_slot, engine)
    return StepPlan(ids, num_new, grow, cache.lengths[first_slot : first_slot + n], width)


def fill_tree(tree: np.ndarray, causal: np.ndarray, tree_rows: list[int], positions: np.ndarray, lengths: np.ndarray,
              parents: Sequence[np.ndarray | None] | None) -> None:
    """A call's tree_mask [n, width, width] and positions [n, width], in place: chains causal, trees ancestors-only at
    length + depth. tree_rows: the rows the previous call made trees (reset to causal first), updated."""
    trees = [] if parents is None else [(row, np.asarray(p, np.int64)) for row, p in enumerate(parents) if p is not None]
    width = tree.shape[1]
    for row, par in trees:  # checked before any row is written: a refused call leaves the buffers as they were
        if len(par) > width or (par < -1).any() or (par >= np.arange(len(par))).any():
            raise RequestError(f"tree parents of row {row} must have -1 <= parents[j] < j (-1: a child of the cache's last token), "
                               f"one per token of the row; got {par.tolist()}.")
    if tree_rows:  # rows a previous call made trees: causal again
        tree[tree_rows] = causal
        tree_rows.clear()
    for row, par in trees:
        n = len(par)
        mask, depth = tree[row], np.zeros(n, np.int64)
        mask[:n, :n] = False
        for j in range(n):
            p = int(par[j])
            if p >= 0:
                mask[j, :n] = mask[p, :n]
                depth[j] = depth[p] + 1
            mask[j, j] = True
        positions[row, :n] = lengths[row] + depth
        tree_rows.append(row)


@dataclass(frozen=True)
class Placement:
    """Where an engine runs: a device kind and an index among that kind's devices."""

    kind: str = "cpu"  # cpu | cuda
    index: int = 0
    num_threads: int | None = None  # CPU threads (intra-op); None = the executor's default

    def __str__(self) -> str:
        return self.kind if self.kind == "cpu" else f"{self.kind}:{self.index}"


@runtime_checkable
class Backend(Protocol):
    """A backend module: what the registry calls on it (each is a module-level function)."""

    def make_executor(self, engine: EngineDir, placement: Placement) -> Executor:
        """Open ``engine`` on ``placement`` (imports the backend's runtime only now)."""

    def device_count(self) -> int:
        """How many devices of this backend's kind the host has (0 with a reason is the backend's DeviceError)."""

    def check_placement(self, engines: Sequence[EngineDir], devices: Sequence[int]) -> None:
        """Refuse, before anything is allocated, engines that cannot share their devices (``engines[i]`` on ``devices[i]``)."""
