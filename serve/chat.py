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

    try:
        text = _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt, **tokens, **extra)
    except TemplateRaised as err:
        raise ApiError(400, f"the chat template refused these messages: {err}", param="messages") from None
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as err:  # jinja's include the sandbox's SecurityError
        raise ApiError(400, f"the chat template failed on these messages: {type(err).__name__}: {err}", param="messages") from None
    return _open_ended(text, messages[-1]) if continue_final_message else text


def _open_ended(text: str, final: dict[str, Any]) -> str:
    """The rendered chat cut right after the final message's text (what the template writes after it, an end of turn, goes)."""
    content = final.get("content")
    content = content if isinstance(content, str) else ""
    for shown in (content, content.strip()):  # templates that trim a message write it stripped
        if shown and (at := text.rfind(shown)) >= 0:
            return text[: at + len(shown)]
    raise ApiError(400, "continue_final_message needs a final message whose text the chat template writes out as given; this one's "
                        "is empty or the template rewrites it.", param="messages")
