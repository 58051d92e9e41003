"""The dial retry loops: within a deadline at start-up, with exponential backoff after a loss."""

from __future__ import annotations

import pytest

from kvtransit.runtime import redial as redial_module
from kvtransit.runtime.redial import dial_within, redial


class FlakyDial:
    """Fails `failures` times (ConnectionRefusedError), then answers "up"."""

    def __init__(self, failures: int):
        self.failures = failures
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionRefusedError(f"refused #{self.calls}")
        return "up"


@pytest.fixture
def sleeps(monkeypatch):
    """Record the backoff waits instead of sleeping them."""
    waited: list[float] = []

    async def fake_sleep(seconds: float) -> None:
        waited.append(seconds)

    monkeypatch.setattr(redial_module.asyncio, "sleep", fake_sleep)
    return waited


async def test_dial_within_retries_at_its_pace_until_the_peer_answers(sleeps):
    dial = FlakyDial(failures=3)
    assert await dial_within(dial, within_s=60, retry_s=0.2, retry_on=OSError, give_up=RuntimeError) == "up"
    assert dial.calls == 4 and sleeps == [0.2, 0.2, 0.2]


async def test_dial_within_gives_up_with_the_callers_error_naming_the_last_failure(sleeps):
    def give_up(exc: BaseException) -> Exception:
        return RuntimeError(f"gave up: {exc}")

    with pytest.raises(RuntimeError, match="gave up: refused #1"):
        await dial_within(FlakyDial(failures=10), within_s=0, retry_s=0.2, retry_on=OSError, give_up=give_up)


async def test_dial_within_does_not_retry_what_it_was_not_told_to():
    async def broken() -> str:
        raise ValueError("not a network failure")

    with pytest.raises(ValueError, match="not a network failure"):
        await dial_within(broken, within_s=60, retry_s=0.2, retry_on=OSError, give_up=RuntimeError)


async def test_redial_doubles_its_wait_up_to_the_cap_and_tells_each_failure(sleeps):
    dial, told = FlakyDial(failures=4), []
    assert await redial(dial, first_s=0.05, max_s=0.3, retry_on=OSError, on_retry=told.append) == "up"
    assert sleeps == [0.05, 0.1, 0.2, 0.3, 0.3]
    assert [str(exc) for exc in told] == ["refused #1", "refused #2", "refused #3", "refused #4"]


async def test_redial_stops_when_no_longer_wanted(sleeps):
    wanted = iter([True, True, False])
    result = await redial(FlakyDial(failures=10), first_s=0.05, max_s=1, retry_on=OSError, on_retry=lambda _: None,
                          wanted=lambda: next(wanted))
    assert result is None and sleeps == [0.05, 0.1]
