"""The ASGI app: OpenAI's routes over one engine loop.

    GET  /health                 200 while the engine loop runs (never needs the API key)
    GET  /version                versions and the engines' limits
    GET  /v1/models              the one served model
    POST /v1/completions         prompt text or token ids; stream or not
    POST /v1/chat/completions    messages through the checkpoint's chat template
    GET  /metrics                Prometheus (serve/metrics.py)

Requests are checked in the handler (serve/params.py), then handed to the
engine loop (serve/loop.py) as a job; the handler waits on the job's events
and writes the response, or one SSE chunk per round. A client that goes away
has its request aborted: its slot is free for the next one.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from contextlib import asynccontextmanager
from typing import AsyncIterator, Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..runtime import __version__
from . import responses
from .errors import ApiError, error_body
from .loop import EngineLoop, Event, Job, Result
from .metrics import CONTENT_TYPE, ServerMetrics
from .params import Served, chat_prompt, check_common, completion_prompt, plan
from .protocol import ChatCompletionRequest, CompletionRequest

log = logging.getLogger("specdec.serve")

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
OPEN_PATHS = ("/health",)  # answered without the API key (load balancers probe it)


def create_app(served: Served, api_key: str | None = None, max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES) -> FastAPI:
    metrics = ServerMetrics(served.model_name)
    loop = EngineLoop(served, metrics)
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        loop.start()
        try:
            yield
        finally:
            loop.stop()

    app = FastAPI(title="specdec-serve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.loop, app.state.served, app.state.metrics = loop, served, metrics
    _error_handlers(app)
    app.add_middleware(Guard, api_key=api_key, max_request_bytes=max_request_bytes)

    @app.get("/health")
    async def health() -> Response:
        if not loop.alive:
            return JSONResponse(error_body(503, "the engine loop has stopped; restart the server."), status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get("/version")
    async def version() -> dict:
        build = served.engine.target.build
        return {
            "version": __version__,
            "model": served.model_name,
            "backend": build.backend,
            "speculative_methods": served.methods,
            "default_speculation": {"method": served.engine.speculation.method, "num_draft_tokens": served.engine.speculation.draft_len},
            "max_batch_size": served.engine.max_batch,
            "max_input_len": served.engine.max_input_len,
            "max_seq_len": build.max_seq_len,
            "max_draft_len": build.max_draft_len,
        }

    @app.get("/v1/models")
    async def models() -> dict:
        card = {"id": served.model_name, "object": "model", "created": started, "owned_by": "specdec", "max_model_len": served.max_seq_len}
        return {"object": "list", "data": [card]}

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_common(body, served)
        p = plan(body, completion_prompt(body, served), body.max_tokens, served, default_max_tokens=16)  # OpenAI's default
        job = Job(p, served, asyncio.get_running_loop(), "cmpl")
        loop.submit(job)
        if p.stream:
            chunk = lambda ev: responses.completion_chunk(job, served.model_name, ev)  # noqa: E731
            return _stream(loop, job, None, chunk, "text_completion")
        result = await _result(loop, job, request)
        return JSONResponse(responses.completion(job, served.model_name, result)) if result else Response(status_code=499)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_common(body, served)
        if body.max_tokens is not None and body.max_completion_tokens is not None and body.max_tokens != body.max_completion_tokens:
            raise ApiError(400, "max_tokens and max_completion_tokens differ; send one of them.", "max_completion_tokens")
        name = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
        p = plan(body, chat_prompt(body, served), body.max_completion_tokens or body.max_tokens, served, None, name)
        job = Job(p, served, asyncio.get_running_loop(), "chatcmpl")
        loop.submit(job)
        if p.stream:
            chunk = lambda ev: responses.chat_chunk(job, served.model_name, ev)  # noqa: E731
            return _stream(loop, job, responses.chat_chunk(job, served.model_name, None), chunk, "chat.completion.chunk")
        result = await _result(loop, job, request)
        return JSONResponse(responses.chat_completion(job, served.model_name, result)) if result else Response(status_code=499)

    return app


# -- waiting on a job -------------------------------------------------------------------------
async def _collect(job: Job) -> Result:
    while True:
        ev = await job.events.get()
        if ev.error is not None:
            raise ev.error
        if ev.result is not None:
            return ev.result


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _result(loop: EngineLoop, job: Job, request: Request) -> Result | None:
    """The job's result, or None if the client went away first (the request is then aborted)."""
    work = asyncio.ensure_future(_collect(job))
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            loop.abort(job.id)
    return work.result() if not work.cancelled() else None


def _stream(loop: EngineLoop, job: Job, opening: dict | None, chunk: Callable[[Event], dict], obj: str) -> StreamingResponse:
    """Server-sent events: one chunk per round, the last with finish_reason, the usage chunk, [DONE]."""
    model = loop.served.model_name

    async def events() -> AsyncIterator[str]:
        done = False
        try:
            if opening is not None:
                yield responses.sse(opening)
            while True:
                ev = await job.events.get()
                if ev.error is not None:
                    done = True
                    yield responses.sse(ev.error.body())
                    break
                yield responses.sse(chunk(ev))
                if ev.result is not None:
                    done = True
                    if job.plan.include_usage:
                        yield responses.sse(responses.usage_chunk(job, model, obj, ev.result))
                    break
            yield responses.sse("[DONE]")
        finally:
            if not done:  # the client went away (the response was cancelled) before the end
                loop.abort(job.id)

    return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


# -- errors -----------------------------------------------------------------------------------
def _error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_request: Request, err: ApiError) -> JSONResponse:
        return JSONResponse(err.body(), status_code=err.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        return _validation_response(err.errors())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = {404: "no such route; see GET /v1/models, POST /v1/completions, POST /v1/chat/completions.", 405: "method not allowed on this route."}
        return JSONResponse(error_body(err.status_code, message.get(err.status_code, str(err.detail))), status_code=err.status_code)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(error_body(500, f"internal error ({type(err).__name__}); see the server log."), status_code=500)


def _validation_response(errors: list[dict]) -> JSONResponse:
    """Malformed JSON is a 400; JSON of the wrong shape or types is a 422, naming the field."""
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return JSONResponse(error_body(400, f"the request body is not valid JSON: {ctx.get('error', first.get('msg'))}."), status_code=400)
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    if loc and loc[0] == "prompt":
        return JSONResponse(error_body(422, "prompt must be a string, a list of token ids (integers), or a list holding one of those.", "prompt"), status_code=422)
    # union members show up in the location as type names ("list[int]", "str"): drop them
    loc = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "float", "bool", "none")]
    param = ".".join(loc) or None
    return JSONResponse(error_body(422, f"{param or 'body'}: {first.get('msg', 'invalid value')}.", param), status_code=422)


class Guard:
    """ASGI middleware in front of every route: the API key and the body size limit.

    The key is compared in constant time (hmac.compare_digest) over the whole
    ``Authorization`` header. The body is read here, up to the limit, before
    any handler runs, so an oversize body is a 413 whatever its framing.
    """

    def __init__(self, app, api_key: str | None, max_request_bytes: int):
        self.app = app
        self.expected = f"Bearer {api_key}".encode() if api_key else None
        self.limit = max_request_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers") or [])
        if self.expected is not None and scope.get("path") not in OPEN_PATHS:
            given = headers.get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                why = "missing Authorization header" if not given else "invalid API key"
                body = error_body(401, f"{why}: send 'Authorization: Bearer <key>' with the server's --api_key.", code="invalid_api_key")
                return await _send_json(send, 401, body, [(b"www-authenticate", b"Bearer")])
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await _send_json(send, 413, self._too_large(int(declared)))
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
                return await _send_json(send, 413, self._too_large(None))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # after the body: the client's disconnect

        return await self.app(scope, replay, send)

    def _too_large(self, declared: int | None) -> dict:
        size = f"{declared} bytes" if declared is not None else "more than that"
        return error_body(413, f"the request body is {size}; this server takes at most {self.limit} bytes (--max_request_bytes).")


async def _send_json(send, status: int, body: dict, headers: list[tuple[bytes, bytes]] = ()) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode()), *headers]})
    await send({"type": "http.response.body", "body": data})
