"""Speculative-decoding metrics, defined once (vLLM's definitions).

acceptance rate          = accepted / drafted
per-token acceptance     = accepted / (accepted + rejected): the probability that a draft the
                           target reached is accepted (the alpha of the speedup bound;
                           accepted / drafted also counts drafts after a rejection, never reached)
mean acceptance length   = 1 + accepted / rounds   (tokens per target call)
per-position acceptance  = accepted_at[j] / drafted_at[j]; for a tree, position j is depth j + 1 (the fraction
                           of rounds whose accepted path reached depth j + 1 among those whose tree did)
output tokens/s          = generated tokens / total latency, time to first token included
TTFT                     = first token - arrival (queue time included); queue time = admission - arrival
TPOT                     = (finish - first token) / (output tokens - 1)
cached tokens            = prompt tokens whose K/V came from the prefix cache (OpenAI's
                           usage.prompt_tokens_details.cached_tokens); prefix hit rate = cached / prompt tokens

One ``Metrics`` per request (in each step's outputs) and one per engine
(the sum of its requests: ``merge``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Metrics:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens copied from the prefix cache, not prefilled (runtime/prefix_cache.py)
    output_tokens: int = 0
    rounds: int = 0  # row-rounds: one row verified once by the target (after the context phase)
    drafted: int = 0
    accepted: int = 0
    no_draft_rounds: int = 0  # rounds where a row got no drafts (e.g. no n-gram match)
    rejected: int = 0  # rounds that ended on a rejected draft
    silent_drafts: int = 0  # requests whose drafts the target rejected SILENT_DRAFT_ROUNDS rounds in a row (runtime/guards.py)
    drafted_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)
    total_s: float = 0.0
    draft_s: float = 0.0
    prompt_draft_s: float = 0.0  # of draft_s, the proposers' work on the prompts as requests join (not a round's)
    target_s: float = 0.0
    prompt_target_s: float = 0.0  # of target_s, the prompts' prefill
    decide_s: float = 0.0  # draft_len=auto's decisions (and the batch's draft cap): its share of each round's
    ttft_s: list[float] = field(default_factory=list)  # per request
    queue_s: list[float] = field(default_factory=list)  # per request
    tpot_s: list[float] = field(default_factory=list)  # per request with >= 2 output tokens

    @property
    def drafting_rounds(self) -> int:
        """Rounds that had drafts (vLLM's num_drafts)."""
        return self.rounds - self.no_draft_rounds

    def record_round(self, drafted: int, accepted: int, depth: int | None = None) -> None:
        """One row's verification: ``drafted`` drafts scored, ``accepted`` kept.

        depth: for a tree, how deep it reached (a chain's depth is its length): the per-position
        counts are per depth, so a tree's position j is "a path reached depth j + 1"."""
        depth = drafted if depth is None else depth
        self.rounds += 1
        self.drafted += drafted
        self.accepted += accepted
        if drafted == 0:
            self.no_draft_rounds += 1
        if accepted < depth:
            self.rejected += 1
        while len(self.drafted_at) < depth:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for j in range(depth):
            self.drafted_at[j] += 1
            if j < accepted:
                self.accepted_at[j] += 1

    def merge(self, other: Metrics) -> None:
        """Add ``other``'s counts and per-request figures to these (an engine's total).

        Not the engine times (draft_s, target_s and their prompts' shares): requests share each call, so a sum of their
        shares is the caller's to keep (the engine counts every call once)."""
        for name in ("requests", "prompt_tokens", "cached_tokens", "output_tokens", "rounds", "drafted", "accepted", "no_draft_rounds", "rejected",
                     "silent_drafts"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.drafted_at, other.drafted_at), (self.accepted_at, other.accepted_at)):
            mine.extend([0] * (len(theirs) - len(mine)))
            for j, v in enumerate(theirs):
                mine[j] += v
        self.ttft_s += other.ttft_s
        self.queue_s += other.queue_s
        self.tpot_s += other.tpot_s

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_token_acceptance(self) -> float:
        reached = self.accepted + self.rejected
        return self.accepted / reached if reached else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1.0 + self.accepted / self.rounds if self.rounds else 1.0

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def mean_ttft_s(self) -> float:
        return sum(self.ttft_s) / len(self.ttft_s) if self.ttft_s else 0.0

    @property
    def mean_tpot_s(self) -> float:
        return sum(self.tpot_s) / len(self.tpot_s) if self.tpot_s else 0.0

    @property
    def round_draft_s(self) -> float:
        """The proposers' time in the rounds: draft_s less their passes over the prompts as requests join (EAGLE's and
        Medusa's features of the prompt, a pool's indexing), which a request pays once, not per round. A prompt a
        proposer takes only when the request first drafts is in that round: draft_len=auto's catch-up of a request that
        had not drafted, an EAGLE-family module's prompt of a few pairs (fed with the first draft)."""
        return max(self.draft_s - self.prompt_draft_s, 0.0)

    @property
    def round_target_s(self) -> float:
        """The target's time in the rounds (its verifications): target_s less the prompts' prefill."""
        return max(self.target_s - self.prompt_target_s, 0.0)

    @property
    def other_s(self) -> float:
        """Time in neither engine nor auto's decisions: acceptance, bookkeeping, Python."""
        return max(self.total_s - self.draft_s - self.target_s - self.decide_s, 0.0)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(
            prefix_hit_rate=self.prefix_hit_rate,
            acceptance_rate=self.acceptance_rate,
            per_token_acceptance=self.per_token_acceptance,
            mean_acceptance_length=self.mean_acceptance_length,
            per_position_acceptance=self.per_position_acceptance,
            output_tokens_per_s=self.tokens_per_s,
            mean_ttft_s=self.mean_ttft_s,
            mean_tpot_s=self.mean_tpot_s,
            other_s=self.other_s,
            round_draft_s=self.round_draft_s,
            round_target_s=self.round_target_s,
        )
        return d

    def summary(self) -> str:
        lines = [
            f"requests {self.requests}, output tokens {self.output_tokens}, {self.tokens_per_s:.1f} tokens/s "
            f"(incl. time to first token {self.mean_ttft_s * 1e3:.1f} ms)",
            f"time: total {self.total_s:.3f}s = target {self.target_s:.3f}s + draft {self.draft_s:.3f}s"
            + (f" + deciding drafts {self.decide_s:.3f}s" if self.decide_s else "") + f" + other {self.other_s:.3f}s",
        ]
        if self.cached_tokens:
            lines.append(f"prefix cache: {self.cached_tokens} of {self.prompt_tokens} prompt tokens copied, not prefilled (hit rate "
                         f"{self.prefix_hit_rate:.2f})")
        if self.drafted:
            per_pos = " ".join(f"{a:.2f}" for a in self.per_position_acceptance)
            lines.append(
                f"drafted {self.drafted}, accepted {self.accepted}, acceptance rate {self.acceptance_rate:.3f}, "
                f"mean acceptance length {self.mean_acceptance_length:.2f}, rounds {self.rounds}"
                + (f", no-draft rounds {self.no_draft_rounds}" if self.no_draft_rounds else "")
            )
            lines.append(f"per-position (tree depth) acceptance: {per_pos}")
        return "\n".join(lines)
