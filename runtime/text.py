"""Token ids -> the text a user sees, incrementally: detokenization and stop strings.

One implementation for specdec-run (cli/stops.py) and specdec-serve (serve/loop.py):

    stream = TextStream(tokenizer, prompt_ids, stops=("\\n\\n",))
    delta, stopped = stream.feed(new_token_ids)   # per round: text safe to show now
    delta = stream.finish()                       # the request ended: whatever was held back

Detokenization is tokenizers' own ``DecodeStream`` (tokenizers >= 0.22, which
takes the prompt's last tokens as context): each token costs a decode of the
last piece shown plus the new tokens, never of the whole output, so a request's
text costs time linear in its length. A token that ends inside a multi-byte
character yields nothing until the character's last byte arrives, so a
character is never split.

Stop strings are matched on text, not tokens (" list" and "list" encode
differently, and a stop can end inside a token). ``keep_stop=False`` ends the
text before the stop string, as OpenAI does (specdec-serve); ``keep_stop=True``
ends it after, as TensorRT-LLM's run.py keeps stop words (specdec-run). Without
``keep_stop``, a tail that could still grow into a stop string is held back, so
no part of a stop string is ever shown.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers.decoders import DecodeStream

from ..formats.tokenizer import Tokenizer

PROMPT_CONTEXT = 5  # prompt tokens decoded before the first new one (word-boundary spaces depend on them)
# tokenizers raises a plain Exception with this text when a decoder rewrites text it already gave out
INVALID_PREFIX = "Invalid prefix"


class IncrementalDetokenizer:
    """Decode a growing token sequence a short window at a time (a DecodeStream, primed with the prompt's tail)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int]):
        self.tok = tokenizer
        context = [int(t) for t in prompt_ids[-PROMPT_CONTEXT:]]
        dangling: list[int] = []  # a prompt that ends inside a character: its last bytes, which the output may complete
        while context and tokenizer.decode(context).endswith("\ufffd"):
            dangling.insert(0, context.pop())
        self.shown = context  # the last tokens whose text came out: context
        self.pending: list[int] = []  # tokens since then: an incomplete character, held
        self.stream = DecodeStream(ids=list(self.shown), skip_special_tokens=True)
        self.orphan = False  # the first text out starts with U+FFFD for the dangling prompt bytes alone: not the output's
        for t in dangling:  # held as an unfinished character is, so the output's completing bytes come out as the whole one
            self.pending.append(t)
            self.orphan = self._step(t) is None

    def push(self, new_ids: Sequence[int]) -> str:
        """The text that ``new_ids`` add, or "" while a character is incomplete."""
        out = []
        for t in new_ids:
            self.pending.append(int(t))
            piece = self._step(int(t))
            if self.orphan:  # only until the first text after a prompt that ended inside a character
                piece = self._without_orphan(piece)
            if piece:
                out.append(piece)
                self.shown = (self.shown + self.pending)[-PROMPT_CONTEXT:]
                self.pending = []
        return "".join(out)

    def flush(self) -> str:
        """The request ended: whatever is held, complete or not (an unfinished character reads as U+FFFD)."""
        if not self.pending:
            return ""
        held, context = self.pending, self.shown
        before, now = self.tok.decode(context), self.tok.decode(context + held)
        self.shown, self.pending = (context + held)[-PROMPT_CONTEXT:], []
        return self._without_orphan(now[len(before) :] if now.startswith(before) else self.tok.decode(held))

    def _without_orphan(self, text: str | None) -> str | None:
        """The first text out, less the U+FFFD that stands for the prompt's unfinished character when the output did not finish
        it (that mark is the prompt's, not the output's text)."""
        if text and self.orphan:
            self.orphan = False
            return text[1:] if text.startswith("\ufffd") else text
        return text

    def _step(self, token: int) -> str | None:
        try:
            return self.stream.step(self.tok.backend, token)
        except Exception as err:  # noqa: BLE001 - tokenizers raises a bare Exception; only this one is expected
            if not str(err).startswith(INVALID_PREFIX):
                raise
            # A decoder that rewrites text already shown (say, a cleanup that joins two tokens' text) breaks
            # the stream's prefix; what was shown cannot be taken back, so go on from the held tokens alone.
            self.stream = DecodeStream(skip_special_tokens=True)
            return self.stream.step(self.tok.backend, self.pending)


class TextStream:
    """One request's output text: detokenized incrementally, ended at the first stop string."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], stops: Sequence[str] = (), keep_stop: bool = False,
                 min_tokens: int = 0):
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.stops = tuple(s for s in stops if s)
        self.keep_stop = keep_stop
        self.min_tokens = min_tokens  # no stop string ends the text at its first min_tokens tokens (vLLM's min_tokens)
        self.lookback = max((len(s) for s in self.stops), default=1) - 1  # a stop can start this far back in shown text
        self.shown: list[str] = []  # text handed out, in pieces (joined only when asked)
        self.recent = ""  # the last ``lookback`` characters handed out
        self.unsent = ""  # text decoded but not handed out yet (held back, or this round's)
        self.num_tokens = 0  # tokens consumed: up to the one that completed a stop string
        self.num_chars = 0  # characters decoded so far
        self.free_from = 0  # a stop string must end past this many characters: the text of the first min_tokens tokens
        self.stopped = False

    @property
    def text(self) -> str:
        """Everything decoded so far (ended at the stop string once one is found)."""
        return "".join(self.shown) + self.unsent

    def feed(self, token_ids: Sequence[int]) -> tuple[str, bool]:
        """Take a round's tokens; return (text safe to show now, whether a stop string ended it).

        Tokens are taken one at a time, so a stop string completed by the first
        token of a round ends the request there (``num_tokens`` counts that token).
        """
        for t in token_ids:
            if self.stopped:
                break
            self.num_tokens += 1
            self._add(self.detok.push([t]))
        return self._take(), self.stopped

    def finish(self) -> str:
        """The request ended without a stop string (so far): release the held-back text."""
        if not self.stopped:
            self._add(self.detok.flush())
        return self._take(final=True)

    def _add(self, piece: str) -> None:
        if not piece:
            return
        self.unsent += piece
        self.num_chars += len(piece)
        if self.num_tokens <= self.min_tokens:
            self.free_from = self.num_chars
            return
        if not self.stops:
            return
        # a new match ends in the new piece, so it starts at most ``lookback`` characters before the unsent text
        window = self.recent + self.unsent
        at = self.num_chars - len(window)  # where the window starts in the whole text
        hits = [(i, i + len(s)) for s in self.stops if (i := window.find(s, max(0, self.free_from - at - len(s) + 1))) >= 0]
        if hits:
            cut = min(end for _, end in hits) if self.keep_stop else min(start for start, _ in hits)
            # without keep_stop nothing shown held a stop's beginning (_held), so the cut is in the unsent text
            self.unsent, self.stopped = window[len(self.recent) : max(cut, len(self.recent))], True

    def _take(self, final: bool = False) -> str:
        hold = 0 if final or self.stopped or self.keep_stop else self._held()
        delta, self.unsent = self.unsent[: len(self.unsent) - hold], self.unsent[len(self.unsent) - hold :]
        if delta:
            self.shown.append(delta)
            self.recent = (self.recent + delta)[-self.lookback :] if self.lookback else ""
        return delta

    def _held(self) -> int:
        """Length of the longest unsent tail that is the beginning of a stop string."""
        best = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(self.unsent)), best, -1):
                if self.unsent.endswith(s[:n]):
                    best = n
                    break
        return best
