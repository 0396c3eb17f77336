"""Prompt lengths the router classifies by: exact with a tokenizer, estimated without."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers

from sglang_pd_router.classify import BatchNotSupported, LengthEstimator


def test_estimates_without_a_tokenizer() -> None:
    est = LengthEstimator()
    assert not est.exact
    assert est.prompt_len("/generate", {"input_ids": [1, 2, 3]}) == 3
    assert est.prompt_len("/generate", {"text": "x" * 40}) == 10
    assert est.prompt_len("/v1/completions", {"prompt": [5, 6]}) == 2
    assert est.prompt_len("/v1/completions", {"prompt": ["abcdefgh"]}) == 2
    chat = {"messages": [{"role": "user", "content": "abcd"},
                         {"role": "user", "content": [{"type": "text", "text": "abcdefgh"}]}]}
    assert est.prompt_len("/v1/chat/completions", chat) == 3
    assert est.prompt_len("/generate", {}) == 0


@pytest.mark.parametrize("path, body", [
    ("/generate", {"text": ["a", "b"]}),
    ("/generate", {"input_ids": [[1], [2]]}),
    ("/v1/completions", {"prompt": ["a", "b"]}),
])
def test_batches_are_refused(path: str, body: dict) -> None:
    with pytest.raises(BatchNotSupported):
        LengthEstimator().prompt_len(path, body)


def test_exact_with_a_tokenizer(tmp_path) -> None:
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    est = LengthEstimator(str(tmp_path))  # the folder, as --tokenizer-path takes a model dir
    assert est.exact
    assert est.prompt_len("/generate", {"text": "hello world hello"}) == 3
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        LengthEstimator(str(tmp_path / "missing"))
