"""specdec-serve: an OpenAI-compatible server with speculative decoding (docs/serving.md)."""

from __future__ import annotations

import logging
import threading

import click

from ..formats.engine_format import load_engine_dir
from ..formats.errors import RequestError
from ..runtime.kv_cache import commit_host_caches
from ..runtime.methods import method_names
from ..runtime.prefix_cache import PrefixCacheConfig
from .common import (
    STEP_COSTS,
    clean_errors,
    measure_step_costs_option,
    method_configs,
    method_options,
    option,
    prefix_caching_options,
    verify_engine_option,
)
from .run import parse_draft_len


@click.command(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@option("engine_dir", required=True, type=click.Path(), help="Target engine directory (from specdec-build).")
@method_options
@option("speculative_method", type=click.Choice(list(method_names())), default=None,
        help="The method a request runs when it names none (a request's speculative.method chooses per request) [default: draft if a "
             "draft engine is loaded, else ngram if --ngram_config, else suffix if --suffix_config, else medusa / eagle / peagle for a "
             "target built with them, else none].")
@option("draft_len", type=str, default=None,
        help="Default drafts per round of the default method: a number, or 'auto' [default: from the config string].")
@option("host", type=str, default="127.0.0.1", show_default=True,
        help="Address to bind. The default answers this machine only; 0.0.0.0 exposes the server to the network (set --api_key).")
@option("port", type=int, default=8000, show_default=True, help="Port to bind (0: any free port; the real one is printed).")
@option("api_key", type=str, default=None, envvar="SPECDEC_API_KEY",
        help="Require 'Authorization: Bearer KEY' on every route but /health [env: SPECDEC_API_KEY].")
@option("served_model_name", type=str, default=None, help="The model name clients send [default: the engine directory's name].")
@option("tokenizer_dir", type=click.Path(), help="Tokenizer directory [default: the engine's own].")
@option("chat_template", type=click.Path(exists=True, dir_okay=False),
        help="A jinja chat template file [default: chat_template from tokenizer_config.json].")
@option("end_id", type=int, default=None, help="Token id that ends a request [default: the tokenizer's EOS]; -1: never stop on EOS.")
@option("max_request_bytes", type=click.IntRange(min=1), default=4 * 1024 * 1024, show_default=True,
        help="Largest request body accepted (larger: 413).")
@option("max_queued_requests", type=click.IntRange(min=0), default=None,
        help="Requests that may wait for a cache slot beyond the free ones; more get a 503 with Retry-After [default: no limit].")
@option("request_timeout", type=click.FloatRange(min=0, min_open=True), default=None,
        help="Seconds a request may run; then it is stopped and answered with a 504 [default: no limit].")
@option("shutdown_timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
        help="On SIGTERM: seconds the running requests get to finish before they end with a 503.")
@option("device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True, help="Where engines run (as specdec-run).")
@option("num_threads", type=int, default=None, help="ONNX Runtime intra-op threads of the target engine [default: all cores, up to 8].")
@option("draft_num_threads", type=int, default=1, show_default=True, help="Threads of the draft engine.")
@option("allow_vocab_mismatch", is_flag=True,
        help="Take a draft's token ids as the target's although their tokenizers differ (default: it drafts through text).")
@option("log_level", type=click.Choice(["critical", "error", "warning", "info", "debug"]), default="info", show_default=True,
        help="Server log level (debug: every request logged).")
@option("preallocate_kv", type=click.Choice(["auto", "on", "off"]), default="auto", show_default=True,
        help="Write the CPU KV caches (the target's, the prefix pool's, the drafts') once at load, so that the first requests "
             "do not pay for mapping their memory (on a fresh server the first 16-stream burst ran ~30% slower). auto: when "
             "they take at most half the memory available; off: mapped as they fill.")
@prefix_caching_options
@measure_step_costs_option
@verify_engine_option
@clean_errors
def main(engine_dir, speculative_method, draft_len, host, port, api_key, served_model_name, tokenizer_dir, chat_template, end_id, max_request_bytes,
         max_queued_requests, request_timeout, shutdown_timeout, device, num_threads, draft_num_threads, allow_vocab_mismatch, log_level,
         preallocate_kv, prefix_cache_slots, enable_prefix_caching, measure_step_costs, verify_engine, **flags) -> None:
    """Serve an engine over OpenAI's API: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics, /version.

    \b
    Draft model and n-gram both loaded; each request may choose ("speculative": {"method": ..., "num_draft_tokens": ...}):
      specdec-serve --engine_dir engines/target --draft_engine_dir engines/draft \\
          --draft_target_model_config "[4,[0],[0],False]" --ngram_config "[8,3,[0]]" --port 8000
    Then:
      curl http://127.0.0.1:8000/v1/completions -H 'Content-Type: application/json' \\
          -d '{"prompt": "def fib(n):", "max_tokens": 32, "temperature": 0}'
    """
    try:
        from ..serve import build_served, create_app, run_server
    except ImportError as err:
        raise RequestError(f"specdec-serve needs the serve extra: pip install 'specdec[serve]' ({err}).") from None
    drafters = [config for _, config in method_configs(flags)]  # each drafting method's flags (runtime/methods.py) -> its config
    if host not in ("127.0.0.1", "localhost", "::1") and not api_key:
        click.echo(f"warning: binding {host} without --api_key: anyone who can reach this port can use the server.", err=True)
    logging.basicConfig(level=log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    loaded: dict = {}

    def load():
        target = load_engine_dir(engine_dir, verify=verify_engine)
        served = build_served(target, drafters=drafters, served_model_name=served_model_name, tokenizer_dir=tokenizer_dir,
                              chat_template=chat_template, end_id=end_id, method=speculative_method, draft_len=parse_draft_len(draft_len),
                              device=device, num_threads=num_threads, draft_num_threads=draft_num_threads,
                              allow_vocab_mismatch=allow_vocab_mismatch, verify=verify_engine,
                              prefix_caching=PrefixCacheConfig(enable_prefix_caching, prefix_cache_slots),
                              measure_step_costs=STEP_COSTS[measure_step_costs])
        commit_host_caches(preallocate_kv)  # logs what it did
        if served.engine.prefix_caching_off:
            click.echo(f"specdec-serve: {served.engine.prefix_caching_off}", err=True)
        if served.engine.step_costs_note:
            click.echo(f"specdec-serve: {served.engine.step_costs_note}", err=True)
        if served.engine.pairing is not None and served.engine.pairing.mode != "shared":
            click.echo(f"specdec-serve: pairing: {served.engine.pairing.note}", err=True)
        loaded["served"] = served
        return create_app(served, api_key=api_key, max_request_bytes=max_request_bytes, max_queued_requests=max_queued_requests,
                          request_timeout=request_timeout, shutdown_timeout=shutdown_timeout)

    def bound(url: str) -> None:
        # said only if loading takes a while: a load that fails at once prints its one error line alone
        note = threading.Timer(2.0, lambda: "served" in loaded or click.echo(f"loading {engine_dir}; GET {url}/health answers 503 \"loading\" until "
                                                                             "it is ready", err=True))
        note.daemon = True
        note.start()

    def ready(url: str) -> None:
        served = loaded["served"]
        spec = served.engine.speculation
        click.echo(f"specdec-serve: model {served.model_name!r} (methods: {', '.join(served.methods)}; default {spec.method}"
                   f"{f', {spec.draft_len} drafts' if spec.drafts else ''}) on {url}", err=True)

    run_server(load, host, port, log_level=log_level, on_ready=ready, on_bound=bound, shutdown_timeout=shutdown_timeout)


if __name__ == "__main__":
    main()
