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
        """A stop string that ends in the newest token's text. One that ended earlier does not
        count: it was either matched then, or came before ``min_new_tokens`` (ignored there,
        so it must not stop the request later, at the first token past the minimum)."""
        # a stop string ending in the newest token lies within the last len(stop) + 2 tokens
        # (every token decodes to at least one byte; +2 covers split multibyte characters)
        window = max(len(s.encode()) for s in req.params.stop) + 2
        assert self.tokenizer is not None
        ids = req.output_ids[-window:]
        tail = self.tokenizer.decode(ids, skip_special_tokens=False)
        old: int | None = None  # how much of the tail the text before the newest token fixed
        for s in req.params.stop:
            at = tail.rfind(s)
            if at < 0:
                continue
            if old is None:  # (a split character the newest token completes is not fixed)
                before = self.tokenizer.decode(ids[:-1], skip_special_tokens=False)
                old = len(os.path.commonprefix([before, tail]))  # noqa: RUF071 (text, not paths)
            if at + len(s) > old:
                return s
        return None
