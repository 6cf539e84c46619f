"""Scale specdec-serve out with Ray Serve: N replicas behind Ray's HTTP proxy, the same OpenAI routes.

Each replica is one process holding its own engines and its own engine loop:
exactly what ``specdec-serve`` runs, built by ``specdec.serve.create_app``.
Ray's proxy takes the HTTP requests and routes each to a replica (the least
loaded of two picked at random); streaming, the API key, the error JSON and
the speculation extension are the replicas' own, unchanged.

    pip install 'specdec[ray]'     # ray[serve] (~100+ MB) and the serve extra
    python examples/ray_serve.py --engine_dir /tmp/serve-demo/target --draft_engine_dir /tmp/serve-demo/draft \\
        --draft_target_model_config "[4,[0],[0],False]" --ngram_config "[8,3,[0]]" --num_replicas 2 --port 8000

then talk to http://127.0.0.1:8000/v1 as to specdec-serve. ``--check`` sends a
burst of requests through the proxy, prints which replica answered each and
whether greedy outputs agree, then shuts down (a self-test a user can run).

/metrics through the proxy answers from whichever replica takes it: scrape the
replicas one by one, or sum them in Prometheus (each has its own counters).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from ray import serve


@serve.ingress()
class SpecdecReplica:
    """One replica: the engines, the engine loop and the OpenAI routes (specdec.serve.create_app)."""

    def __init__(self, engine_dir: str, draft_engine_dir: str | None, draft_target_model_config: str | None, ngram_config: str | None,
                 served_model_name: str | None, api_key: str | None, num_threads: int | None):
        from specdec.runtime import parse_draft_target_config, parse_ngram_config
        from specdec.serve import build_served

        dtm = parse_draft_target_config(draft_target_model_config) if draft_target_model_config else None
        ngram = parse_ngram_config(ngram_config) if ngram_config else None
        self.served = build_served(engine_dir, draft_engine_dir, dtm, ngram, served_model_name=served_model_name, num_threads=num_threads)
        self.api_key = api_key
        self.replica = serve.get_replica_context().replica_id.unique_id

    def __serve_build_asgi_app__(self):
        from specdec.serve import create_app

        app = create_app(self.served, api_key=self.api_key)
        replica = self.replica.encode()

        @app.middleware("http")
        async def name_the_replica(request, call_next):  # shows which replica answered (--check counts them)
            response = await call_next(request)
            response.headers["x-specdec-replica"] = replica.decode()
            return response

        return app


def _post(url: str, body: dict, headers: dict):
    """POST JSON with the standard library (this example needs nothing past ray and specdec)."""
    import json
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json", **headers})
    return urllib.request.urlopen(req, timeout=120)


def check(url: str, api_key: str | None, n: int = 16) -> bool:
    """A burst of n greedy requests through the proxy: every one answered, the same text from every replica."""
    import json
    import urllib.request

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    body = {"prompt": "def fibonacci(n):", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    with urllib.request.urlopen(urllib.request.Request(f"{url}/version", headers=headers), timeout=30) as r:
        loaded = json.load(r)["speculative_methods"]
    specs = [{"method": m} for m in ("none", "draft", "ngram") if m in loaded]

    def ask(i: int):
        with _post(f"{url}/v1/completions", {**body, "speculative": specs[i % len(specs)]}, headers) as r:
            return r.status, r.headers.get("x-specdec-replica"), json.load(r)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(ask, range(n)))
    took = time.perf_counter() - t0
    texts = {a[2]["choices"][0]["text"] for a in answers if a[0] == 200}
    replicas: dict[str, int] = {}
    for _status, replica, _ in answers:
        replicas[replica] = replicas.get(replica, 0) + 1
    print(f"{n} requests in {took:.2f}s: status {sorted({a[0] for a in answers})}, answered by {len(replicas)} replicas {replicas}")
    print(f"greedy outputs identical across replicas and methods ({', '.join(s['method'] for s in specs)}): {len(texts) == 1}")
    with _post(f"{url}/v1/completions", {**body, "stream": True}, headers) as r:
        chunks = [line.decode().strip() for line in r if line.startswith(b"data: ")]
    print(f"streaming through the proxy: {len(chunks) - 1} chunks, ends with {chunks[-1]!r}")
    return all(a[0] == 200 for a in answers) and len(texts) == 1 and len(replicas) >= 2


def main() -> None:
    ap = argparse.ArgumentParser(description="specdec-serve replicas behind Ray Serve's HTTP proxy.")
    ap.add_argument("--engine_dir", required=True)
    ap.add_argument("--draft_engine_dir")
    ap.add_argument("--draft_target_model_config")
    ap.add_argument("--ngram_config")
    ap.add_argument("--served_model_name")
    ap.add_argument("--api_key", default=os.environ.get("SPECDEC_API_KEY"))
    ap.add_argument("--num_replicas", type=int, default=2)
    ap.add_argument("--num_threads", type=int, default=1, help="ONNX Runtime threads per replica's target engine")
    ap.add_argument("--cpus_per_replica", type=float, default=1.0)
    ap.add_argument("--max_ongoing_requests", type=int, default=32, help="per replica: the engine queues what its slots cannot hold")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--check", action="store_true", help="send a burst of requests, report, and exit")
    args = ap.parse_args()

    import ray

    ray.init(num_cpus=max(2, int(args.num_replicas * args.cpus_per_replica) + 1), include_dashboard=False)
    serve.start(http_options={"host": args.host, "port": args.port})
    deployment = serve.deployment(
        SpecdecReplica,
        name="specdec",
        num_replicas=args.num_replicas,
        max_ongoing_requests=args.max_ongoing_requests,
        ray_actor_options={"num_cpus": args.cpus_per_replica},
    )
    app = deployment.bind(args.engine_dir, args.draft_engine_dir, args.draft_target_model_config, args.ngram_config,
                          args.served_model_name, args.api_key, args.num_threads)
    serve.run(app, name="specdec", route_prefix="/")
    url = f"http://{args.host}:{args.port}"
    print(f"{args.num_replicas} specdec replicas behind Ray Serve on {url}", flush=True)
    if args.check:
        ok = check(url, args.api_key)
        serve.shutdown()
        ray.shutdown()
        sys.exit(0 if ok else 1)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()


if __name__ == "__main__":
    main()
