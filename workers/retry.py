"""The one backoff formula of every retry loop (message handling, outbox publishing, the agent's
re-run, LLM calls): capped exponential with jitter, so retries of many workers spread out."""

from __future__ import annotations

import random

BASE_S, CAP_S = 0.2, 5.0


def backoff(attempt: int, base_s: float = BASE_S, cap_s: float = CAP_S) -> float:
    """Seconds to wait before retry `attempt` (1, 2, …): base·2^(attempt−1) capped at `cap_s`,
    times a jitter in [0.5, 1) — by default 0.1–0.2 s, 0.2–0.4 s, … up to 2.5–5 s."""
    return min(cap_s, base_s * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)
