"""Loaded at start-up by a test server whose PYTHONPATH starts with this folder
(test_hardening_http.py): when BLOCKING_TOKENIZER_DIR is set, tokenizing a text that contains
BLOCK-TOKENIZER touches DIR/started, then blocks until DIR/release exists (60 s at most), so a
test can ask the server something while a tokenization is provably in progress."""

from __future__ import annotations

import os
import time

_DIR = os.environ.get("BLOCKING_TOKENIZER_DIR")
MARKER = "BLOCK-TOKENIZER"

if _DIR:
    from sglang_pd.frontend.tokenizer import TokenizerBundle

    _encode_batch = TokenizerBundle.encode_batch

    def _blocking_encode_batch(self, texts, add_special_tokens=True):  # type: ignore[no-untyped-def]
        if any(MARKER in t for t in texts):
            open(os.path.join(_DIR, "started"), "w").close()
            deadline = time.monotonic() + 60  # a hang guard: the test releases it long before
            while not os.path.exists(os.path.join(_DIR, "release")) and time.monotonic() < deadline:
                time.sleep(0.01)
        return _encode_batch(self, texts, add_special_tokens)

    TokenizerBundle.encode_batch = _blocking_encode_batch  # type: ignore[method-assign]
