"""Prompts with a known token count.

The native backend sends ``input_ids`` directly, so its counts are exact by construction: random
ids drawn with the seed from ``[low_id, vocab)``, minus every added/special token id.

OpenAI backends need text. We decode random ids, re-encode the text, and repair it (cut the
re-encoded ids at the target and decode again, or append more decoded ids when short) until the
re-encoded count equals the target. This converges in one or two rounds for BPE tokenizers; the
loop is capped, and if the cap is hit the closest text is kept and its real count is recorded, so
``prompt_len`` is always the count the tokenizer gives (exact in practice, within +-1 otherwise).
Counts are without special tokens: a server that adds BOS, or a chat template, adds its own.
Without a tokenizer, text prompts fall back to repeated words and are approximate.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

_REPAIR_ROUNDS = 16  # bound on the encode/repair loop of one text prompt
_FALLBACK_VOCAB = 1000  # ids used when no tokenizer or vocab size is known (safe for any model)


def load_tokenizer(path: str | Path | None):  # -> tokenizers.Tokenizer | None
    """Load ``tokenizer.json`` from a model dir (or the file itself); None if unreadable."""
    if not path:
        return None
    p = Path(path)
    f = p / "tokenizer.json" if p.is_dir() else p
    if not f.is_file():
        return None
    try:
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(f))
    except Exception as e:  # noqa: BLE001 (tokenizers raises plain Exception) a broken file should not stop a load test that may not need it
        logger.warning("could not load tokenizer from %s: %s", f, e)
        return None


def config_vocab_size(model_dir: str | Path | None) -> int | None:
    """``vocab_size`` from the model's config.json, if readable."""
    if not model_dir:
        return None
    f = Path(model_dir) / "config.json"
    try:
        return int(json.loads(f.read_text())["vocab_size"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class PromptFactory:
    """Draws token-id prompts and exact-count text prompts from one seeded generator."""

    def __init__(self, tokenizer=None, vocab_size: int | None = None, seed: int = 1) -> None:
        self.tokenizer = tokenizer
        self.rng = np.random.default_rng(seed)
        special: set[int] = set()
        if tokenizer is not None:
            vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
            # Added tokens are where BOS/EOS/chat markers live; never sample them.
            special = set(tokenizer.get_added_tokens_decoder().keys())
        if not vocab_size:
            vocab_size = _FALLBACK_VOCAB
        self.vocab_size = vocab_size
        # Skip the lowest ids: byte-fallback and control tokens cluster there in most vocabs.
        low = min(100, vocab_size // 10)
        ids = np.arange(low, vocab_size)
        if special:
            ids = ids[~np.isin(ids, np.fromiter(special, dtype=np.int64))]
        self.ids = ids
        self._text_ids: np.ndarray | None = None

    # ---- native backend -------------------------------------------------------------------
    def token_ids(self, n: int) -> list[int]:
        """``n`` random non-special token ids."""
        return self.rng.choice(self.ids, size=n).tolist()

    def block_ids(self, hash_ids: tuple[int, ...], n: int, block: int = 512) -> list[int]:
        """``n`` token ids made of one fixed block per Mooncake hash id (the block drawn from a
        generator seeded by the id alone: equal ids, equal blocks, in any request or run), cut
        at ``n``; random ids past the last block."""
        out: list[int] = []
        for h in hash_ids:
            if len(out) >= n:
                break
            out += np.random.default_rng(h).choice(self.ids, size=block).tolist()
        return out[:n] if len(out) >= n else out + self.token_ids(n - len(out))

    # ---- text backends --------------------------------------------------------------------
    def _clean_ids(self) -> np.ndarray:
        # Ids whose decoded piece is non-blank printable text: byte fragments ("\ufffd") and
        # whitespace runs re-tokenize unpredictably and would make the repair loop slower.
        if self._text_ids is None:
            pieces = self.tokenizer.decode_batch([[int(i)] for i in self.ids])
            keep = [
                i
                for i, s in zip(self.ids, pieces)
                if s.strip() and "\ufffd" not in s and s.isprintable()
            ]
            self._text_ids = np.array(keep if len(keep) >= 16 else self.ids)
        return self._text_ids

    def count(self, text: str) -> int:
        """Token count of ``text`` without special tokens (word count if no tokenizer)."""
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def text(self, n: int) -> tuple[str, int]:
        """A text of ``n`` tokens, and its actual token count (see the module docstring)."""
        if self.tokenizer is None:
            words = self.rng.choice(["hello", "world", "token", "bench", "serve"], size=n)
            return " ".join(words.tolist()), n
        tok = self.tokenizer
        pool = self._clean_ids()
        text = tok.decode(self.rng.choice(pool, size=n).tolist())
        best, best_gap = text, None
        for _ in range(_REPAIR_ROUNDS):
            enc = tok.encode(text, add_special_tokens=False).ids
            gap = len(enc) - n
            if best_gap is None or abs(gap) < abs(best_gap):
                best, best_gap = text, gap
            if gap == 0:
                break
            if gap > 0:
                text = tok.decode(enc[:n])
            else:
                more = tok.decode(self.rng.choice(pool, size=-gap).tolist())
                # Keep a word boundary: decoders that strip the leading space (Metaspace) would
                # otherwise glue the new piece onto the last word.
                sep = "" if (not text or text[-1].isspace() or more[:1].isspace()) else " "
                text = text + sep + more
        return best, n + (best_gap or 0)
