"""Stepping a request-level Engine to the end, as the runtime tests do it (one helper instead of a loop per file)."""

from __future__ import annotations

from specdec.runtime.engine import Engine
from specdec.runtime.request import RequestOutput


def run_until_done(engine: Engine) -> dict[str, RequestOutput]:
    """Step ``engine`` until no request is left; each request's final output, by request id."""
    done: dict[str, RequestOutput] = {}
    while engine.has_unfinished():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
    return done
