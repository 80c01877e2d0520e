"""The one backoff function of the project: restarts, redeliveries, webhook retries."""

from __future__ import annotations

import random

DEFAULT_CAP_MS = 60_000


def compute_backoff(
    attempt: int,
    *,
    base_ms: float,
    cap_ms: float = DEFAULT_CAP_MS,
    jitter: float = 0.1,
    rng: random.Random | None = None,
) -> float:
    """Delay in seconds before retry number ``attempt`` (1-based).

    ``base_ms`` doubles per attempt and is capped at ``cap_ms``; ``jitter`` spreads the
    result by up to that fraction either way so that many failing consumers do not retry
    in lockstep. The result never exceeds the cap.
    """
    if attempt < 1:
        attempt = 1
    exponent = min(attempt - 1, 62)
    delay = min(cap_ms, base_ms * (2**exponent))
    if jitter > 0:
        spread = delay * jitter
        delay += float((rng or random).uniform(-spread, spread))
    return float(max(0.0, min(delay, cap_ms))) / 1000.0
