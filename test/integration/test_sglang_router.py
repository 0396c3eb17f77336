"""SGLang's own router (package sglang-router) drives our prefill and decode servers (issue 3,
bar 2): /generate and /v1/completions, streamed and not, give the colocated server's tokens.

The router health-checks the workers, reads their /server_info and /model_info, loads the
tokenizer from the reported model path, and sends each request to a prefill and a decode with
bootstrap_host / bootstrap_port / bootstrap_room added (docs/disaggregation.md, "Running PD").
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

pytest.importorskip("sglang_router", reason="sglang-router is not installed "
                    "(pip install sglang-router; it is in the 'test' extra)")

from pd_utils import (async_client, load, read_sse_events, start_all, start_router, stop_all,
                      wait_free_pages)

pytestmark = pytest.mark.timeout(240)

SAMPLING = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
GENERATE_BODIES = [
    {"text": "The lighthouse keeper counted the ships", "sampling_params": SAMPLING},
    {"input_ids": [3 + (j * 7919) % 6000 for j in range(300)], "sampling_params": SAMPLING},
    {"text": "and the second one is here", "sampling_params": SAMPLING},
]  # no batches: the router (0.3.2) answers 422 to a list of texts in PD mode
COMPLETION = {"prompt": "Once upon a time in a small harbour town", "max_tokens": 12,
              "temperature": 0}


@pytest.fixture(scope="module")
def routed(tiny_model_dir, tmp_path_factory):
    log_dir = tmp_path_factory.mktemp("router-logs")
    prefills, decodes = start_all(tiny_model_dir, log_dir, 1, 1)
    router = None
    try:
        router = start_router(prefills, decodes, log_dir)
        yield router, [p.base_url for p in prefills] + [d.base_url for d in decodes]
    finally:
        if router is not None:
            router.stop()
        stop_all(prefills, decodes)


def _model(base_url: str) -> str:
    return httpx.get(base_url + "/v1/models", timeout=10).json()["data"][0]["id"]


def test_generate_through_router(routed, colocated_server) -> None:
    router, servers = routed
    initial = {url: load(url)["num_total_pages"] for url in servers}

    async def run():
        async with async_client() as client:
            ref_url, url = colocated_server.base_url + "/generate", router.base_url + "/generate"
            ref = await asyncio.gather(*(client.post(ref_url, json=b) for b in GENERATE_BODIES))
            plain = await asyncio.gather(*(client.post(url, json=b) for b in GENERATE_BODIES))
            streamed = await asyncio.gather(*(read_sse_events(client, url, {**b, "stream": True})
                                              for b in GENERATE_BODIES[:2]))
            return ref, plain, streamed

    ref, plain, streamed = asyncio.run(run())
    for i, (r, p) in enumerate(zip(ref, plain)):
        assert r.status_code == 200 and p.status_code == 200, (i, r.text, p.text)
        want, got = r.json(), p.json()
        assert got["output_ids"] == want["output_ids"], i
        assert got.get("text") == want.get("text"), i
        assert got["meta_info"]["completion_tokens"] == SAMPLING["max_new_tokens"]
    for i, events in enumerate(streamed):
        want = ref[i].json()
        assert len(events) >= 2, events
        assert want["output_ids"][:len(events[0]["output_ids"])] == events[0]["output_ids"]
        assert events[-1]["output_ids"] == want["output_ids"], i
        assert events[-1].get("text") == want.get("text"), i
    for url in servers:
        wait_free_pages(url, initial[url])


def test_completions_through_router(routed, colocated_server) -> None:
    router, servers = routed
    initial = {url: load(url)["num_total_pages"] for url in servers}
    body = {**COMPLETION, "model": _model(colocated_server.base_url)}

    async def run():
        async with async_client() as client:
            ref = await client.post(colocated_server.base_url + "/v1/completions", json=body)
            plain = await client.post(router.base_url + "/v1/completions", json=body)
            events = await read_sse_events(client, router.base_url + "/v1/completions",
                                {**body, "stream": True})
            return ref, plain, events

    ref, plain, events = asyncio.run(run())
    assert ref.status_code == 200 and plain.status_code == 200, (ref.text, plain.text)
    want = ref.json()["choices"][0]
    got = plain.json()["choices"][0]
    assert got["text"] == want["text"] and got["finish_reason"] == want["finish_reason"] == "length"
    assert plain.json()["usage"]["completion_tokens"] == COMPLETION["max_tokens"]
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    assert len(events) >= 2 and text == want["text"], events
    for url in servers:
        wait_free_pages(url, initial[url])
