"""A radix tree over token ids, in blocks: which cached sequence shares the longest prefix with a prompt.

SGLang's RadixAttention and vLLM's automatic prefix caching key KV by the
tokens before it; this is the index of runtime/prefix_cache.py. Each edge is
one block of ``block`` token ids; each node keeps the holders (cached
sequences: a finished request's tokens in the pool, a running request's
prompt) whose tokens pass through it, most recently used last.

``match(tokens)`` walks the prompt's full blocks down the tree, then, among
the holders of the deepest node reached, takes the one whose tokens go on
agreeing longest (token by token, within the next block): the match is exact
to the token, found in ``len(tokens) / block`` dictionary lookups plus one
block's comparison per candidate. A holder shorter than one block is never
indexed, and a match is at least one block long.

The tree is plain Python: it is touched once per admitted request and once
per finished one, never per round.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

MAX_CANDIDATES = 64  # holders of one node compared token by token at most (most recently used first)


class _Node:
    __slots__ = ("children", "holders", "parent", "edge")

    def __init__(self, parent: _Node | None = None, edge: tuple[int, ...] = ()):
        self.children: dict[tuple[int, ...], _Node] = {}
        self.holders: dict[Hashable, None] = {}  # an ordered set: least recently used first
        self.parent, self.edge = parent, edge


class PrefixIndex:
    def __init__(self, block: int = 16):
        if block < 1:
            raise ValueError(f"block={block}: a prefix index needs blocks of at least one token")
        self.block = block
        self.root = _Node()
        self._tokens: dict[Hashable, list[int]] = {}  # holder -> its indexed tokens
        self._leaf: dict[Hashable, _Node] = {}  # holder -> the deepest node it passes through

    def __len__(self) -> int:
        return len(self._tokens)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._tokens

    def tokens(self, key: Hashable) -> list[int]:
        return self._tokens[key]

    def add(self, key: Hashable, tokens: Sequence[int]) -> bool:
        """Index ``key`` as holding ``tokens`` (replacing what it held); False (not indexed) when shorter than a block."""
        if key in self._tokens:
            self.remove(key)
        tokens = [int(t) for t in tokens]
        if len(tokens) < self.block:
            return False
        node = self.root
        for start in range(0, len(tokens) - self.block + 1, self.block):
            edge = tuple(tokens[start : start + self.block])
            child = node.children.get(edge)
            if child is None:
                child = node.children[edge] = _Node(node, edge)
            node = child
            node.holders[key] = None
        self._tokens[key], self._leaf[key] = tokens, node
        return True

    def remove(self, key: Hashable) -> None:
        """Forget ``key`` (nothing if it is not indexed); nodes no holder passes through any more go too."""
        node = self._leaf.pop(key, None)
        self._tokens.pop(key, None)
        while node is not None and node is not self.root:
            node.holders.pop(key, None)
            parent = node.parent
            if not node.holders and not node.children:
                del parent.children[node.edge]
            node = parent

    def touch(self, key: Hashable) -> None:
        """``key`` was just used: it is preferred among holders that match as long."""
        node = self._leaf.get(key)
        while node is not None and node is not self.root:
            node.holders.pop(key, None)
            node.holders[key] = None
            node = node.parent

    def match(self, tokens: Sequence[int], eligible: Callable[[Hashable], bool] | None = None,
              rank: Callable[[Hashable], int] | None = None) -> tuple[Hashable | None, int]:
        """The holder sharing the longest prefix with ``tokens`` and that length (None, 0: less than a block).

        ``eligible``: holders that may be returned (the others are passed over); ``rank``: among holders that match
        as long, the one with the highest rank wins (then the most recently used)."""
        path = [self.root]
        node, b = self.root, self.block
        for start in range(0, len(tokens) - b + 1, b):
            child = node.children.get(tuple(tokens[start : start + b]))
            if child is None:
                break
            node = child
            path.append(node)
        for depth in range(len(path) - 1, 0, -1):  # the deepest node with an eligible holder
            best, best_key = None, None
            for checked, key in enumerate(reversed(path[depth].holders)):
                if checked >= MAX_CANDIDATES:
                    break
                if eligible is not None and not eligible(key):
                    continue
                held, n = self._tokens[key], depth * b
                stop = min(len(held), len(tokens), n + b)
                while n < stop and held[n] == tokens[n]:
                    n += 1
                score = (n, rank(key) if rank is not None else 0)
                if best is None or score > best:
                    best, best_key = score, key
            if best is not None:
                return best_key, best[0]
        return None, 0
