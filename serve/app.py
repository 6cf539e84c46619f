"""The ASGI app: OpenAI's routes over one engine loop.

    GET  /health                 200 ready; 503 while loading (serve/server.py), draining (SIGTERM) or stopped; needs no API key
    GET  /version                versions and the engines' limits
    GET  /v1/models              the one served model
    POST /v1/completions         prompts as text or token ids; n, best_of, echo, logprobs; stream or not
    POST /v1/chat/completions    messages through the checkpoint's chat template; tools; stream or not
    POST /tokenize, /detokenize  vLLM's: a prompt's or a conversation's token ids, and token ids' text
    GET  /metrics                Prometheus (serve/metrics.py)
    GET  /openapi.json           the request and response schemas (what schemathesis fuzzes)

Requests are checked in the handler (serve/params.py), then handed to the
engine loop (serve/loop.py) as a job; the handler waits on the job's events
and writes the response, or one SSE chunk per round and choice. A client that
goes away, or outlives --request_timeout, has its request aborted: its slots
are free for the next one.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..formats import __version__
from . import responses
from .errors import ApiError, error_body
from .guard import Guard
from .jobs import Event, Job, Result
from .loop import EngineLoop
from .metrics import CONTENT_TYPE, ServerMetrics
from .params import Served, chat_plan, check_common, completion_plan, detokenized, tokenized
from .protocol import TOKENIZE_TAGS, ChatCompletionRequest, CompletionRequest, DetokenizeRequest, ErrorResponse, TokenizeRequest
from .tools import ToolTextFilter

log = logging.getLogger("specdec.serve")

DEFAULT_MAX_REQUEST_BYTES = 4 * 1024 * 1024
DEFAULT_SHUTDOWN_TIMEOUT = 30.0
_ERR = {"model": ErrorResponse}
ERRORS = {400: _ERR, 401: _ERR, 404: _ERR, 413: _ERR, 500: _ERR, 503: _ERR}
POST_ERRORS = {**ERRORS, 504: _ERR, 200: {"content": {"text/event-stream": {}}, "description": "JSON, or server-sent events with stream=true"}}


class ServerState:
    """What the routes share: the loaded model, its engine loop, and where the server is in its life.

    (While the engines load, before this app exists, serve/server.py's loading responder answers
    /health with "loading".)
    """

    def __init__(self, served: Served, metrics: ServerMetrics, loop: EngineLoop) -> None:
        self.served, self.metrics, self.loop = served, metrics, loop
        self.status = "ready"  # ready | draining | stopped

    def ready(self) -> tuple[Served, EngineLoop]:
        return self.served, self.loop


def create_app(
    served: Served,
    api_key: str | None = None,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    max_queued_requests: int | None = None,
    request_timeout: float | None = None,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> FastAPI:
    """The app over a loaded model. ``max_queued_requests``: requests waiting for a slot beyond the free ones
    before a 503 (None: no limit); ``request_timeout``: seconds before a request is stopped with a 504;
    ``shutdown_timeout``: seconds the running requests get after SIGTERM (serve/server.py calls ``app.state.drain``)."""
    metrics = ServerMetrics(served.model_name)
    state = ServerState(served, metrics, EngineLoop(served, metrics, max_queued_requests))
    started = int(time.time())

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        state.loop.start()
        try:
            yield
        finally:
            state.status = "stopped"
            state.loop.stop()

    app = FastAPI(title="specdec-serve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url="/openapi.json")
    app.state.server = state
    app.state.drain = lambda: _drain(state, shutdown_timeout)
    _error_handlers(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(Guard, api_key=api_key, max_request_bytes=max_request_bytes)

    @app.get("/health", responses={503: _ERR})
    async def health() -> Response:
        """200 when ready; 503 while draining after SIGTERM, or after the engine loop stopped."""
        if state.status == "ready" and not state.loop.alive:
            state.status = "stopped"
        if state.status == "ready":
            return JSONResponse({"status": "ok"})
        why = {"draining": "the server is shutting down (SIGTERM): finishing the requests it has.",
               "stopped": "the engine loop has stopped; restart the server."}[state.status]
        return JSONResponse({"status": state.status, **error_body(503, why)}, status_code=503)

    @app.get("/version", responses=ERRORS)
    async def version() -> dict:
        s, _ = state.ready()
        build = s.engine.target.build
        return {
            "version": __version__,
            "model": s.model_name,
            "backend": build.backend,
            "speculative_methods": s.methods,
            "default_speculation": {"method": s.engine.speculation.method, "num_draft_tokens": s.engine.speculation.draft_len},
            "max_batch_size": s.engine.max_batch,
            "max_input_len": s.engine.max_input_len,
            "max_seq_len": build.max_seq_len,
            "max_draft_len": build.max_draft_len,
        }

    @app.get("/v1/models", responses=ERRORS)
    async def models() -> dict:
        s, _ = state.ready()
        card = {"id": s.model_name, "object": "model", "created": started, "owned_by": "specdec", "max_model_len": s.max_seq_len,
                "max_input_len": s.engine.max_input_len}  # vLLM's card has the first; a prompt longer than the second is refused
        return {"object": "list", "data": [card]}

    @app.get("/metrics", responses={**ERRORS, 200: {"content": {"text/plain": {}}}})
    async def prometheus() -> Response:
        state.ready()
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE)

    @app.post("/reset_prefix_cache", responses=ERRORS)
    async def reset_prefix_cache() -> dict:
        """vLLM's route: forget the finished sequences the prefix cache holds (a cold start for a benchmark)."""
        _, loop = state.ready()
        return {"reset": await asyncio.wrap_future(loop.reset_prefix_cache())}

    @app.post("/v1/completions", responses=POST_ERRORS)
    async def completions(body: CompletionRequest, request: Request) -> Response:
        s, loop = state.ready()
        check_common(body, s)
        # tokenizing a prompt of megabytes takes seconds (without the GIL): off the event loop, which serves the others meanwhile
        job = Job(await asyncio.to_thread(completion_plan, body, s), s, asyncio.get_running_loop(), "cmpl")
        loop.submit(job)
        if job.plan.stream:
            return _stream(loop, job, request_timeout, responses.completion_chunks(job, s), "text_completion")
        result = await _result(loop, job, request, request_timeout)
        return JSONResponse(responses.completion(job, s, result)) if result else Response(status_code=499)

    @app.post("/v1/chat/completions", responses=POST_ERRORS)
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        s, loop = state.ready()
        check_common(body, s)
        job = Job(await asyncio.to_thread(chat_plan, body, s), s, asyncio.get_running_loop(), "chatcmpl")
        loop.submit(job)
        if job.plan.stream:
            return _stream(loop, job, request_timeout, _chat_chunks(job, s), "chat.completion.chunk")
        result = await _result(loop, job, request, request_timeout)
        return JSONResponse(responses.chat_completion(job, s, result)) if result else Response(status_code=499)

    @app.post("/tokenize", responses=ERRORS)
    async def tokenize(body: TokenizeRequest) -> dict:
        """vLLM's route: a prompt's (or a conversation's, through the chat template) token ids, as the generation routes read them."""
        s, _ = state.ready()
        return await asyncio.to_thread(tokenized, body, s)

    @app.post("/detokenize", responses=ERRORS)
    async def detokenize(body: DetokenizeRequest) -> dict:
        """vLLM's route: token ids -> text."""
        s, _ = state.ready()
        return detokenized(body, s)

    return app


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, less the 422 it documents on every route with a body: invalid bodies are a 400 here."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        for path in schema.get("paths", {}).values():
            for operation in path.values():
                operation.get("responses", {}).pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema


def _drain(state: ServerState, grace_s: float) -> None:
    """SIGTERM: /health says draining, new requests get a 503, the running ones get ``grace_s`` seconds."""
    if state.status == "ready":
        state.status = "draining"
    state.loop.drain(grace_s)


def _chat_chunks(job: Job, served: Served) -> Callable[[Event], list[dict[str, Any]]]:
    """Each choice opens with a role chunk; tool-call text is held back and sent as tool_calls at the end."""
    opened: set[int] = set()
    filters: dict[int, ToolTextFilter] = {}

    def chunks(ev: Event) -> list[dict[str, Any]]:
        out = []
        if ev.index not in opened:
            opened.add(ev.index)
            out.append(responses.chat_opening(job, served, ev.index))
        text, calls = ev.text, None
        if job.plan.tools is not None:
            f = filters.setdefault(ev.index, ToolTextFilter(job.plan.tools))
            text = f.feed(ev.text)
            if ev.finish_reason is not None:
                rest, calls = f.finish()
                text += rest
        out.append(responses.chat_chunk(job, served, ev, text, calls))
        return out

    return chunks


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


def _timed_out(timeout: float) -> ApiError:
    return ApiError(504, f"the request did not finish within {timeout:g} s (--request_timeout) and was stopped; lower max_tokens or ask the operator "
                         "for a longer timeout.",
                    code="request_timeout")


async def _result(loop: EngineLoop, job: Job, request: Request, timeout: float | None) -> Result | None:
    """The job's result; None if the client went away first; a 504 past the timeout (either way, the request is aborted)."""
    work = asyncio.ensure_future(_collect(job))
    gone = asyncio.ensure_future(_disconnected(request))
    done: set = set()
    try:
        done, _ = await asyncio.wait({work, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not work.done():
            work.cancel()
            loop.abort(job.id)
    if work in done:
        return work.result()
    if gone in done:
        return None
    raise _timed_out(timeout or 0.0)


def _stream(loop: EngineLoop, job: Job, timeout: float | None, chunks: Callable[[Event], list[dict]], obj: str) -> StreamingResponse:
    """Server-sent events: chunks per round and choice, the last with finish_reason, the usage chunk, [DONE]."""
    model = loop.served.model_name
    deadline = None if timeout is None else job.arrival + timeout

    async def events() -> AsyncIterator[str]:
        done = False
        try:
            while True:
                try:
                    left = None if deadline is None else max(deadline - time.perf_counter(), 0.0)
                    ev = await asyncio.wait_for(job.events.get(), left)
                except asyncio.TimeoutError:
                    done = True
                    loop.abort(job.id)
                    yield responses.sse(_timed_out(timeout).body())  # type: ignore[arg-type]
                    break
                if ev.error is not None:
                    done = True
                    yield responses.sse(ev.error.body())
                    break
                for chunk in chunks(ev):
                    yield responses.sse(chunk)
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
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(_request: Request, err: RequestValidationError) -> JSONResponse:
        return _validation_response(err.errors())

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, err: StarletteHTTPException) -> JSONResponse:
        message = {404: "no such route; see GET /v1/models, POST /v1/completions, POST /v1/chat/completions.",
                   405: "method not allowed on this route.",
                   400: "the request body could not be read as JSON."}
        status = err.status_code if err.status_code in (400, 404, 405) else 400
        return JSONResponse(error_body(status, message.get(err.status_code, str(err.detail))), status_code=status)

    @app.exception_handler(Exception)
    async def unexpected(_request: Request, err: Exception) -> JSONResponse:
        log.exception("unexpected error")
        return JSONResponse(error_body(500, f"internal error ({type(err).__name__}); see the server log."), status_code=500)


UNION_PARTS = ("str", "int", "float", "bool", "none", "list", "dict")


def _field(error: dict) -> str | None:
    """The request field a validation error is about: its location without "body" and without the union members, which
    show up as type names ("list[int]", "str", "constrained-int")."""
    loc = [str(p) for p in error.get("loc", ()) if p != "body"]
    return ".".join(p for p in loc if not any(c in p for c in "[]-") and p not in UNION_PARTS) or None


def _validation_response(errors: list[dict]) -> JSONResponse:
    """Malformed JSON, and JSON of the wrong shape or types, is a 400 naming the field, as OpenAI and vLLM answer it
    (the openai client raises BadRequestError; FastAPI's own 422 would be its UnprocessableEntityError)."""
    first = errors[0] if errors else {"type": "", "loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        ctx = first.get("ctx") or {}
        return JSONResponse(error_body(400, f"the request body is not valid JSON: {ctx.get('error', first.get('msg'))}."), status_code=400)
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and p not in TOKENIZE_TAGS]  # a union's member tags are no field
    if not loc and first.get("type") in ("model_attributes_type", "dict_type", "model_type"):  # a list, a string: or no JSON content type
        return JSONResponse(error_body(400, "the request body must be a JSON object, sent with Content-Type: application/json."), status_code=400)
    if loc and loc[0] == "prompt":
        return JSONResponse(error_body(400, "prompt must be a string, a list of token ids (integers >= 0), or a list of those (at most 256, none "
                                            "empty).", "prompt"), status_code=400)
    param = _field(first)
    # a value of a union type (stop: a string or a list) fails each member: the member whose type matched says what is wrong
    # ("List should have at most 16 items"), not the first one ("Input should be a valid string")
    # (several such members, as int | "auto" given "AUTO": each says what it takes)
    same = [e for e in errors if _field(e) == param]
    matched = [e for e in same if not str(e.get("type", "")).endswith("_type")] or [first]
    if all(e.get("type") == "literal_error" for e in matched):  # int | "auto" given 2.5: the int member's word too
        matched = [e for e in same if e not in matched] + matched
    msg = "; or ".join(dict.fromkeys(" ".join(str(e.get("msg", "invalid value")).split()) for e in matched))
    return JSONResponse(error_body(400, f"{param or 'body'}: {msg}.", param), status_code=400)
