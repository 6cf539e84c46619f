"""Prometheus metrics, with vLLM's definitions under the ``specdec:`` prefix.

| metric | vLLM's | definition |
|---|---|---|
| specdec:spec_decode_num_drafts_total | vllm:spec_decode_num_drafts | rounds in which a request was given at least one draft |
| specdec:spec_decode_num_draft_tokens_total | vllm:spec_decode_num_draft_tokens | draft tokens verified |
| specdec:spec_decode_num_accepted_tokens_total | vllm:spec_decode_num_accepted_tokens | draft tokens accepted |
| specdec:spec_decode_num_accepted_tokens_per_pos_total{position} | vllm:spec_decode_num_accepted_tokens_per_pos | accepted drafts at position j (0-based) |
| specdec:spec_decode_silent_drafts_total | (ours) | requests whose drafts the target rejected SILENT_DRAFT_ROUNDS drafting rounds in a row (runtime/guards.py) |
| specdec:spec_decode_decision_seconds_total | (ours) | draft_len=auto's deciding: each request's share of each round's decision time |
| specdec:request_compute_seconds_total | (ours) | each request's share of the target calls, draft steps and decisions of its rounds (decision share = the one above / this) |
| specdec:prompt_tokens_total / generation_tokens_total | same | tokens in prompts / tokens generated |
| specdec:prefix_cache_queries_total / prefix_cache_hits_total | vllm:prefix_cache_queries / prefix_cache_hits | prompt tokens looked up in the prefix cache / found there (copied, not prefilled); hit rate = hits / queries |
| specdec:request_success_total{finished_reason} | same | requests ended: stop, length, abort, error |
| specdec:request_errors_total{code} | (ours) | requests ended with finish_reason error, by cause: nonfinite_logits, grammar_failed |
| specdec:e2e_request_latency_seconds | same | arrival at the server -> last token |
| specdec:time_to_first_token_seconds | same | arrival at the server -> first token |
| specdec:request_time_per_output_token_seconds | same | (last token - first token) / (output tokens - 1), per request |
| specdec:request_queue_time_seconds | same | arrival -> a cache slot |
| specdec:num_requests_running / num_requests_waiting | same | requests holding a slot / queued |

From these, as vLLM does: acceptance rate = accepted / draft tokens, mean
acceptance length = 1 + accepted / drafts. A response's own ``speculative``
field reports runtime/metrics.py's mean acceptance length, 1 + accepted /
rounds (tokens per target call: rounds without drafts count too).
Counters move when a request ends, by that request's own figures, before its
response is sent: a client that read a response and then /metrics sees it
counted.
"""  # noqa: E501 (the docstring's Markdown table: a row cannot wrap)

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ..runtime.guards import SILENT_DRAFT_ROUNDS
from ..runtime.metrics import Metrics

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0)
TPOT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """One registry per server (tests run several servers in one process)."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        r, label = self.registry, {"model_name": model_name}

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(f"specdec:{name}", doc, ["model_name", *extra], registry=r)

        self.num_drafts = counter("spec_decode_num_drafts", "Rounds in which a request was given at least one draft.").labels(**label)
        self.num_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified by the target.").labels(**label)
        self.num_accepted_tokens = counter("spec_decode_num_accepted_tokens", "Draft tokens accepted.").labels(**label)
        self._per_pos = counter("spec_decode_num_accepted_tokens_per_pos", "Draft tokens accepted at each position (0-based).", ("position",))
        self.silent_drafts = counter("spec_decode_silent_drafts",
                                     f"Requests whose drafts the target rejected {SILENT_DRAFT_ROUNDS} drafting rounds in a row "
                                     "(a draft that never lands: its token ids may mean something else to the target).").labels(**label)
        self.decision_s = counter("spec_decode_decision_seconds",
                                  "draft_len=auto's decisions: each request's share of its rounds' deciding time.").labels(**label)
        self.compute_s = counter("request_compute_seconds",
                                 "Each request's share of its rounds' target calls, draft steps and decisions.").labels(**label)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of ended requests.").labels(**label)
        self.generation_tokens = counter("generation_tokens", "Tokens generated by ended requests.").labels(**label)
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens of ended requests, looked up in the prefix cache.").labels(**label)
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache (copied, not prefilled).").labels(**label)
        self._success = counter("request_success", "Requests ended, by finish reason.", ("finished_reason",))
        self._errors = counter("request_errors", "Requests ended with finish_reason error, by cause (nonfinite_logits, grammar_failed).", ("code",))
        self.model_label = model_name

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"specdec:{name}", doc, ["model_name"], buckets=buckets, registry=r).labels(**label)

        self.e2e = histogram("e2e_request_latency_seconds", "Arrival at the server to the last token.", LATENCY_BUCKETS)
        self.ttft = histogram("time_to_first_token_seconds", "Arrival at the server to the first token.", TTFT_BUCKETS)
        self.tpot = histogram("request_time_per_output_token_seconds", "Per request: (last token - first token) / (output tokens - 1).", TPOT_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Arrival at the server to getting a cache slot.", LATENCY_BUCKETS)
        self.running = Gauge("specdec:num_requests_running", "Requests holding a cache slot.", ["model_name"], registry=r).labels(**label)
        self.waiting = Gauge("specdec:num_requests_waiting", "Requests queued for a slot.", ["model_name"], registry=r).labels(**label)

    def record(self, m: Metrics, finish_reason: str, prompt_tokens: int, output_tokens: int,
               e2e_s: float, ttft_s: float | None, tpot_s: float | None, queue_s: float | None) -> None:
        """One request ended: add its own figures (the ones its response reports)."""
        self.num_drafts.inc(m.drafting_rounds)
        self.num_draft_tokens.inc(m.drafted)
        self.num_accepted_tokens.inc(m.accepted)
        for pos, n in enumerate(m.accepted_at):
            self._per_pos.labels(model_name=self.model_label, position=str(pos)).inc(n)
        self.silent_drafts.inc(m.silent_drafts)
        self.decision_s.inc(m.decide_s)
        self.compute_s.inc(m.target_s + m.draft_s + m.decide_s)
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(output_tokens)
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(m.cached_tokens)
        self._success.labels(model_name=self.model_label, finished_reason=finish_reason).inc()
        self.e2e.observe(e2e_s)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        if tpot_s is not None:
            self.tpot.observe(tpot_s)
        if queue_s is not None:
            self.queue.observe(queue_s)

    def request_error(self, code: str) -> None:
        """A request ended with finish_reason "error" (its request_success_total{finished_reason="error"} comes with its record)."""
        self._errors.labels(model_name=self.model_label, code=code).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
