"""Stop strings matched on text, as TensorRT-LLM's run.py and the OpenAI API users expect.

A stop string is not a token sequence: " list" and "list" encode differently, and
a stop can end inside a token. So each request's text is decoded as tokens
arrive (runtime/text.py, incrementally: a short window per token, never the
whole output) and searched for the strings; a request whose text holds one is
ended, its output cut after the token that completed the string and its text
cut at the string's end (the stop string is kept, as run.py keeps stop words).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..formats.tokenizer import Tokenizer
from ..runtime.orchestrator import GenerationConfig, Orchestrator
from ..runtime.request import RequestOutput
from ..runtime.text import TextStream

OnText = Callable[[int, str], None]  # (prompt index, new text)


def generate_with_stops(orch: Orchestrator, prompts: list[list[int]], gen: GenerationConfig, tok: Tokenizer | None,
                        stops: Sequence[str] = (), on_text: OnText | None = None):
    """``orch.generate`` with text-level stop strings and text streaming; returns (outputs, metrics)."""
    if not stops and on_text is None:
        return orch.generate(prompts, gen)
    # the output is decoded on its own, as run.py and decode_text do (no prompt context: a first "▁word" loses its space)
    streams = {i: TextStream(tok, [], stops, keep_stop=True, min_tokens=gen.min_output_len) for i in range(len(prompts))} if tok else {}
    stopped: dict[int, int] = {}  # prompt index -> tokens kept

    def on_tokens(i: int, new: list[int]) -> bool:
        if i in stopped:
            return True
        if tok is None:  # no tokenizer (token ids in and out): stream the ids
            if on_text is not None:
                on_text(i, " ".join(map(str, new)) + " ")
            return False
        delta, done = streams[i].feed(new)
        if on_text is not None and delta:
            on_text(i, delta)
        if done:
            stopped[i] = streams[i].num_tokens
        return done

    outputs, metrics = orch.generate(prompts, gen, on_tokens=on_tokens)
    for i, out in enumerate(outputs):
        if i in stopped:
            metrics.output_tokens -= len(out.output_ids) - stopped[i]  # tokens past the stop are not output
            out.output_ids = out.output_ids[: stopped[i]]
            out.finish_reason = "stop_words"
        elif on_text is not None and i in streams:
            on_text(i, streams[i].finish())  # an unfinished character at the end, if any
    return outputs, metrics


def decode_text(tok: Tokenizer, out: RequestOutput, stops: Sequence[str], min_tokens: int = 0) -> str:
    """The output's text, cut at the end of its stop string when it stopped on one (none in its first min_tokens tokens)."""
    stream = TextStream(tok, [], stops if out.finish_reason == "stop_words" else (), keep_stop=True, min_tokens=min_tokens)
    text, _ = stream.feed(out.output_ids)
    return text + stream.finish()
