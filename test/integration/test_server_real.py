"""The real server (frontend + engine processes) on the tiny model: OpenAI client use,
concurrency with client aborts and no page leak, bad input, and parity with the offline Engine."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest


def _load(base_url: str) -> dict:
    r = httpx.get(base_url + "/get_load", timeout=10)
    r.raise_for_status()
    body = r.json()
    return body[0] if isinstance(body, list) else body


def test_openai_client_completions_and_chat(colocated_server) -> None:
    # only this test needs the client (the `test` extra); the others speak plain HTTP
    openai = pytest.importorskip("openai", reason="the openai client is not installed "
                                 "(pip install -e '.[test]')")
    client = openai.OpenAI(base_url=colocated_server.base_url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    comp = client.completions.create(model=model, prompt="The river flows", max_tokens=12, temperature=0)
    assert comp.choices[0].text and comp.usage.completion_tokens == 12 and comp.usage.prompt_tokens > 0
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model, prompt="The river flows", max_tokens=12, temperature=0, stream=True) if c.choices)
    assert streamed == comp.choices[0].text  # greedy: stream and non-stream agree
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hello"}],
                                          max_tokens=10, temperature=0)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content is not None
    assert chat.choices[0].finish_reason in ("stop", "length")
    deltas = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=10, temperature=0,
        stream=True) if c.choices]
    assert "".join(deltas) == chat.choices[0].message.content


async def _stream_one(client: httpx.AsyncClient, i: int, abort_after: int | None) -> int:
    body = {"text": f"Request number {i} tells a story about the sea", "stream": True,
            "sampling_params": {"max_new_tokens": 40, "temperature": 0.7, "ignore_eos": True}}
    chunks = 0
    async with client.stream("POST", "/generate", json=body) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            if line.strip() == "data: [DONE]":
                break
            json.loads(line[5:])
            chunks += 1
            if abort_after is not None and chunks >= abort_after:
                return -1  # leaving the context manager closes the connection mid-stream
    return chunks


def test_concurrent_streams_and_client_aborts_leave_no_pages_behind(colocated_server) -> None:
    before = _load(colocated_server.base_url)
    assert before["num_free_pages"] == before["num_total_pages"]

    async def main() -> list[int]:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(base_url=colocated_server.base_url, timeout=120, limits=limits) as c:
            tasks = [_stream_one(c, i, None) for i in range(64)] + [_stream_one(c, 100 + i, 3) for i in range(16)]
            return await asyncio.gather(*tasks)

    results = asyncio.run(main())
    assert all(n >= 1 for n in results[:64]) and results[64:] == [-1] * 16
    # aborts reach the engine asynchronously: wait (bounded) until the engine is idle
    for _ in range(100):
        after = _load(colocated_server.base_url)
        if after["num_running_reqs"] == 0 and after["num_waiting_reqs"] == 0:
            break
        asyncio.run(asyncio.sleep(0.1))
    assert after["num_free_pages"] == before["num_free_pages"]


@pytest.mark.parametrize("body, needle", [
    ({"text": "hi", "sampling_params": {"temperature": -1}}, "temperature"),
    ({"text": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
    ({"text": "hi", "sampling_params": {"max_new_tokens": -2}}, "max_new_tokens"),
    ({"text": ""}, "empty"),
    ({"input_ids": list(range(10, 5000))}, "context"),
])
def test_bad_input_is_400_and_server_stays_healthy(colocated_server, body: dict, needle: str) -> None:
    r = httpx.post(colocated_server.base_url + "/generate", json=body, timeout=30)
    assert r.status_code == 400, r.text
    assert needle in r.text.lower()
    assert httpx.get(colocated_server.base_url + "/health", timeout=10).status_code == 200


def test_malformed_json_is_400(colocated_server) -> None:
    r = httpx.post(colocated_server.base_url + "/generate", content=b"{not json",
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400 and "json" in r.text.lower()


def test_offline_engine_equals_http_server(colocated_server) -> None:
    from sglang_pd import Engine

    prompts = ["The river flows", "Once upon a time in a small town", "Numbers: 1 2 3"]
    params = {"max_new_tokens": 16, "temperature": 0}
    http = [httpx.post(colocated_server.base_url + "/generate",
                       json={"text": p, "sampling_params": params}, timeout=60).json() for p in prompts]
    with Engine(model_path=colocated_server.model_dir, page_size=4, chunked_prefill_size=64,
                max_total_tokens=32768) as engine:
        offline = engine.generate(prompts, params)
    assert [h["output_ids"] for h in http] == [o["output_ids"] for o in offline]
    assert [h["text"] for h in http] == [o["text"] for o in offline]
