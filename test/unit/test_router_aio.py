"""The router's timeout scope: the Python 3.10 fallback behaves as ``asyncio.timeout`` does
(deadline -> TimeoutError, no effect when the body finishes first, a caller's cancel stays a
cancel), and ``timeout`` is what the router's request and body reads use."""

import asyncio

import pytest

from sglang_pd_router.aio import call_later_timeout, timeout


@pytest.mark.parametrize("scope", [call_later_timeout, timeout])
async def test_the_deadline_raises_timeout_error(scope) -> None:
    never = asyncio.Event()
    with pytest.raises(TimeoutError):
        async with scope(0.01):
            await never.wait()


@pytest.mark.parametrize("scope", [call_later_timeout, timeout])
async def test_a_body_that_finishes_first_is_not_cancelled_later(scope) -> None:
    async with scope(0.05):
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)  # past the deadline: the scope's timer is gone with it
    async with scope(None):  # no deadline at all
        await asyncio.sleep(0)


@pytest.mark.parametrize("scope", [call_later_timeout, timeout])
async def test_a_callers_cancel_stays_a_cancel(scope) -> None:
    entered = asyncio.Event()

    async def body() -> None:
        async with scope(30):
            entered.set()
            await asyncio.Event().wait()

    task = asyncio.create_task(body())
    await asyncio.wait_for(entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
