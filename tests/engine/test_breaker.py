"""The one circuit breaker (vocabulary.breaker) shared by the gateway's state and the KV store's
tiers: closed, open for retry_s after a fault, then one half-open probe whose outcome decides."""

from vocabulary.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_breaker_states() -> None:
    clock = Clock()
    b = Breaker("redis", retry_s=5.0, clock=clock)
    assert b.state == "closed" and b.allow() and not b.down

    b.failure()
    assert b.state == "open" and b.down and not b.allow()
    clock.t += 4.9
    assert not b.allow()  # still inside retry_s

    clock.t += 0.2  # past retry_s: one probe, the others refused while it is out
    assert b.state == "half_open"
    assert b.allow()
    assert not b.allow() and not b.allow()
    b.failure()  # the probe failed: open again for a whole retry_s
    assert b.state == "open" and b.opened == 2 and b.failures == 2
    clock.t += 3.0
    assert not b.allow()

    clock.t += 2.1
    assert b.allow()
    b.success()  # the probe answered: closed, everyone through
    assert b.state == "closed" and b.allow() and b.allow() and not b.down


def test_unanswered_probe_is_given_up() -> None:
    clock = Clock()
    b = Breaker("bucket", retry_s=2.0, clock=clock)
    b.failure()
    clock.t += 2.0
    assert b.allow()  # the probe goes and never reports
    clock.t += 1.0
    assert not b.allow()
    clock.t += 1.0
    assert b.allow()  # a second probe after another retry_s


def test_bad_retry_is_named() -> None:
    import pytest

    with pytest.raises(ValueError, match="retry_s"):
        Breaker("x", retry_s=-1)
