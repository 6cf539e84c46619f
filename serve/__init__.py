"""specdec.serve: an OpenAI-compatible server over the request-level engine (docs/serving.md).

Needs the ``serve`` extra (FastAPI, uvicorn, prometheus_client, jinja2);
``specdec.runtime`` never imports this package, so a host that only runs
engines stays as light as before.

    from specdec.serve import build_served, create_app
    app = create_app(build_served("engines/target", draft_dir="engines/draft"), api_key="...")
    # uvicorn.run(app, host="127.0.0.1", port=8000)   or: specdec-serve --engine_dir engines/target ...
"""

from .app import create_app  # noqa: F401
from .errors import ApiError  # noqa: F401
from .params import Served  # noqa: F401
from .server import build_served, run_server  # noqa: F401
