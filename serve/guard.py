"""ASGI middleware in front of every route: the API key, the body size limit, and bodies no handler should see.

The key is compared in constant time (hmac.compare_digest) over the whole
``Authorization`` header. The body is read here, up to the limit, before any
handler runs, so an oversize body is a 413 whatever its framing. A JSON body
is then checked for what is valid JSON but not something the server can
take, answered with a 400 that names where it is:

* a lone UTF-16 surrogate (``"\\ud800"``): valid JSON, not Unicode text; a
  tokenizer, a chat template or a grammar compiler would fail on it;
* nesting deeper than ``MAX_DEPTH``: no field of the API nests that deep,
  and deep enough nesting exhausts a recursive parser;
* ``NaN`` and ``Infinity``: Python's parser takes them, JSON (RFC 8259) does not.
"""

from __future__ import annotations

import hmac
import json
from typing import Any

from .errors import error_body

OPEN_PATHS = ("/health",)  # answered without the API key (load balancers probe it)
MAX_DEPTH = 64


class Guard:
    def __init__(self, app, api_key: str | None, max_request_bytes: int):
        self.app = app
        self.expected = api_key.encode() if api_key else None  # the credentials after the scheme
        self.limit = max_request_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.expected is not None and scope.get("path") not in OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            scheme, _, credentials = given.strip().partition(b" ")
            # the scheme is case-insensitive (RFC 7235: "bearer" is "Bearer"); the key is compared in constant time
            if scheme.lower() != b"bearer" or not hmac.compare_digest(credentials.strip(), self.expected):
                why = "missing Authorization header" if not given else "invalid API key"
                body = error_body(401, f"{why}: send 'Authorization: Bearer <key>' with the server's --api_key.", code="invalid_api_key")
                return await send_json(send, 401, body, [(b"www-authenticate", b"Bearer")])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await send_json(send, 413, self._too_large(int(declared)))
        if scope.get("method") not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return await send_json(send, 413, self._too_large(None))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        problem = check_json(body)
        if problem is not None:
            message, param = problem
            return await send_json(send, 400, error_body(400, message, param))
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: the client's disconnect

        return await self.app(scope, replay, send)

    def _too_large(self, declared: int | None) -> dict:
        size = f"{declared} bytes" if declared is not None else "more than that"
        return error_body(413, f"the request body is {size}; this server takes at most {self.limit} bytes (--max_request_bytes).")


def check_json(body: bytes) -> tuple[str, str | None] | None:
    """(message, param) for a JSON body the server cannot take; None for anything else (malformed JSON is FastAPI's to report)."""
    if not body or body.count(b"[") + body.count(b"{") < MAX_DEPTH and b"\\u" not in body.lower() and b"NaN" not in body and b"Infinity" not in body:
        return None  # too shallow to nest deeply, no escape that could be a surrogate, no non-finite number: nothing to walk
    try:
        doc = json.loads(body, parse_constant=_not_json)
    except RecursionError:
        return f"the request body nests deeper than {MAX_DEPTH} levels; no field of this API nests that deep.", None
    except NonFinite as err:
        return f"the request body is not valid JSON: {err} is not a JSON number (send a finite number).", None
    except ValueError:
        return None
    stack: list[tuple[Any, str, int]] = [(doc, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            return (f"the request body nests deeper than {MAX_DEPTH} levels (at {path or 'the top'}); no field of this API nests that deep.",
                    path.split(".")[0] or None)
        if isinstance(value, str):
            if _lone_surrogate(value):
                return (f"{path or 'the body'} holds a lone UTF-16 surrogate (an unpaired \\ud800-\\udfff escape), which is not Unicode text; "
                        "send valid UTF-8 text.", path or None)
        elif isinstance(value, dict):
            for k, v in value.items():
                key_path = f"{path}.{k}" if path else str(k)
                if _lone_surrogate(k):
                    return (f"a key in {path or 'the body'} holds a lone UTF-16 surrogate, which is not Unicode text; send valid UTF-8 text.",
                            path or None)
                stack.append((v, key_path, depth + 1))
        elif isinstance(value, list):
            stack.extend((v, f"{path}.{i}" if path else str(i), depth + 1) for i, v in enumerate(value))
    return None


class NonFinite(ValueError):
    pass


def _not_json(constant: str) -> float:
    raise NonFinite(constant)


def _lone_surrogate(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


async def send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})
