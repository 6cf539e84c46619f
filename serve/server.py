"""Load what a server serves, and run it: in the foreground (the CLI) or in a thread (tests, benchmarks).

The socket is bound here rather than by uvicorn, so ``port=0`` (an ephemeral
port) works and the real address is known before the first request. It is
bound *before* the engines load: meanwhile a small responder answers every
request on it with 503 ``{"status": "loading"}`` and Retry-After, so a load
balancer or an orchestrator's readiness probe tells "loading" from "down";
once the app exists, uvicorn takes over the same socket.

SIGTERM (or Ctrl-C) drains: /health answers 503 "draining", new requests get
a 503, and the running ones have ``--shutdown_timeout`` seconds to finish;
those still running then end with a 503 error, and the process exits 0.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from ..formats.config_strings import DraftTargetConfig, NGramConfig
from ..formats.engine_format import EngineDir, load_engine_dir
from ..formats.tokenizer import Tokenizer
from ..runtime.loading import load_engine, method_draft_lens
from .chat import find_template, special_tokens
from .errors import error_body
from .params import Served


def build_served(
    target_dir: str | Path | EngineDir,
    draft_dir: str | Path | EngineDir | None = None,
    draft_target: DraftTargetConfig | None = None,
    ngram: NGramConfig | None = None,
    *,
    served_model_name: str | None = None,
    tokenizer_dir: str | Path | None = None,
    chat_template: str | Path | None = None,
    end_id: int | None = None,
    **engine_kwargs: Any,
) -> Served:
    """Load the engines (load_engine's checks all apply) and the tokenizer and chat template."""
    target = target_dir if isinstance(target_dir, EngineDir) else load_engine_dir(target_dir)
    engine = load_engine(target, draft_dir, draft_target, ngram, **engine_kwargs)
    tok_dir = tokenizer_dir or (target.path if target.tokenizer_path else None)
    tok = Tokenizer(tok_dir) if tok_dir else None
    if end_id is not None:
        end_ids: tuple[int, ...] = () if end_id < 0 else (end_id,)
    else:
        end_ids = (tok.eos_token_id,) if tok and tok.eos_token_id is not None else tuple(target.config.model.eos_token_id)
    return Served(
        engine=engine,
        tokenizer=tok,
        model_name=served_model_name or target.path.resolve().name,
        end_ids=end_ids,
        chat_template=find_template(tok, chat_template),
        special_tokens=special_tokens(tok) if tok else {},
        draft_lens=method_draft_lens(engine),
    )


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(app, log_level: str, shutdown_timeout: float = 30.0):
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            drain = getattr(getattr(app, "state", None), "drain", None)
            if drain is not None and not self.should_exit:
                drain()  # the engine loop ends what is still running at the deadline, each with a 503
            super().handle_exit(sig, frame)

    # uvicorn waits for open connections a little past the app's own deadline, so each gets its answer first.
    # Its own limits stay generous; the app's Guard answers oversize bodies with a 413.
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=int(shutdown_timeout) + 5, access_log=log_level == "debug")
    return Server(config)


LOADING_BODY = json.dumps({"status": "loading", **error_body(503, "the model is loading; retry shortly.")}).encode()


class _Loading(BaseHTTPRequestHandler):
    """Every request while the engines load: 503 {"status": "loading"} (no route needs the engines to say so)."""

    protocol_version = "HTTP/1.1"

    def _loading(self) -> None:
        body = LOADING_BODY
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Retry-After", "2")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)
        self.close_connection = True

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = _loading

    def log_message(self, *args) -> None:  # quiet: uvicorn logs requests once it serves
        pass


@contextmanager
def answering_loading(sock: socket.socket) -> Iterator[None]:
    """Answer on ``sock`` with 503 "loading" until the block ends; the socket stays bound and listening."""
    httpd = ThreadingHTTPServer(sock.getsockname()[:2], _Loading, bind_and_activate=False)
    httpd.socket.close()
    httpd.socket = sock
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="specdec-loading", daemon=True)
    thread.start()
    try:
        yield
    finally:
        httpd.shutdown()
        thread.join()


def url_of(host: str, sock: socket.socket) -> str:
    return f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"


def run_server(app_or_loader, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", on_ready=None,
               on_bound: Callable[[str], None] | None = None, shutdown_timeout: float = 30.0) -> None:
    """Serve until SIGTERM or Ctrl-C (then drain). ``app_or_loader``: the app, or a function that loads and returns it
    (the socket answers "loading" meanwhile; its errors propagate before anything is served).
    ``on_bound(url)``: the socket is bound; ``on_ready(url)``: the app is serving."""
    sock = bind(host, port)
    url = url_of(host, sock)
    try:
        if on_bound:
            on_bound(url)
        if callable(app_or_loader) and not hasattr(app_or_loader, "router"):
            with answering_loading(sock):
                app = app_or_loader()
        else:
            app = app_or_loader
        server = _uvicorn_server(app, log_level, shutdown_timeout)
        if on_ready:
            on_ready(url)
        server.run(sockets=[sock])
    finally:
        sock.close()


class ServerThread:
    """A real server on 127.0.0.1 in a background thread:

        with ServerThread(app) as url:
            httpx.get(f"{url}/health")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning", shutdown_timeout: float = 30.0):
        self.sock = bind(host, port)
        self.url = url_of(host, self.sock)
        self.server = _uvicorn_server(app, log_level, shutdown_timeout)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name="specdec-serve", daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        for _ in range(600):
            if self.server.started:
                return self.url
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited during startup")
            self.thread.join(0.05)
        raise RuntimeError("the server did not start within 30 s")

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        self.sock.close()
