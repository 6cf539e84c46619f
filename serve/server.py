"""Load what a server serves, and run it: in the foreground (the CLI) or in a thread (tests, benchmarks).

The socket is bound here rather than by uvicorn, so ``port=0`` (an ephemeral
port) works and the real address is known before the first request.
"""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Any

from ..runtime.config_strings import DraftTargetConfig, NGramConfig
from ..runtime.engine_format import TREE_MODES, load_engine_dir
from ..runtime.loading import load_engine, own_draft_len
from ..runtime.tokenizer import Tokenizer
from .chat import find_template, special_tokens
from .params import Served


def build_served(
    target_dir: str | Path,
    draft_dir: str | Path | None = None,
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
    target = load_engine_dir(target_dir)
    engine = load_engine(target, draft_dir, draft_target, ngram, **engine_kwargs)
    tok_dir = tokenizer_dir or (target.path if target.tokenizer_path else None)
    tok = Tokenizer(tok_dir) if tok_dir else None
    if end_id is not None:
        end_ids: tuple[int, ...] = () if end_id < 0 else (end_id,)
    else:
        end_ids = (tok.eos_token_id,) if tok and tok.eos_token_id is not None else tuple(target.config.model.eos_token_id)
    max_draft = target.config.build.max_draft_len
    draft_lens: dict[str, int | str] = {}
    if "draft" in engine.proposers:
        draft_lens["draft"] = draft_target.draft_len if draft_target else min(4, max(max_draft, 1))
    if ngram is not None:
        draft_lens["ngram"] = min(ngram.max_draft_len, max_draft)
    if "suffix" in engine.proposers:
        draft_lens["suffix"] = min(engine.proposers["suffix"].config.max_draft_len, max_draft)
    for name in TREE_MODES:  # the target's own drafter: its tree's nodes, or its chain
        if name in engine.proposers:
            draft_lens[name] = own_draft_len(engine.proposers[name])
    if engine.speculation.method != "none":
        draft_lens[engine.speculation.method] = engine.speculation.draft_len  # --draft_len, when given, is the default method's
    return Served(
        engine=engine,
        tokenizer=tok,
        model_name=served_model_name or Path(target_dir).resolve().name,
        end_ids=end_ids,
        chat_template=find_template(tok, chat_template),
        special_tokens=special_tokens(tok) if tok else {},
        draft_lens=draft_lens,
    )


def bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def _uvicorn_server(app, log_level: str):
    import uvicorn

    # uvicorn's own limits stay generous; the app's Guard answers oversize bodies with a 413
    return uvicorn.Server(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5, access_log=log_level == "debug"))


def run_server(app, host: str = "127.0.0.1", port: int = 8000, log_level: str = "info", on_ready=None) -> None:
    """Serve until interrupted. ``on_ready(url)`` is called once the socket is bound."""
    sock = bind(host, port)
    url = f"http://{host if ':' not in host else f'[{host}]'}:{sock.getsockname()[1]}"
    if on_ready:
        on_ready(url)
    _uvicorn_server(app, log_level).run(sockets=[sock])


class ServerThread:
    """A real server on 127.0.0.1 in a background thread:

        with ServerThread(app) as url:
            httpx.get(f"{url}/health")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"):
        self.sock = bind(host, port)
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = _uvicorn_server(app, log_level)
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
