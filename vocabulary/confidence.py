"""Intervals that stay valid when a sweep is looked at after every edit, and what it would take to
reach a threshold. Pure stdlib.

A sweep's page is read while it runs, and `stop_when_decided` stops it at the first look where the
policy is settled. A fixed-n interval (Wilson's) looked at after each of 200 edits is wrong far more
often than 5% of the time: it is bound to cross any threshold sooner or later. So a sweep uses a
**confidence sequence**: Robbins' beta-binomial mixture martingale with a uniform prior.

For k agreements in n edits, the mixture of likelihood ratios against a true share p is

    M_n(p) = B(k + 1, n - k + 1) / (p^k (1 - p)^(n - k))

which, under p, is a non-negative martingale with mean 1; by Ville's inequality
P(M_n(p) >= 1/alpha for some n) <= alpha. The interval at every n is {p : M_n(p) < 1/alpha}: the true
share lies in all of them at once with probability at least 1 - alpha (0.95), however often and
whenever one looks, so stopping at a look chosen from the data is allowed. The price is width: with
every edit agreeing, its lower bound reaches 0.95 after 158 edits (Wilson's after 73, valid only for a
sweep of fixed size looked at once).
"""

from __future__ import annotations

import math

ALPHA = 0.05
INTERVAL_NAME = "95% confidence sequence"
INTERVAL_WORDS = ("95% confidence sequences (Robbins' beta-binomial mixture, uniform prior): valid "
                  "at every look, so the sweep may stop as soon as its policy is decided")
NEEDED_CAP = 1_000_000  # beyond this many more edits, `needed` says none can


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def confidence_sequence(k: int, n: int, alpha: float = ALPHA) -> tuple[float, float] | None:
    """The (1 - alpha) confidence sequence's interval for a share after k successes in n trials
    (None when n is 0): the p whose mixture martingale stays below 1/alpha."""
    if n <= 0:
        return None
    if not 0 <= k <= n:
        raise ValueError(f"{k} successes in {n} trials")
    # log-likelihood floor: k log p + (n - k) log(1 - p) > log B(k+1, n-k+1) + log(alpha)
    floor = _log_beta(k + 1, n - k + 1) + math.log(alpha)

    def inside(p: float) -> bool:
        if p <= 0.0:
            return k == 0 and floor < 0
        if p >= 1.0:
            return k == n and floor < 0
        return k * math.log(p) + (n - k) * math.log1p(-p) > floor

    centre = k / n  # the likelihood's peak: always inside

    def edge(outside: float, inner: float) -> float:
        if inside(outside):
            return outside
        for _ in range(64):
            mid = (outside + inner) / 2
            if inside(mid):
                inner = mid
            else:
                outside = mid
        return inner

    return edge(0.0, centre), edge(1.0, centre)


def lower_bound(k: int, n: int) -> float:
    """The confidence sequence's lower end (0 when n is 0)."""
    ci = confidence_sequence(k, n)
    return ci[0] if ci else 0.0


def upper_bound(k: int, n: int) -> float:
    """The confidence sequence's upper end (1 when n is 0)."""
    ci = confidence_sequence(k, n)
    return ci[1] if ci else 1.0


def more_needed(shares: list[tuple[int, int]], threshold: float) -> int | None:
    """How many more trials, all successes and each counted in every one of `shares` ((k, n)
    each), lift every lower bound to `threshold`: 0 when they already reach it, None past
    `NEEDED_CAP`. (A changed edit on which a strategy agrees is also a determined edit on which it
    agrees: both shares move together.)"""

    def reaches(m: int) -> bool:
        return all(lower_bound(k + m, n + m) >= threshold for k, n in shares)

    if reaches(0):
        return 0
    low, high = 0, 1
    while not reaches(high):  # the lower bound of k+m of n+m rises with m: search by doubling
        low, high = high, high * 2
        if high > NEEDED_CAP:
            return None
    while high - low > 1:
        mid = (low + high) // 2
        if reaches(mid):
            high = mid
        else:
            low = mid
    return high
