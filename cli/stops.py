"""Stop strings matched on text, as TensorRT-LLM's run.py and the OpenAI API users expect.

A stop string is not a token sequence: " list" and "list" encode differently, and
a stop can end inside a token. So each request's decoded output is searched for
the strings as tokens arrive; a request whose text holds one is ended, its
output cut after the token that completed the string and its text cut at the
string's end (the stop string is kept, as run.py keeps stop words).
"""

from __future__ import annotations

from typing import Callable, Sequence

from ..runtime.orchestrator import GenerationConfig, Orchestrator
from ..runtime.request import RequestOutput
from ..runtime.tokenizer import Tokenizer

OnText = Callable[[int, str], None]  # (prompt index, new text)


def first_stop(text: str, stops: Sequence[str]) -> int | None:
    """End offset of the earliest stop string in ``text``, or None."""
    ends = [text.find(s) + len(s) for s in stops if s and s in text]
    return min(ends) if ends else None


def generate_with_stops(orch: Orchestrator, prompts: list[list[int]], gen: GenerationConfig, tok: Tokenizer | None,
                        stops: Sequence[str] = (), on_text: OnText | None = None):
    """``orch.generate`` with text-level stop strings and text streaming; returns (outputs, metrics)."""
    if not stops and on_text is None:
        return orch.generate(prompts, gen)
    ids: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    shown: dict[int, int] = {i: 0 for i in range(len(prompts))}
    stopped: dict[int, int] = {}  # prompt index -> tokens kept

    def on_tokens(i: int, new: list[int]) -> bool:
        if i in stopped:
            return True
        before = len(ids[i])
        ids[i].extend(new)
        end = first_stop(tok.decode(ids[i]), stops) if stops else None
        if end is not None:
            # the fewest tokens whose text holds the stop string
            keep = next(n for n in range(before + 1, len(ids[i]) + 1) if first_stop(tok.decode(ids[i][:n]), stops) is not None)
            stopped[i] = keep
        if on_text is not None:
            text = tok.decode(ids[i][: stopped.get(i, len(ids[i]))]) if tok else " ".join(map(str, new)) + " "
            if tok:
                cut = first_stop(text, stops) if stops else None
                text = text[: cut] if cut is not None else text
                on_text(i, text[shown[i]:])
                shown[i] = len(text)
            else:
                on_text(i, text)
        return i in stopped

    outputs, metrics = orch.generate(prompts, gen, on_tokens=on_tokens)
    for i, out in enumerate(outputs):
        if i in stopped:
            metrics.output_tokens -= len(out.output_ids) - stopped[i]  # tokens past the stop are not output
            out.output_ids = out.output_ids[: stopped[i]]
            out.finish_reason = "stop_words"
    return outputs, metrics


def decode_text(tok: Tokenizer, out: RequestOutput, stops: Sequence[str]) -> str:
    """The output's text, cut at the end of its stop string when it stopped on one."""
    text = tok.decode(out.output_ids)
    end = first_stop(text, stops) if out.finish_reason == "stop_words" else None
    return text[:end] if end is not None else text
