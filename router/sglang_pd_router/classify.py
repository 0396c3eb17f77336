"""Prompt length and request class from a request body, for length-aware routing.

With ``--tokenizer-path`` the length is exact (a ``tokenizers`` tokenizer.json, encoded without
special tokens, which the chat template would add a few of); without it, text counts 4 characters
a token, the usual rule of thumb for English BPE vocabularies. ``input_ids`` are always exact.
"""

from __future__ import annotations

import os
from typing import Any

CHARS_PER_TOKEN = 4


class InvalidPrompt(ValueError):
    """The prompt fields have the wrong shape: the client's error (400), never the router's."""


class BatchNotSupported(InvalidPrompt):
    pass


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


class LengthEstimator:
    def __init__(self, tokenizer_path: str | None = None) -> None:
        self.tokenizer = None
        if tokenizer_path:
            from tokenizers import Tokenizer

            path = tokenizer_path
            if os.path.isdir(path):
                path = os.path.join(path, "tokenizer.json")
            if not os.path.isfile(path):
                raise ValueError(f"--tokenizer-path: no tokenizer.json at {tokenizer_path!r}")
            self.tokenizer = Tokenizer.from_file(path)

    @property
    def exact(self) -> bool:
        return self.tokenizer is not None

    def count_text(self, text: str) -> int:
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(text, add_special_tokens=False).ids)
        return max(1, (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN) if text else 0

    def count_texts(self, texts: list[str]) -> int:
        return sum(self.count_text(t) for t in texts)

    def prompt_len(self, path: str, body: dict[str, Any]) -> int:
        """Tokens in the request's prompt (texts counted inline)."""
        ids, texts = prompt_parts(path, body)
        return ids + self.count_texts(texts)


def prompt_parts(path: str, body: dict[str, Any]) -> tuple[int, list[str]]:
    """The prompt as (tokens given as ids, texts still to count); checks the fields' shapes.
    Batches (lists of prompts) raise BatchNotSupported: each prompt would need its own room and
    its own pool; a wrongly shaped prompt raises InvalidPrompt."""
    if path == "/generate":
        ids = body.get("input_ids")
        if ids is not None:
            if isinstance(ids, list) and ids and isinstance(ids[0], list):
                raise BatchNotSupported("batched input_ids")
            if not _is_ids(ids):
                raise InvalidPrompt("'input_ids' must be a list of integer token ids")
            return len(ids), []
        text = body.get("text")
        if isinstance(text, list):
            raise BatchNotSupported("a list of texts")
        if text is not None and not isinstance(text, str):
            raise InvalidPrompt("'text' must be a string")
        return 0, [text] if text else []
    if path == "/v1/completions":
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return 0, [prompt]
        if isinstance(prompt, list) and prompt:
            if _is_ids(prompt):
                return len(prompt), []
            if len(prompt) == 1 and isinstance(prompt[0], str):
                return 0, [prompt[0]]
            if all(isinstance(p, (str, list)) for p in prompt):
                raise BatchNotSupported("a list of prompts")
        if prompt is not None and not (isinstance(prompt, list) and not prompt):
            raise InvalidPrompt("'prompt' must be a string or a list of integer token ids")
        return 0, []
    messages = body.get("messages")
    if messages is not None and not isinstance(messages, list):
        raise InvalidPrompt("'messages' must be a list")
    texts: list[str] = []
    for m in messages or ():
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):  # content parts
            texts.extend(p["text"] for p in content
                         if isinstance(p, dict) and isinstance(p.get("text"), str))
    return 0, texts
