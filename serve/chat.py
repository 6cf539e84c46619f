"""Chat messages -> prompt text, with the checkpoint's own chat template.

Rendered the way ``transformers`` renders ``apply_chat_template``: a jinja2
sandbox (a template is data from a checkpoint, not trusted code), trim_blocks
and lstrip_blocks, the loopcontrols extension, ``raise_exception``,
``strftime_now`` and a ``tojson`` that keeps non-ASCII text, and the special
tokens of tokenizer_config.json as variables. The prompt is then encoded
without adding special tokens: the template writes them itself.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..formats.tokenizer import Tokenizer
from .errors import ApiError

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class TemplateRaised(Exception):
    """A template's own ``raise_exception`` (say, roles that do not alternate)."""


def _raise_exception(message: str) -> None:
    raise TemplateRaised(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateError as err:
        raise ApiError(400, f"the server's chat template does not compile: {err}") from None


def find_template(tokenizer: Tokenizer | None, override: str | Path | None = None) -> str | None:
    """--chat_template FILE, else tokenizer_config.json's chat_template (a string, or a list of named ones: 'default')."""
    if override:
        return Path(override).read_text()
    if tokenizer is None:
        return None
    template = tokenizer.config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if template is None and (tokenizer.directory / "chat_template.jinja").is_file():
        template = (tokenizer.directory / "chat_template.jinja").read_text()  # where newer transformers save it
    return template if isinstance(template, str) and template.strip() else None


def special_tokens(tokenizer: Tokenizer) -> dict[str, str]:
    out = {}
    for key in SPECIAL_TOKENS:
        value = tokenizer.config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


# what the server itself gives a template: a request's chat_template_kwargs may not replace them
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "raise_exception", "strftime_now", *SPECIAL_TOKENS})


def render_chat(template: str, messages: list[dict[str, Any]], tokens: dict[str, str], add_generation_prompt: bool = True,
                continue_final_message: bool = False, **extra: Any) -> str:
    """The prompt text for ``messages``, ending where the assistant's answer starts (``add_generation_prompt``), or
    inside the final message, which the model continues (``continue_final_message``, as transformers cuts it)."""
    import jinja2

    if continue_final_message:  # a mark after the final message's text shows where the rendered chat is cut
        final = messages[-1]
        content = final.get("content") if isinstance(final.get("content"), str) else ""
        messages = [*messages[:-1], {**final, "content": content + CONTINUE_MARK}]
    try:
        text = _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **tokens, **extra)
    except TemplateRaised as err:
        raise ApiError(400, f"the chat template refused these messages: {err}", param="messages") from None
    # jinja's errors include the sandbox's SecurityError; a client's chat_template_kwargs can make a template overflow or recurse
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, ArithmeticError, RecursionError) as err:
        raise ApiError(400, f"the chat template failed on these messages: {type(err).__name__}: {err}", param="messages") from None
    return _open_ended(text) if continue_final_message else text


CONTINUE_MARK = "SPECDEC_CONTINUE_FINAL_MESSAGE "  # text no message holds; its space shows whether the template trims the message


def _open_ended(text: str) -> str:
    """The rendered chat cut where the final message's text ends (what the template writes after it, an end of turn, goes),
    as transformers cuts it: at the mark, and before the whitespace a trimming template left."""
    at = text.rfind(CONTINUE_MARK.strip())
    if at < 0:
        raise ApiError(400, "continue_final_message needs a chat template that writes the final message's text; this one leaves it out "
                            "or rewrites it.", param="messages")
    return text[:at] if text.startswith(CONTINUE_MARK, at) else text[:at].rstrip()
