"""Tools (function calling): the chat template renders them; a grammar makes the calls valid; the output is parsed.

    tool_choice        what the output is constrained to                               how it is read
    "none"             nothing (the template still sees the tools)                       text
    "auto" (default)   free text, and after "<tool_call>" a call whose arguments        "<tool_call>{"name": ..., "arguments": ...}</tool_call>"
                       follow the function's JSON schema (a lazy grammar: llguidance)    blocks -> tool_calls, the text before -> content
    "required"         a JSON array of calls [{"name", "arguments"}] (one call           the array -> tool_calls
                       when parallel_tool_calls is false)
    {"function": f}    the arguments of f, a JSON object of its schema                  -> one call of f

The "auto" format is Hermes' (Qwen 2.5/3, Hermes 2/3 and many fine-tunes
write it, and their templates teach it). "auto" needs a template that
renders ``tools``; "required" and a named function work with any template,
since the grammar writes the call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..runtime.grammar import GrammarSpec
from .errors import ApiError

if TYPE_CHECKING:
    from .params import Served
    from .protocol import ChatCompletionRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


@dataclass
class ToolPlan:
    definitions: list[dict[str, Any]]  # as the chat template takes them
    mode: str  # none | auto | required | named
    grammar: tuple[GrammarSpec, str] | None = None  # (spec, the request field it comes from)
    named: str | None = None

    def parse(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The output -> (content, tool_calls as OpenAI's response writes them)."""
        if self.mode == "none":
            return text, []
        if self.mode == "named":
            return None, [_call(self.named or "", text)] if _is_json(text) else []
        if self.mode == "required":
            try:
                calls = json.loads(text)
            except json.JSONDecodeError:
                return text, []
            return None, [_call(c["name"], json.dumps(c["arguments"], ensure_ascii=False)) for c in calls]
        calls = []
        for m in CALL.finditer(text):
            try:
                c = json.loads(m.group(1))
                calls.append(_call(c["name"], json.dumps(c["arguments"], ensure_ascii=False)))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
        if not calls:
            return text, []
        head = text[: text.find(OPEN)].strip()
        return head or None, calls


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except json.JSONDecodeError:
        return False


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": {"name": name, "arguments": arguments}}


def _parameters(schema: dict | None) -> dict:
    return schema if schema else {"type": "object"}


def plan_tools(req: ChatCompletionRequest, served: Served) -> ToolPlan | None:
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none"):
            raise ApiError(400, "tool_choice needs tools: send the function definitions in tools.", "tool_choice")
        return None
    if req.response_format is not None and req.response_format.type != "text" or req.structured_outputs is not None:
        if choice not in (None, "none"):
            raise ApiError(400, "tools and a structured output (response_format / structured_outputs) cannot both constrain the output; send one.",
                           "tools")
    definitions = [t.model_dump(exclude_none=True) for t in req.tools]
    funcs = {t.function.name: _parameters(t.function.parameters) for t in req.tools}
    if len(funcs) != len(req.tools):
        raise ApiError(400, "tools has two functions with the same name.", "tools")
    names = tuple(funcs)
    if choice == "none":
        return ToolPlan(definitions, "none")
    if choice is None or choice == "auto":
        if req.response_format is not None and req.response_format.type != "text" or req.structured_outputs is not None:
            return ToolPlan(definitions, "none")  # the structured output decides the output
        if "tools" not in (served.chat_template or ""):
            raise ApiError(400, "tool_choice 'auto' needs a chat template that renders tools (this one never reads `tools`): "
                           "send tool_choice 'required' or a named function, or restart with --chat_template FILE.", "tool_choice")
        call = {"anyOf": [_call_schema(n, s) for n, s in funcs.items()]}
        lark = _lazy_calls(call, special=served.tokenizer is not None and served.tokenizer.special_token_id(OPEN) is not None)
        return ToolPlan(definitions, "auto", (GrammarSpec("lark", lark), "tools"))
    if choice == "required":
        one = {"anyOf": [_call_schema(n, s) for n, s in funcs.items()]}
        array = {"type": "array", "items": one, "minItems": 1}
        if req.parallel_tool_calls is False:
            array["maxItems"] = 1
        return ToolPlan(definitions, "required", (GrammarSpec("json_schema", array), "tools"))
    name = choice.function.name
    if name not in funcs:
        raise ApiError(400, f"tool_choice names the function {name!r}, which is not in tools ({', '.join(names)}).", "tool_choice")
    return ToolPlan(definitions, "named", (GrammarSpec("json_schema", funcs[name]), f"tools[{names.index(name)}].function.parameters"), named=name)


def _call_schema(name: str, parameters: dict) -> dict:
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": parameters}, "required": ["name", "arguments"],
            "additionalProperties": False}


def _lazy_calls(call_schema: dict, special: bool) -> str:
    """Free text; from "<tool_call>" on, one call that follows ``call_schema``, closed by "</tool_call>"."""
    try:
        import llguidance
    except ImportError as err:
        raise ApiError(400, f"tools need llguidance: pip install 'specdec[serve]' ({err}).", "tools") from None
    tag = llguidance.StructTag(trigger=OPEN, begin=OPEN + "\n", grammar=call_schema, end="\n" + CLOSE)
    return llguidance.StructTag.to_grammar([tag], assume_special=special)


class ToolTextFilter:
    """A streamed choice's text as a client may see it: text before a tool call, never the call's own text.

    ``feed`` returns what may be sent now (a tail that could grow into "<tool_call>" is held back);
    ``finish`` returns the rest and the parsed calls, once the choice has ended.
    """

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self.text = ""
        self.sent = 0
        self._finished: tuple[str, list[dict[str, Any]] | None] | None = None

    def feed(self, delta: str) -> str:
        self.text += delta
        if self.plan.mode == "none":
            end = len(self.text)
        elif self.plan.mode != "auto":
            end = 0  # the whole output is the call
        else:
            at = self.text.find(OPEN)
            end = at if at >= 0 else len(self.text) - _held(self.text, OPEN)
        end = max(end, self.sent)
        out, self.sent = self.text[self.sent : end], end
        return out

    def finish(self) -> tuple[str, list[dict[str, Any]] | None]:
        if self._finished is None:
            content, calls = self.plan.parse(self.text)
            if calls:
                at = self.text.find(OPEN)
                rest = self.text[self.sent : at] if self.plan.mode == "auto" and at > self.sent else ""
                self._finished = (rest, calls)
            else:
                self._finished = (self.text[self.sent :], None)
            self.sent = len(self.text)
        return self._finished


def _held(text: str, marker: str) -> int:
    """Length of the longest tail of ``text`` that is a beginning of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0
