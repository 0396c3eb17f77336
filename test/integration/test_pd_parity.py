"""PD disaggregation gives the same greedy tokens as colocated serving (issue 3, bar 1).

32 mixed prompts (text and input_ids, 3..900 tokens: many chunks of 64 and many pages of 4) go
through 2 prefill + 1 decode (prefills alternate) and through 1 prefill + 2 decode (decodes
alternate), all at once, the way SGLang's router sends them. The decode server's answer must
equal the colocated server's token for token, streaming through decode must work, and every
server's free pages must come back afterwards.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pd_utils import (
    Prefill,
    async_client,
    load,
    nixl_missing,
    pd_request,
    read_sse,
    start_all,
    stop_all,
    wait_free_pages,
)

# skip before the colocated reference runs (start_all would skip the PD half anyway)
pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(nixl_missing() is not None, reason=f"PD needs NIXL: {nixl_missing()}")]

CORPUS = Path(__file__).resolve().parents[2] / "python" / "sglang_pd" / "tools" / "corpus"
# Lengths around chunk (64) and page (4) boundaries, up to 14 chunks / 225 pages.
ID_LENGTHS = [3, 4, 5, 8, 9, 63, 64, 65, 128, 129, 255, 257, 400, 513, 700, 900]
TEXT_WORDS = [1, 2, 3, 5, 8, 13, 21, 34, 55, 80, 120, 160, 200, 260, 330, 420]
SAMPLING = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


def _bodies() -> list[dict]:
    words = [w for name in ("stories.txt", "technical.txt") for w in (CORPUS / name).read_text().split()]
    bodies = []
    for i, (n_ids, n_words) in enumerate(zip(ID_LENGTHS, TEXT_WORDS)):
        # deterministic, id-spread token sequences (vocab 6144; skip the special ids 0..2)
        ids = [3 + (i * 7919 + j * 104729 + (j * j) % 977) % 6000 for j in range(n_ids)]
        bodies.append({"input_ids": ids, "sampling_params": SAMPLING})
        start = (i * 211) % (len(words) - n_words)
        bodies.append({"text": " ".join(words[start:start + n_words]), "sampling_params": SAMPLING})
    assert len(bodies) == 32
    return bodies


BODIES = _bodies()


async def _gather(coros):
    return await asyncio.gather(*coros)


@pytest.fixture(scope="module")
def reference(colocated_server) -> list[dict]:
    """The colocated server's answers to BODIES (sent all at once, as in PD)."""
    async def run():
        async with async_client() as client:
            url = colocated_server.base_url + "/generate"
            rs = await _gather(client.post(url, json=b) for b in BODIES)
            return [r.json() for r in rs]

    out = asyncio.run(run())
    assert all(len(o["output_ids"]) == 16 for o in out), out
    return out


@pytest.fixture(scope="module")
def pd(tiny_model_dir, tmp_path_factory):
    """2 prefill + 2 decode servers, shared by the module; each test uses a subset."""
    prefills, decodes = start_all(tiny_model_dir, tmp_path_factory.mktemp("pd-logs"), 2, 2)
    try:
        yield prefills, decodes
    finally:
        stop_all(prefills, decodes)


def _initial_pages(urls: list[str]) -> dict[str, int]:
    out = {}
    for url in urls:
        current = load(url)
        assert current["num_free_pages"] == current["num_total_pages"], current
        out[url] = current["num_free_pages"]
    return out


def _run_pd(pairs: list[tuple[Prefill, str]]) -> list:
    async def run():
        async with async_client() as client:
            return await _gather(pd_request(client, p, d, b) for (p, d), b in zip(pairs, BODIES))

    return asyncio.run(run())


def _check(results, reference) -> None:
    for i, (res, ref) in enumerate(zip(results, reference)):
        assert res.decode_status == 200, (i, res.decode_body)
        assert res.prefill_status == 200, (i, res.prefill_body)
        assert res.decode_body["output_ids"] == ref["output_ids"], f"prompt {i} differs"
        if "text" in ref:
            assert res.decode_body["text"] == ref["text"], f"prompt {i} text differs"
        # the prefill's own answer carries the first token only
        assert res.prefill_body["output_ids"] == ref["output_ids"][:1], i
        meta = res.decode_body["meta_info"]
        assert meta["completion_tokens"] == 16 and meta["finish_reason"]["type"] == "length", meta


def test_two_prefills_one_decode_match_colocated(pd, reference) -> None:
    prefills, decodes = pd
    urls = [p.base_url for p in prefills] + [decodes[0].base_url]
    initial = _initial_pages(urls)
    pairs = [(prefills[i % 2], decodes[0].base_url) for i in range(len(BODIES))]
    _check(_run_pd(pairs), reference)
    for url in urls:
        wait_free_pages(url, initial[url])


def test_one_prefill_two_decodes_match_colocated(pd, reference) -> None:
    prefills, decodes = pd
    urls = [prefills[0].base_url] + [d.base_url for d in decodes]
    initial = _initial_pages(urls)
    pairs = [(prefills[0], decodes[i % 2].base_url) for i in range(len(BODIES))]
    _check(_run_pd(pairs), reference)
    for url in urls:
        wait_free_pages(url, initial[url])


@pytest.mark.parametrize("index", [13, 22])  # 129 input ids; 160 words of text
def test_streaming_through_decode(pd, reference, index) -> None:
    prefills, decodes = pd
    urls = [prefills[1].base_url, decodes[1].base_url]
    initial = _initial_pages(urls)
    body = {**BODIES[index], "stream": True}
    ref = reference[index]

    async def run():
        async with async_client() as client:
            return await pd_request(client, prefills[1], decodes[1].base_url, body)

    res = asyncio.run(run())
    assert res.decode_status == 200 and res.prefill_status == 200, (res.decode_body,
                                                                    res.prefill_body)
    events = res.decode_body
    assert len(events) >= 2, events  # it streamed, not one final chunk
    # output_ids are cumulative: the first chunk starts with prefill's first token
    first = events[0]["output_ids"]
    assert first and first == ref["output_ids"][:len(first)], (first, ref["output_ids"])
    assert events[0]["meta_info"]["finish_reason"] is None
    assert events[-1]["output_ids"] == ref["output_ids"]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "length"
    if "text" in ref:
        assert events[-1]["text"] == ref["text"]
    assert res.prefill_body[-1]["output_ids"] == ref["output_ids"][:1]
    for url in urls:
        wait_free_pages(url, initial[url])


def test_sse_error_body_is_not_a_stream(pd) -> None:
    """A PD request without bootstrap fields is refused up front, as an HTTP error."""
    _, decodes = pd

    async def run():
        async with async_client() as client:
            return await read_sse(client, decodes[0].base_url + "/generate",
                                  {"input_ids": [5, 6, 7], "stream": True,
                                   "sampling_params": SAMPLING})

    status, body, _ = asyncio.run(run())
    assert status == 400 and "bootstrap" in str(body), (status, body)
