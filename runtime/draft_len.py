"""``draft_len=auto``: the draft length that maximises expected tokens per second, each round.

For a request whose drafts survive with per-token probability ``a``, a round
of ``k`` drafts yields ``(1 - a^(k+1)) / (1 - a)`` tokens on average
(Leviathan et al. 2023) and costs ``k * t_draft + t_verify(k + 1)``. Both
costs are measured as the engine runs, per batch size ``n`` (a round of 8
requests verifying 5 tokens each is a different call from one request's):
``t_verify(n, w)``, the target call of ``n`` rows of width ``w`` (not flat on
a CPU, where verifying 9 tokens costs more than verifying 1), and
``t_draft(n)``, one draft step of the method over ``n`` rows. The policy
picks the k in ``0..limit`` with the most tokens per second; k = 0 (no
drafting) wins when drafts do not pay, so auto never loses to target-only
by more than its probes.

``a`` is the request's own acceptance so far, shrunk towards the method's
acceptance over every request (a Beta prior worth ``PRIOR_WEIGHT`` drafts), so
a new request starts from what the method has shown. A request that has
chosen k = 0 for ``PROBE_EVERY`` rounds drafts once more, so a change in the
text (a copy-heavy stretch for n-gram) is noticed.
"""

from __future__ import annotations

import numpy as np

PRIOR_WEIGHT = 8.0  # drafts' worth of the method-wide acceptance in a request's estimate
PROBE_EVERY = 16  # rounds at k = 0 before a probe round
EMA = 0.2  # weight of a new timing


class AutoDraftLen:
    def __init__(self, max_draft_len: int, max_batch: int = 1):
        self.max_draft_len = max_draft_len
        # [rows, width] EMA seconds of a target call of that many rows and tokens per row (0: unmeasured)
        self.verify_s = np.zeros((max_batch + 1, max_draft_len + 2))
        self.draft_s: dict[tuple[str, int], float] = {}  # (method, rows) -> EMA seconds per draft step
        self.accepted: dict[str, float] = {}  # method -> drafts accepted (every request)
        self.reached: dict[str, float] = {}  # method -> drafts the target reached (accepted + first rejections)

    # -- measurements -------------------------------------------------------------------
    def record_verify(self, rows: int, width: int, seconds: float) -> None:
        if rows < self.verify_s.shape[0] and width < self.verify_s.shape[1]:
            old = self.verify_s[rows, width]
            self.verify_s[rows, width] = seconds if old == 0 else (1 - EMA) * old + EMA * seconds

    def record_draft(self, method: str, rows: int, steps: int, seconds: float) -> None:
        if steps > 0:
            per = seconds / steps
            old = self.draft_s.get((method, rows))
            self.draft_s[(method, rows)] = per if old is None else (1 - EMA) * old + EMA * per

    def record_round(self, method: str, drafted: int, accepted: int) -> None:
        if drafted:
            self.accepted[method] = self.accepted.get(method, 0.0) + accepted
            self.reached[method] = self.reached.get(method, 0.0) + accepted + (accepted < drafted)

    # -- the estimate -------------------------------------------------------------------
    def acceptance(self, method: str, accepted: int, rejected: int) -> float:
        """A request's per-token acceptance: its own counts with the method-wide prior."""
        prior = (self.accepted.get(method, 0.0) + 1.0) / (self.reached.get(method, 0.0) + 2.0)
        a = (accepted + PRIOR_WEIGHT * prior) / (accepted + rejected + PRIOR_WEIGHT)
        return float(min(a, 0.999))

    def verify_cost(self, rows: int, width: int) -> float:
        """Seconds of a target call of ``rows`` x ``width`` tokens: measured, else a line through
        what was measured at that batch size, else the nearest batch size measured."""
        measured = np.flatnonzero(self.verify_s.any(axis=1))
        if len(measured) == 0:
            return 1.0 + 0.1 * (width - 1)  # unitless prior until the first call is timed
        rows = int(measured[np.argmin(np.abs(measured - rows))])
        line = self.verify_s[rows]
        if line[width] > 0:
            return float(line[width])
        known = np.flatnonzero(line > 0)
        if len(known) == 1:
            w0 = known[0]
            return float(line[w0] * (1 + 0.1 * (width - w0)))  # assume +10% per token
        slope, intercept = np.polyfit(known, line[known], 1)
        return float(max(intercept + slope * width, line[known].min()))

    def draft_cost(self, method: str, rows: int, default: float) -> float:
        """Seconds of one draft step over ``rows`` requests: measured, else the nearest batch size measured."""
        sizes = [n for m, n in self.draft_s if m == method]
        if not sizes:
            return default
        return self.draft_s[(method, min(sizes, key=lambda n: abs(n - rows)))]

    def choose(self, method: str, accepted: int, rejected: int, limit: int, rows: int = 1) -> int:
        """The k in 0..limit with the most expected tokens per second, in a round of ``rows`` requests."""
        limit = min(limit, self.max_draft_len)
        if limit <= 0:
            return 0
        a = self.acceptance(method, accepted, rejected)
        t1 = self.verify_cost(rows, 1)
        t_draft = self.draft_cost(method, rows, default=0.1 * t1)  # unmeasured: a tenth of a target step
        ks = np.arange(limit + 1)
        tokens = (1 - a ** (ks + 1)) / (1 - a)
        cost = ks * t_draft + np.array([self.verify_cost(rows, int(k) + 1) for k in ks])
        return int(np.argmax(tokens / cost))
