"""JSON lines as users hand them over (datasets, training data, suffix-cache seeds), read with one error per problem.

A file that is not UTF-8, a line that is not JSON, a line nested past Python's recursion limit and a string
holding a lone surrogate (a "\\ud800" escape, valid JSON but not Unicode, which no tokenizer takes) each give
one error naming the file and the line, instead of a UnicodeDecodeError, a RecursionError or, later, a
TypeError from the tokenizers library.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .errors import RequestError, SpecdecError


def json_lines(path: str | Path, error: type[SpecdecError] = RequestError, line: str = ":") -> Iterator[tuple[str, Any]]:
    """(where, value) for each non-blank line of ``path``, where = ``path:n`` (``line`` between them: " line " gives
    ``path line n``); ``error`` is the class raised."""
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        n = data.count(b"\n", 0, err.start) + 1
        raise error(f"{path}{line}{n} is not UTF-8 text (byte {data[err.start]:#04x}); save the file as UTF-8.") from None
    for n, text_line in enumerate(text.splitlines(), 1):
        if not text_line.strip():
            continue
        where = f"{path}{line}{n}"
        try:
            value = json.loads(text_line)
        except json.JSONDecodeError as err:
            raise error(f"{where} is not JSON ({err.msg}); expected one JSON object per line.") from None
        except RecursionError:
            raise error(f"{where} nests JSON too deeply; expected one flat object per line.") from None
        bad = _lone_surrogate(value)
        if bad is not None:
            raise error(f"{where} holds text that is not valid Unicode: a lone surrogate {bad!r} (a \\ud800-style escape); no tokenizer can read it.")
        yield where, value


def _lone_surrogate(value: Any) -> str | None:
    """The first lone surrogate in any string of a JSON value (keys too), or None."""
    stack = [value]
    while stack:  # not recursive: json.loads nests as deep as its own recursion allows
        v = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError as err:
                return v[err.start]
        elif isinstance(v, dict):
            stack += [*v.keys(), *v.values()]
        elif isinstance(v, list):
            stack += v
    return None
