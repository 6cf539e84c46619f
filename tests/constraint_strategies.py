"""Strategies for what a request constrains its output with: JSON schemas, regular expressions, Lark grammars,
choices and tools, drawn by class rather than listed (tests/runtime/test_fuzz_grammar.py, tests/serve/).

The classes: constraints that no string satisfies (empty enums, minimum > maximum, $ref cycles with no finite
instance, rules that always recurse, a regex of an empty class), numbers at the edges in every bound, deep and
wide structures (nesting up to the server's 64 levels), text at the edges (lone surrogates, NULs, non-ASCII) in
every string, junk of every JSON type where a schema or a field belongs, and the well-formed constraints these
break.
"""

from __future__ import annotations

from typing import Any

from fuzzing import any_text, edge_floats, edge_ints, json_values
from hypothesis import strategies as st

SCALAR_TYPES = ["string", "integer", "number", "boolean", "null", "object", "array", "nope"]
NAMES = ["a", "b", "x", "name", "é", ""]


def _bound() -> st.SearchStrategy[Any]:
    return st.one_of(edge_ints(), edge_floats().filter(lambda f: f == f and abs(f) != float("inf")), st.sampled_from([-1, 0, 1, 3, 5]))


def _leaf_schema() -> st.SearchStrategy[dict]:
    return st.one_of(
        st.fixed_dictionaries({"type": st.sampled_from(SCALAR_TYPES)}),
        st.fixed_dictionaries({"type": st.just("integer")}, optional={"minimum": _bound(), "maximum": _bound(), "multipleOf": _bound()}),
        st.fixed_dictionaries({"type": st.just("number")}, optional={"exclusiveMinimum": _bound(), "exclusiveMaximum": _bound()}),
        st.fixed_dictionaries({"type": st.just("string")}, optional={"minLength": _bound(), "maxLength": _bound(), "pattern": regexes(),
                                                                    "format": st.sampled_from(["date", "email", "uuid", "nope"])}),
        st.fixed_dictionaries({"enum": st.lists(st.one_of(st.none(), st.booleans(), edge_ints(), any_text(6)), max_size=4)}),
        st.fixed_dictionaries({"const": st.one_of(st.none(), edge_ints(), any_text(8))}),
        st.just({"$ref": "#"}),
        st.just({"$ref": "#/$defs/e"}),
        st.just({"$ref": "#/$defs/missing"}),
        st.just(True),
        st.just(False),
        st.just({}),
    )


def _nested_schema(inner: st.SearchStrategy) -> st.SearchStrategy[dict]:
    props = st.dictionaries(st.sampled_from(NAMES), inner, max_size=3)
    return st.one_of(
        st.fixed_dictionaries({"type": st.just("object"), "properties": props},
                              optional={"required": st.lists(st.sampled_from(NAMES), max_size=3),
                                        "additionalProperties": st.one_of(st.booleans(), inner),
                                        "minProperties": _bound(), "maxProperties": _bound()}),
        st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                              optional={"minItems": _bound(), "maxItems": _bound(), "uniqueItems": st.booleans()}),
        st.fixed_dictionaries({"anyOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"allOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"oneOf": st.lists(inner, max_size=3)}),
        st.fixed_dictionaries({"prefixItems": st.lists(inner, max_size=3)}),
    )


# A $ref cycle with no finite instance (every instance holds another), and one with a way out.
ENDLESS = {"type": "object", "properties": {"x": {"$ref": "#/$defs/e"}}, "required": ["x"], "additionalProperties": False}
FINITE = {"type": "object", "properties": {"x": {"$ref": "#/$defs/e"}}, "additionalProperties": False}
# One branch ends, the other never does: llguidance cannot tell up front, and gives up on an output that enters it.
BRANCHES = {"$defs": {"e": ENDLESS}, "anyOf": [{"type": "integer"}, {"$ref": "#/$defs/e"}]}


@st.composite
def json_schemas(draw) -> Any:
    """A schema of the classes above; a $defs "e" (endless or finite) where one is referred to."""
    kind = draw(st.integers(0, 9))
    if kind == 9:
        return BRANCHES
    if kind == 0:
        return draw(json_values(8))  # junk of any JSON type
    if kind == 1:  # deep: up to the server's 64 levels of body nesting
        depth = draw(st.sampled_from([8, 20, 30]))
        schema: dict = {"type": "integer"}
        for _ in range(depth):
            schema = {"type": "array", "items": schema}
        return schema
    schema = draw(st.recursive(_leaf_schema(), _nested_schema, max_leaves=8))
    if isinstance(schema, dict) and draw(st.booleans()):
        schema = {**schema, "$defs": {"e": draw(st.sampled_from([ENDLESS, FINITE, {"type": "string"}]))}}
    return schema


REGEX_PIECES = ["a", "b", "[a-z]", "[^\\s\\S]", "[a&&b]", "(", ")", "|", "*", "+", "?", "{0,3}", "{5,2}", "{99999}", "\\d", "\\w", ".", "^", "$",
                "(?!x)", "(?i)", "\\", "[", "]", "é", "\U0001f642", "\x00", " ", "\\p{L}", "(?P<n>a)", "\\1", "[z-a]"]


def regexes() -> st.SearchStrategy[str]:
    return st.one_of(st.lists(st.sampled_from(REGEX_PIECES), min_size=1, max_size=10).map("".join), any_text(20).filter(bool),
                     st.sampled_from(["[0-9]{1,3}", " [a-z]+", "(ab|cd)*e", "a{2}", "x" * 2000]))


LARK_BODIES = ['"x"', '"x" a', "a", "b", '/[0-9]+/', '"é"', "a*", "a+", "(a | b)", '"x"?', '""', "%json {}", '%json {"type": "integer"}', "start",
               '"x" start', "(", "|", '/(?!a)/']


@st.composite
def lark_grammars(draw) -> str:
    """Rules start, a, b over strings, regexes and each other: some derive nothing (a: "x" a), some are not Lark."""
    if draw(st.integers(0, 5)) == 0:
        return draw(any_text(40))
    lines = []
    for name in draw(st.lists(st.sampled_from(["start", "a", "b"]), min_size=1, max_size=3, unique=True)):
        body = " ".join(draw(st.lists(st.sampled_from(LARK_BODIES), min_size=1, max_size=3)))
        lines.append(f"{name}: {body}")
    return "\n".join(lines)


def choices() -> st.SearchStrategy[list[str]]:
    return st.lists(any_text(12), min_size=1, max_size=5)


@st.composite
def structured_outputs(draw) -> dict:
    """A vLLM-style structured_outputs body field: one of json, regex, choice, grammar."""
    kind = draw(st.sampled_from(["json", "regex", "choice", "grammar"]))
    value = {"json": json_schemas(), "regex": regexes(), "choice": choices(), "grammar": lark_grammars()}[kind]
    return {kind: draw(value)}


@st.composite
def tools_bodies(draw) -> dict:
    """tools and a tool_choice for /v1/chat/completions: parameters drawn as schemas, the choice any of OpenAI's forms."""
    names = draw(st.lists(st.sampled_from(["f", "get_weather", "add"]), min_size=1, max_size=3, unique=True))
    tools = [{"type": "function", "function": {"name": n, "parameters": draw(st.one_of(json_schemas(), st.just({"type": "object"})))}} for n in names]
    choice = draw(st.one_of(st.sampled_from(["none", "auto", "required"]), st.sampled_from(names + ["missing"]).map(
        lambda n: {"type": "function", "function": {"name": n}})))
    return {"tools": tools, "tool_choice": choice}
