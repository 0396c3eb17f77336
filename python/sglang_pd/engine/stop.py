"""When a request stops: EOS, stop token ids, stop strings, max_new_tokens, context length."""

from __future__ import annotations

import os

from sglang_pd.engine.request import Req


class StopChecker:
    def __init__(self, tokenizer_dir: str | None, eos_ids: list[int], context_length: int) -> None:
        self.eos_ids = frozenset(eos_ids)
        self.context_length = context_length
        self.tokenizer = None
        path = os.path.join(tokenizer_dir, "tokenizer.json") if tokenizer_dir else None
        if path and os.path.exists(path):
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(path)

    def check(self, req: Req) -> dict | None:
        """Finish reason after the newest token was appended, or None to continue."""
        p = req.params
        tok = req.output_ids[-1]
        n = len(req.output_ids)
        if n >= p.min_new_tokens:
            if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos_ids):
                return {"type": "stop", "matched": tok}
            if p.stop and self.tokenizer is not None:
                matched = self._match_stop_string(req)
                if matched is not None:
                    return {"type": "stop", "matched": matched}
        if n >= p.max_new_tokens or req.seq_len >= self.context_length:
            return {"type": "length", "length": n}
        return None

    def _match_stop_string(self, req: Req) -> str | None:
        # a stop string ending in the newest token lies within the last len(stop) + 2 tokens
        # (every token decodes to at least one byte; +2 covers split multibyte characters)
        window = max(len(s.encode()) for s in req.params.stop) + 2
        assert self.tokenizer is not None
        tail = self.tokenizer.decode(req.output_ids[-window:], skip_special_tokens=False)
        for s in req.params.stop:
            if s in tail:
                return s
        return None
