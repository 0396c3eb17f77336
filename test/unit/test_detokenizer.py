"""Incremental detokenizer: exactness, U+FFFD hold-back, stop strings."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from sglang_pd.frontend.detokenizer import (IncrementalDetokenizer, OutputText, stop_holdback,
                                            trim_at_stop)

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = ["Hello world, the quick brown fox. Ünïcödé: naïve café 世界 你好 こんにちは 🙂🚀 ∑≠",
          "def f(x):\n    return x * 2  # numbers 12345"] * 20


@pytest.fixture(scope="module")
def byte_level() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=350, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


@pytest.fixture(scope="module")
def sentencepiece_like() -> Tokenizer:
    """Metaspace + byte fallback, like Llama-2/Mistral tokenizers."""
    tok = Tokenizer(models.BPE(byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="never")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=600, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
        show_progress=False))
    return tok


def _stream(tok: Tokenizer, ids: list[int], skip: bool,
            rng: random.Random) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, skip_special_tokens=skip)
    seen, i = [], 0
    while i < len(ids):
        n = rng.randint(1, 4)  # engines may send several tokens per output batch
        detok.add(ids[i:i + n])
        seen.append(detok.text)
        i += n
    detok.finish()
    return seen, detok.text


@pytest.mark.parametrize("skip", [True, False])
def test_random_ids_final_text_equals_full_decode(byte_level: Tokenizer,
                                                  sentencepiece_like: Tokenizer,
                                                  skip: bool) -> None:
    rng = random.Random(1234)
    for tok in (byte_level, sentencepiece_like):
        vocab = tok.get_vocab_size(with_added_tokens=True)
        for _ in range(150):
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
            _, final = _stream(tok, ids, skip, rng)
            assert final == tok.decode(ids, skip_special_tokens=skip)


def test_byte_level_stream_is_prefix_of_final(byte_level: Tokenizer) -> None:
    rng = random.Random(7)
    vocab = byte_level.get_vocab_size(with_added_tokens=True)
    for _ in range(150):
        ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        seen, final = _stream(byte_level, ids, True, rng)
        for text in seen:
            assert final.startswith(text)


def test_real_text_round_trips_token_by_token(byte_level: Tokenizer,
                                              sentencepiece_like: Tokenizer) -> None:
    text = "Hello 世界 🙂🚀 naïve café ∑≠ done"
    for tok in (byte_level, sentencepiece_like):
        ids = tok.encode(text, add_special_tokens=False).ids
        detok = IncrementalDetokenizer(tok)
        for t in ids:
            detok.add([t])
            assert "\ufffd" not in detok.text  # never a split multibyte character
            assert text.startswith(detok.text.lstrip()) or detok.text == ""
        detok.finish()
        assert detok.text == tok.decode(ids)


def test_multibyte_char_is_held_back_until_complete(byte_level: Tokenizer) -> None:
    # Force byte-by-byte tokens for an emoji: one token per UTF-8 byte.
    alphabet = {b: byte_level.token_to_id(ch) for b, ch in enumerate(_bytes_to_unicode())}
    ids = [alphabet[b] for b in "🙂".encode()]
    assert len(ids) == 4
    detok = IncrementalDetokenizer(byte_level)
    for t in ids[:-1]:
        assert detok.add([t]) == ""
        assert detok.text == ""
    assert detok.add([ids[-1]]) == "🙂"
    assert detok.text == "🙂"


def test_incomplete_tail_is_flushed_at_finish(byte_level: Tokenizer) -> None:
    alphabet = {b: byte_level.token_to_id(ch) for b, ch in enumerate(_bytes_to_unicode())}
    ok_ids = byte_level.encode("ok").ids
    ids = ok_ids + [alphabet["🙂".encode()[0]]]
    detok = IncrementalDetokenizer(byte_level)
    detok.add(ok_ids)
    assert detok.add(ids[len(ok_ids):]) == ""
    assert detok.text == "ok"
    assert detok.finish() == "\ufffd"
    assert detok.text == byte_level.decode(ids)


def test_skip_special_tokens(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("hi<|im_end|>").ids
    assert IncrementalDetokenizer(byte_level, True).add(ids) == "hi"
    assert IncrementalDetokenizer(byte_level, False).add(ids) == "hi<|im_end|>"


def test_stop_holdback() -> None:
    assert stop_holdback("hello wor", ["world"]) == 3
    assert stop_holdback("hello", ["xyz"]) == 0
    assert stop_holdback("abc\n", ["\n\n", "c\nZ"]) == 2
    assert stop_holdback("", ["abc"]) == 0


def test_trim_at_stop() -> None:
    assert trim_at_stop("one two STOP three", "STOP") == "one two "
    assert trim_at_stop("no match", "STOP") == "no match"


def test_output_text_hides_partial_stop_and_trims(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("Hello world, the fox").ids
    out = OutputText(IncrementalDetokenizer(byte_level), stops=[", the"])
    for t in ids[:-2]:
        out.add([t])
        assert ", the" not in out.visible
    out.finish(ids[-2:], ", the")
    assert out.visible == "Hello world"


def test_output_text_no_stop_trim_keeps_stop(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("Hello world").ids
    out = OutputText(IncrementalDetokenizer(byte_level), stops=["world"], no_stop_trim=True)
    out.finish(ids, "world")
    assert out.visible == "Hello world"


def test_output_text_drops_matched_stop_token(byte_level: Tokenizer) -> None:
    ids = byte_level.encode("hi<|im_end|>").ids
    out = OutputText(IncrementalDetokenizer(byte_level, skip_special_tokens=False))
    out.add(ids[:-1])
    out.finish(ids[-1:], ids[-1])
    assert out.visible == "hi"


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, which ByteLevel vocabularies use."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def test_stop_holdback_matches_the_definition_and_stays_linear() -> None:
    """Issue 22 item 5: the hold-back was quadratic in the stop length on every update."""
    import random

    def by_definition(text: str, stops: list[str]) -> int:
        return max((k for s in stops for k in range(1, min(len(s) - 1, len(text)) + 1)
                    if text.endswith(s[:k])), default=0)

    rng = random.Random(0)
    for _ in range(5000):
        text = "".join(rng.choice("ab\0") for _ in range(rng.randint(0, 12)))
        stops = ["".join(rng.choice("ab\0") for _ in range(rng.randint(1, 6))) for _ in range(3)]
        assert stop_holdback(text, stops) == by_definition(text, stops), (text, stops)
