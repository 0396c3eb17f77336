"""Incremental detokenization and stop-string trimming.

Decoding the whole output again for every new token costs O(n^2) over a request, so we
decode a small window instead: ``ids[prefix_offset:]`` minus the text of
``ids[prefix_offset:read_offset]``. Keeping one already-emitted token in front of the new
ones matters for decoders that treat the first token of a sequence specially (SentencePiece
strips its leading space) -- the difference of the two decodes then equals what a full
decode would add.

Text that ends in U+FFFD is held back: byte-level vocabularies split multibyte characters
over several tokens, and the replacement character only means "incomplete so far".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

REPLACEMENT_CHAR = "\ufffd"


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


@dataclass
class IncrementalDetokenizer:
    """Turns a growing list of token ids into text; ``text`` only ever grows."""

    decoder: Decoder
    skip_special_tokens: bool = True
    ids: list[int] = field(default_factory=list)
    text: str = ""
    prefix_offset: int = 0
    read_offset: int = 0

    def _decode(self, ids: list[int]) -> str:
        return self.decoder.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def add(self, new_ids: list[int]) -> str:
        """Append token ids; return the newly decodable text (possibly "")."""
        if not new_ids:
            return ""
        self.ids.extend(new_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset : self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset :])
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""  # nothing complete yet: keep the window and wait for more tokens
        delta = new_text[len(prefix_text) :]
        self.prefix_offset = self.read_offset
        self.read_offset = len(self.ids)
        self.text += delta
        return delta

    def finish(self) -> str:
        """Flush held-back text; afterwards ``text == decode(ids)`` exactly.

        A full decode once per request is cheap and makes the final text authoritative even
        for decoders where windowed decoding can drift (e.g. a skipped special token in the
        middle of SentencePiece output). Returns the text appended to what was emitted.
        """
        full = self._decode(self.ids)
        delta = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text = full
        self.prefix_offset = self.read_offset = len(self.ids)
        return delta


def stop_holdback(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of ``text`` that could still grow into a stop string.

    While streaming, such a suffix must not be shown yet: if the stop string completes, the
    trimmed final text will not contain it. Linear in the stop strings' lengths (a prefix
    function over ``stop + sep + tail``), since it runs on every streamed update.
    """
    longest = 0
    for stop in stops:
        if len(stop) > 1 and text:
            longest = max(longest, _overlap(stop, text[-(len(stop) - 1):]))
    return longest


def _overlap(stop: str, tail: str) -> int:
    """Longest k such that ``tail`` ends with ``stop[:k]`` (k < len(stop): tail is shorter)."""
    if "\0" in stop:  # the separator must not occur in the pattern: the plain scan then
        return next((k for k in range(len(tail), 0, -1) if tail.endswith(stop[:k])), 0)
    s = stop + "\0" + tail
    pi = [0] * len(s)
    for i in range(1, len(s)):
        k = pi[i - 1]
        while k and s[i] != s[k]:
            k = pi[k - 1]
        if s[i] == s[k]:
            k += 1
        pi[i] = k
    return pi[-1]


def trim_at_stop(text: str, matched: str) -> str:
    """Cut ``text`` just before the first occurrence of the matched stop string.

    The engine stops at the first occurrence, so the first match in the output is it.
    """
    pos = text.find(matched)
    return text if pos < 0 else text[:pos]


@dataclass
class OutputText:
    """Visible text of one request: detokenized, stop-trimmed, partial stops held back."""

    detok: IncrementalDetokenizer
    stops: list[str] = field(default_factory=list)
    no_stop_trim: bool = False
    visible: str = ""
    finished: bool = False

    def add(self, new_ids: list[int]) -> None:
        self.detok.add(new_ids)
        text = self.detok.text
        if self.stops and not self.no_stop_trim:
            hold = stop_holdback(text, self.stops)
            text = text[: len(text) - hold] if hold else text
        self.visible = text

    def finish(self, new_ids: list[int], matched: str | int | None) -> None:
        """Add the last ids and close; ``matched`` is the engine's finish_reason.matched."""
        if (isinstance(matched, int) and not self.no_stop_trim and new_ids
                and new_ids[-1] == matched):
            # The stop token itself is not part of the text (its id stays in output_ids).
            new_ids = new_ids[:-1]
        self.detok.add(new_ids)
        self.detok.finish()
        text = self.detok.text
        if isinstance(matched, str) and matched and not self.no_stop_trim:
            text = trim_at_stop(text, matched)
        self.visible = text
        self.finished = True
