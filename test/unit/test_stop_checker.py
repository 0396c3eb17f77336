"""The real StopChecker (engine/stop.py) with the tiny model's tokenizer and eos ids."""

from __future__ import annotations

import os

import pytest

from sglang_pd.engine.request import Req
from sglang_pd.engine.stop import StopChecker
from sglang_pd.models.config import ModelConfig
from sglang_pd.protocol import SamplingParams

PROMPT = [5, 6, 7, 8]


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(tiny_model_dir, "tokenizer.json"))


@pytest.fixture(scope="module")
def eos_ids(tiny_model_dir) -> list[int]:
    ids = list(ModelConfig.from_pretrained(tiny_model_dir).eos_token_ids)
    assert ids  # the tiny model declares eos (config.json + generation_config.json)
    return ids


@pytest.fixture(scope="module")
def checker(tiny_model_dir, eos_ids) -> StopChecker:
    return StopChecker(tiny_model_dir, eos_ids, context_length=4096)


def run(checker: StopChecker, tokens: list[int], prompt: list[int] = PROMPT, **params):
    """Append ``tokens`` one at a time as the engine does; -> (tokens generated, reason) at the
    first finish, or (len(tokens), None) if none."""
    params.setdefault("max_new_tokens", 1000)
    req = Req("r", list(prompt), SamplingParams(**params), arrival=0.0)
    for tid in tokens:
        req.output_ids.append(tid)
        reason = checker.check(req)
        if reason is not None:
            return len(req.output_ids), reason
    return len(tokens), None


def ids(tok, text: str) -> list[int]:
    out = tok.encode(text, add_special_tokens=False).ids
    assert tok.decode(out) == text
    return out


def test_stop_string_spanning_tokens(checker, tok):
    head = ids(tok, "Hello world, the end.")
    stop = ids(tok, " STOP")
    assert len(stop) > 1  # the stop string spans several tokens
    toks = head + stop + ids(tok, " here")
    assert run(checker, toks, stop=["STOP"]) == (len(head) + len(stop), {"type": "stop", "matched": "STOP"})
    # inside one token, and the first of several stop strings that appears
    n_end = len(ids(tok, "Hello world, the end"))
    assert run(checker, toks, stop=["nothing", "end"]) == (n_end, {"type": "stop", "matched": "end"})
    # absent: runs to the end
    assert run(checker, toks, stop=["absent"]) == (len(toks), None)


def test_stop_string_split_multibyte(checker, tok):
    head = ids(tok, "Hello")
    jp = ids(tok, " 日本")
    assert len(jp) > len("日本")  # byte-level pieces: no single token decodes to a character
    n, reason = run(checker, head + jp + ids(tok, " world"), stop=["日本"])
    assert (n, reason) == (len(head) + len(jp), {"type": "stop", "matched": "日本"})
    # a prefix of the stop string is not a match
    assert run(checker, head + jp[:-1], stop=["日本"]) == (len(head) + len(jp) - 1, None)


def test_stop_string_waits_for_min_new_tokens(checker, tok):
    stop = ids(tok, " STOP")
    filler = ids(tok, " the end is not here yet")
    assert len(filler) >= len(" STOP") + 2  # the first STOP has left the checker's window
    toks = stop + filler + stop + ids(tok, " more")
    n_min = len(stop) + len(filler) - 1
    n, reason = run(checker, toks, stop=["STOP"], min_new_tokens=n_min)
    assert n >= n_min  # never before min_new_tokens
    assert (n, reason) == (2 * len(stop) + len(filler), {"type": "stop", "matched": "STOP"})
    # without min_new_tokens the first one stops it
    assert run(checker, toks, stop=["STOP"])[0] == len(stop)


def test_stop_string_just_before_min_new_tokens_does_not_stop_later(checker, tok):
    """A stop string that ended while min_new_tokens was not reached is ignored for good: it
    does not stop the request at the first token past the minimum, even while it is still in
    the checker's window; the next one does."""
    stop = ids(tok, " STOP")
    toks = stop + ids(tok, " a") + stop + ids(tok, " more words here")
    n_min = len(stop) + 1  # reached with " a", the first STOP two tokens back
    n, reason = run(checker, toks, stop=["STOP"], min_new_tokens=n_min)
    assert (n, reason) == (2 * len(stop) + 1, {"type": "stop", "matched": "STOP"})


def test_stop_token_ids(checker, tok):
    toks = ids(tok, "Hello world, the end. More words here")
    target = toks[5]
    assert toks.index(target) == 5
    assert run(checker, toks, stop_token_ids=[target]) == (6, {"type": "stop", "matched": target})
    # min_new_tokens defers it to the next occurrence (none here)
    assert run(checker, toks, stop_token_ids=[target], min_new_tokens=7) == (len(toks), None)
    assert run(checker, toks + [target], stop_token_ids=[target], min_new_tokens=7) == \
        (len(toks) + 1, {"type": "stop", "matched": target})
    # ignore_eos does not disable stop_token_ids
    assert run(checker, toks, stop_token_ids=[target], ignore_eos=True)[0] == 6


def test_eos_and_ignore_eos(checker, tok, eos_ids):
    toks = ids(tok, "Hello world")
    for eos in eos_ids:
        assert eos not in toks
        assert run(checker, toks + [eos] + toks) == (len(toks) + 1, {"type": "stop", "matched": eos})
        assert run(checker, toks + [eos] + toks, ignore_eos=True) == (2 * len(toks) + 1, None)
        # eos before min_new_tokens does not stop; at min it does
        assert run(checker, [eos] + toks, min_new_tokens=2) == (len(toks) + 1, None)
        assert run(checker, toks + [eos], min_new_tokens=len(toks) + 1)[0] == len(toks) + 1


def test_max_new_tokens_and_priority(checker, tok, eos_ids):
    toks = ids(tok, "Hello world, the end. More words here")
    assert run(checker, toks, max_new_tokens=3) == (3, {"type": "length", "length": 3})
    # the last allowed token is eos: that is a stop, not a length finish
    assert run(checker, toks[:2] + [eos_ids[0]], max_new_tokens=3) == \
        (3, {"type": "stop", "matched": eos_ids[0]})
    # ... unless eos is ignored
    assert run(checker, toks[:2] + [eos_ids[0]], max_new_tokens=3, ignore_eos=True) == \
        (3, {"type": "length", "length": 3})


def test_context_length_limit(tiny_model_dir, eos_ids, tok):
    ctx = 12
    checker = StopChecker(tiny_model_dir, eos_ids, context_length=ctx)
    prompt = list(range(10, 19))  # 9 tokens: room for 3 before prompt + output reaches ctx
    toks = ids(tok, "Hello world, the end. More words here")
    assert run(checker, toks, prompt=prompt, max_new_tokens=100) == \
        (ctx - len(prompt), {"type": "length", "length": ctx - len(prompt)})
    # even with ignore_eos and min_new_tokens past it (the KV cannot hold more)
    assert run(checker, toks, prompt=prompt, ignore_eos=True, min_new_tokens=8,
               max_new_tokens=100)[0] == ctx - len(prompt)


def test_without_tokenizer_stop_strings_are_not_checked(eos_ids, tok):
    checker = StopChecker(None, eos_ids, context_length=4096)
    toks = ids(tok, "Hello STOP world")
    assert run(checker, toks, stop=["STOP"]) == (len(toks), None)
    assert run(checker, toks, stop_token_ids=[toks[1]])[0] == 2
    assert run(checker, toks + [eos_ids[0]])[0] == len(toks) + 1
