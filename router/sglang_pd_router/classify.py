"""Prompt length and request class from a request body, for length-aware routing.

With ``--tokenizer-path`` the length is exact (a ``tokenizers`` tokenizer.json, encoded without
special tokens, which the chat template would add a few of); without it, text counts 4 characters
a token, the usual rule of thumb for English BPE vocabularies. ``input_ids`` are always exact.
"""

from __future__ import annotations

import os
from typing import Any

CHARS_PER_TOKEN = 4


class BatchNotSupported(ValueError):
    pass


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

    def prompt_len(self, path: str, body: dict[str, Any]) -> int:
        """Tokens in the request's prompt. Batches (lists of prompts) raise BatchNotSupported:
        each prompt would need its own room and its own pool."""
        if path == "/generate":
            ids = body.get("input_ids")
            if ids is not None:
                if ids and isinstance(ids[0], list):
                    raise BatchNotSupported("batched input_ids")
                return len(ids) if isinstance(ids, list) else 0
            text = body.get("text")
            if isinstance(text, list):
                raise BatchNotSupported("a list of texts")
            return self.count_text(text) if isinstance(text, str) else 0
        if path == "/v1/completions":
            prompt = body.get("prompt")
            if isinstance(prompt, str):
                return self.count_text(prompt)
            if isinstance(prompt, list) and prompt:
                if all(isinstance(t, int) for t in prompt):
                    return len(prompt)
                if len(prompt) == 1 and isinstance(prompt[0], str):
                    return self.count_text(prompt[0])
                raise BatchNotSupported("a list of prompts")
            return 0
        messages = body.get("messages")
        total = 0
        if isinstance(messages, list):
            for m in messages:
                content = m.get("content") if isinstance(m, dict) else None
                if isinstance(content, str):
                    total += self.count_text(content)
                elif isinstance(content, list):  # content parts
                    total += sum(self.count_text(p.get("text", "")) for p in content
                                 if isinstance(p, dict) and isinstance(p.get("text"), str))
        return total
