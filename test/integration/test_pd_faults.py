"""PD failure handling (issue 3, bar 3): every fault answers the client with the error that
docs/disaggregation.md's fault table gives, never before its timeout could fire, and the
surviving server gets all its KV pages back. Waits have generous limits, as hang guards only
(a loaded machine may be slow; no test measures how fast an answer came).

One prefill and one decode run with small timeouts (bootstrap and waiting 5 s, heartbeat
0.5 s x 2 failures). Tests that kill a server restart it for whatever runs next.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from pd_utils import (
    FAST_FAULT_ENV,
    Prefill,
    async_client,
    free_port,
    kill_server,
    load,
    new_room,
    pd_request,
    read_sse,
    start_all,
    start_decode,
    start_prefill,
    stop_all,
    wait_free_pages,
    wait_until,
    with_bootstrap,
)
from server_utils import ServerHandle

pytestmark = pytest.mark.timeout(90)

TIMEOUT_S = float(FAST_FAULT_ENV["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"])  # bootstrap = waiting
HEARTBEAT_S = float(FAST_FAULT_ENV["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"]) * int(
    FAST_FAULT_ENV["SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE"])
SLACK_S = 30.0  # a hang guard for waits on pages, not a bar
# The prefill runs 16-token chunks here, so this prompt is 250 chunks, each written to decode as
# it completes: seconds of transfer even on a fast machine, so a fault lands mid-transfer.
PREFILL_FLAGS = ("--chunked-prefill-size", "16")
LONG_PROMPT = [3 + (j * 7919) % 6000 for j in range(4000)]
SAMPLING = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@dataclass
class Cluster:
    model_dir: str
    log_dir: Path
    prefill: Prefill
    decode: ServerHandle
    total_pages: dict[str, int] = field(default_factory=dict)

    def ensure(self) -> None:
        """Restart whichever server a previous test killed; check both start with all pages free."""
        if self.prefill.server.proc.poll() is not None:
            self.prefill = start_prefill(self.model_dir, self.log_dir, *PREFILL_FLAGS,
                                         env=FAST_FAULT_ENV)
        if self.decode.proc.poll() is not None:
            self.decode = start_decode(self.model_dir, self.log_dir, env=FAST_FAULT_ENV)
        for url in (self.prefill.base_url, self.decode.base_url):
            current = load(url)
            assert current["num_free_pages"] == current["num_total_pages"], (url, current)
            self.total_pages[url] = current["num_total_pages"]


@pytest.fixture(scope="module")
def cluster(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("pd-fault-logs")
    prefills, decodes = start_all(tiny_model_dir, log_dir, 1, 1, env=FAST_FAULT_ENV,
                                  prefill_flags=PREFILL_FLAGS)
    c = Cluster(tiny_model_dir, log_dir, prefills[0], decodes[0])
    try:
        yield c
    finally:
        stop_all([c.prefill], [c.decode])


@pytest.fixture
def pd(cluster) -> Cluster:
    cluster.ensure()
    return cluster


def _registered(decode_url: str, total: int) -> bool:
    """Decode allocates a request's pages and sends its Register in the same engine step."""
    return load(decode_url)["num_free_pages"] < total


async def _timed(coro):
    """(result or exception, time it finished)."""
    try:
        result = await coro
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        result = exc
    return result, time.monotonic()


def _assert_error(result, statuses: tuple[int, ...], needle: str) -> None:
    assert isinstance(result, httpx.Response), result
    assert result.status_code in statuses, (result.status_code, result.text)
    assert needle in result.text, result.text


def test_decode_never_registers(pd) -> None:
    """Only the prefill gets the request: it answers 503 after the bootstrap timeout."""
    url = pd.prefill.base_url
    body = with_bootstrap({"input_ids": LONG_PROMPT[:300], "sampling_params": SAMPLING}, pd.prefill)
    t0 = time.monotonic()
    r = httpx.post(url + "/generate", json=body, timeout=TIMEOUT_S * 4)
    elapsed = time.monotonic() - t0
    _assert_error(r, (503,), "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT")
    assert elapsed >= TIMEOUT_S - 0.5, elapsed  # the timeout's answer, not an earlier one
    wait_free_pages(url, pd.total_pages[url], timeout=SLACK_S)
    # The decode half shows up late (say it waited for free pages): refused at once, not acked
    # and left waiting for a request prefill has already dropped.
    r = httpx.post(pd.decode.base_url + "/generate", json=body, timeout=TIMEOUT_S * 4)
    _assert_error(r, (503,), "already closed")  # a wait would end in a timeout's message
    wait_free_pages(pd.decode.base_url, pd.total_pages[pd.decode.base_url], timeout=SLACK_S)


def test_prefill_never_gets_the_request(pd) -> None:
    """Only the decode gets the request (its prefill is alive and idle): the prefill gives up on
    the registered room after the bootstrap timeout and tells decode, which answers an error."""
    p_url, d_url = pd.prefill.base_url, pd.decode.base_url
    body = with_bootstrap({"input_ids": LONG_PROMPT[:300], "sampling_params": SAMPLING}, pd.prefill)
    t0 = time.monotonic()
    r = httpx.post(d_url + "/generate", json=body, timeout=TIMEOUT_S * 4)
    elapsed = time.monotonic() - t0
    _assert_error(r, (502,), "never reached prefill")  # the fault table: 502
    assert elapsed >= TIMEOUT_S - 0.5, elapsed  # prefill gave up at its bootstrap timeout
    wait_free_pages(d_url, pd.total_pages[d_url], timeout=HEARTBEAT_S * 3 + SLACK_S)
    wait_free_pages(p_url, pd.total_pages[p_url], timeout=SLACK_S)


def test_wrong_bootstrap_port_on_decode(pd) -> None:
    """Nothing listens on the bootstrap port decode was given: decode's heartbeats go unanswered,
    the prefill is declared dead and decode answers with an error, pages freed."""
    url = pd.decode.base_url
    body = {"input_ids": LONG_PROMPT[:300], "sampling_params": SAMPLING,
            "bootstrap_host": "127.0.0.1", "bootstrap_port": free_port(),
            "bootstrap_room": new_room()}
    r = httpx.post(url + "/generate", json=body, timeout=TIMEOUT_S * 4)
    # the fault table: heartbeats (1 s) fail before the bootstrap timeout (5 s): 502 "missed"
    _assert_error(r, (502,), "KV transfer failed")
    assert "missed" in r.text and "heartbeats" in r.text, r.text
    wait_free_pages(url, pd.total_pages[url], timeout=SLACK_S)


def test_client_abort_mid_transfer_frees_decode_pages(pd) -> None:
    """The decode's client closes its stream while the KV is in flight: decode tells prefill,
    which stops writing, acks, and fails its own request; both free their pages."""
    p_url, d_url = pd.prefill.base_url, pd.decode.base_url
    body = with_bootstrap({"input_ids": LONG_PROMPT, "sampling_params": SAMPLING, "stream": True},
                          pd.prefill)

    async def run():
        async with async_client(timeout=TIMEOUT_S * 4) as client:
            to_prefill = asyncio.create_task(_timed(client.post(p_url + "/generate", json=body)))
            to_decode = asyncio.create_task(read_sse(client, d_url + "/generate", body))
            await asyncio.to_thread(wait_until, lambda: _registered(d_url, pd.total_pages[d_url]),
                                    TIMEOUT_S, "decode to register")
            to_decode.cancel()  # closes the decode connection, as a client going away does
            with pytest.raises(asyncio.CancelledError):
                await to_decode
            prefill_result, _ = await to_prefill
            return prefill_result

    prefill_result = asyncio.run(run())
    _assert_error(prefill_result, (502,), "decode aborted")
    wait_free_pages(d_url, pd.total_pages[d_url], timeout=HEARTBEAT_S * 3 + SLACK_S)
    wait_free_pages(p_url, pd.total_pages[p_url], timeout=SLACK_S)


def test_kill_decode_mid_transfer(pd) -> None:
    """SIGKILL the decode while prefill is writing a many-chunk prompt into it: prefill sees the
    transfer fail (or the heartbeats stop), answers 502 and frees its pages."""
    p_url, d_url = pd.prefill.base_url, pd.decode.base_url
    body = with_bootstrap({"input_ids": LONG_PROMPT, "sampling_params": SAMPLING}, pd.prefill)

    async def run():
        async with async_client(timeout=TIMEOUT_S * 4) as client:
            to_prefill = asyncio.create_task(_timed(client.post(p_url + "/generate", json=body)))
            to_decode = asyncio.create_task(_timed(client.post(d_url + "/generate", json=body)))
            await asyncio.to_thread(wait_until, lambda: _registered(d_url, pd.total_pages[d_url]),
                                    TIMEOUT_S, "decode to register")
            # let a few chunks go out; the prompt's prefill still has seconds to run
            await asyncio.sleep(0.3)
            assert not to_prefill.done()
            await asyncio.to_thread(kill_server, pd.decode)
            (p_res, _), (d_res, _) = await asyncio.gather(to_prefill, to_decode)
            return p_res, d_res

    prefill_result, decode_result = asyncio.run(run())
    assert isinstance(decode_result, httpx.TransportError), decode_result  # connection closed
    _assert_error(prefill_result, (502,), "KV transfer failed")
    wait_free_pages(p_url, pd.total_pages[p_url], timeout=SLACK_S)


def test_kill_prefill_after_decode_registered(pd) -> None:
    """SIGKILL the prefill once decode has registered: decode's heartbeats fail, it answers 502
    and frees the pages it reserved."""
    p_url, d_url = pd.prefill.base_url, pd.decode.base_url
    body = with_bootstrap({"input_ids": LONG_PROMPT, "sampling_params": SAMPLING}, pd.prefill)

    async def run():
        async with async_client(timeout=TIMEOUT_S * 4) as client:
            to_prefill = asyncio.create_task(_timed(client.post(p_url + "/generate", json=body)))
            to_decode = asyncio.create_task(_timed(client.post(d_url + "/generate", json=body)))
            await asyncio.to_thread(wait_until, lambda: _registered(d_url, pd.total_pages[d_url]),
                                    TIMEOUT_S, "decode to register")
            assert not to_prefill.done()
            await asyncio.to_thread(kill_server, pd.prefill.server)
            (p_res, _), (d_res, _) = await asyncio.gather(to_prefill, to_decode)
            return p_res, d_res

    prefill_result, decode_result = asyncio.run(run())
    assert isinstance(prefill_result, httpx.TransportError), prefill_result
    _assert_error(decode_result, (502,), "missed")  # the fault table: 502 "missed N heartbeats"
    wait_free_pages(d_url, pd.total_pages[d_url], timeout=HEARTBEAT_S * 3 + SLACK_S)


# ---------------------------------------------------------------- issue 22 (hardening)
@pytest.mark.parametrize("host", ["x y", "a/b"])
def test_bad_bootstrap_host_fails_one_request_not_the_decode_server(pd, host: str) -> None:
    """Issue 22 item 1: the ZMQ connect raised inside the engine loop and the decode died."""
    d_url = pd.decode.base_url
    body = with_bootstrap({"input_ids": LONG_PROMPT[:40], "sampling_params": SAMPLING}, pd.prefill,
                          host=host)
    r = httpx.post(d_url + "/generate", json=body, timeout=30)
    assert r.status_code == 400, (r.status_code, r.text)  # the client's mistake (INVALID_REQUEST)
    assert "bootstrap" in r.text.lower() or "prefill" in r.text.lower(), r.text
    assert pd.decode.proc.poll() is None and httpx.get(d_url + "/health", timeout=5).status_code == 200
    wait_free_pages(d_url, pd.total_pages[d_url], timeout=SLACK_S)

    async def normal() -> None:  # the server still serves PD requests
        async with async_client() as client:
            res = await pd_request(client, pd.prefill, d_url,
                                   {"input_ids": LONG_PROMPT[:40], "sampling_params": SAMPLING})
            assert res.decode_status == 200 and len(res.decode_body["output_ids"]) == 8

    asyncio.run(normal())


def test_max_new_tokens_zero_produces_no_token_in_pd(pd) -> None:
    """Issue 22 item 7: both halves answer at once with zero tokens; nothing is transferred."""
    body = {"input_ids": LONG_PROMPT[:40], "sampling_params": {"max_new_tokens": 0}}

    async def run():
        async with async_client() as client:
            return await pd_request(client, pd.prefill, pd.decode.base_url, body)

    res = asyncio.run(run())
    assert res.prefill_status == 200 and res.decode_status == 200, (res.prefill_body, res.decode_body)
    assert res.decode_body["output_ids"] == [] and res.decode_body["meta_info"]["completion_tokens"] == 0
    for url in (pd.prefill.base_url, pd.decode.base_url):  # nothing was reserved or left behind
        wait_free_pages(url, pd.total_pages[url], timeout=SLACK_S)


def test_health_generate_works_on_pd_servers(pd) -> None:
    """Issue 22 item 7: it sent no bootstrap fields and always failed on PD servers; now it
    runs locally (fake bootstrap host), as SGLang's PD servers answer it."""
    for url in (pd.prefill.base_url, pd.decode.base_url):
        r = httpx.get(url + "/health_generate", timeout=30)
        assert r.status_code == 200, (url, r.text)
        wait_free_pages(url, pd.total_pages[url], timeout=SLACK_S)
