"""Token ids -> the text a client sees: incremental detokenization and stop strings.

    stream = TextStream(tokenizer, prompt_ids, stops=("\\n\\n",))
    delta, stopped = stream.feed(new_token_ids)   # per round: text safe to send now
    delta = stream.finish()                       # the request ended: whatever was held back

Incremental detokenization (the prefix/read offsets of Hugging Face TGI and
vLLM): each round decodes only a short window (the last tokens already shown
plus the new ones) and sends the part past the window's old text. Text that
ends in U+FFFD, a multi-byte character whose last bytes have not been
generated yet, is held until they are, so a character is never split.

Stop strings are matched on text, as OpenAI does, and the output is cut
before the stop string. While streaming, a tail that could still grow into a
stop string is held back, so no part of a stop string is ever sent.
"""

from __future__ import annotations

from typing import Sequence

from ..runtime.tokenizer import Tokenizer

PROMPT_CONTEXT = 5  # prompt tokens decoded before the first new one (word-boundary spaces depend on them)
REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Decode a growing token sequence a window at a time."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int]):
        self.tok = tokenizer
        self.ids = list(prompt_ids[-PROMPT_CONTEXT:])  # the window: ids[prefix:] is all that is ever decoded
        self.prefix = 0  # ids[prefix:read] is text already sent (context for the next piece)
        self.read = len(self.ids)

    def push(self, new_ids: Sequence[int]) -> str:
        """The text that ``new_ids`` add, or "" while a character is incomplete."""
        self.ids.extend(int(t) for t in new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """The request ended: whatever is held, complete or not."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        before = self.tok.decode(self.ids[self.prefix : self.read])
        now = self.tok.decode(self.ids[self.prefix :])
        if len(now) <= len(before) or (now.endswith(REPLACEMENT) and not final):
            return ""
        delta = now[len(before) :]
        # the new window starts at what was the read offset; drop what no window needs again
        self.ids = self.ids[self.read :]
        self.prefix, self.read = 0, len(self.ids)
        return delta


class TextStream:
    """One request's output text: detokenized incrementally, cut at the first stop string."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stops: Sequence[str] = ()):
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.stops = tuple(s for s in stops if s)
        self.text = ""  # everything decoded so far (cut at the stop string once one is found)
        self.sent = 0  # len(text) handed out
        self.num_tokens = 0  # tokens consumed: up to the one that completed a stop string
        self.stopped = False

    def feed(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        """Take a round's tokens; return (text safe to send now, whether a stop string ended it).

        Tokens are taken one at a time, so a stop string completed by the first
        token of a round ends the request there (its usage counts that token).
        """
        for t in token_ids:
            if self.stopped:
                break
            self.num_tokens += 1
            self.text += self.detok.push([t])
            self._check_stops()
        return self._take(), self.stopped

    def finish(self) -> str:
        """The request ended without a stop string (so far): release the held-back text."""
        if not self.stopped:
            self.text += self.detok.flush()
            self._check_stops()
        return self._take(final=True)

    def _check_stops(self) -> None:
        if not self.stops:
            return
        # a stop string can only start in the unsent tail: what was sent held no stop's prefix
        hits = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[: min(hits)], True

    def _take(self, final: bool = False) -> str:
        end = len(self.text) if final or self.stopped else len(self.text) - self._held()
        delta, self.sent = self.text[self.sent : end], max(end, self.sent)
        return delta

    def _held(self) -> int:
        """Length of the longest unsent tail that is the beginning of a stop string."""
        tail = self.text[self.sent :]
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(tail)), best, -1):
                if tail.endswith(s[:n]):
                    best = n
                    break
        return best
