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
from functools import lru_cache
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
    trimmed final text will not contain it. One-shot form of ``StopHoldback``.
    """
    return StopHoldback(stops).feed(text)


@lru_cache(maxsize=1024)  # clients repeat the same few stop strings
def _prefix_function(stop: str) -> tuple[int, ...]:
    """KMP failure table: pi[i] = longest proper prefix of stop[:i+1] that is also its suffix."""
    pi = [0] * len(stop)
    for i in range(1, len(stop)):
        k = pi[i - 1]
        while k and stop[i] != stop[k]:
            k = pi[k - 1]
        pi[i] = k + 1 if stop[i] == stop[k] else k
    return tuple(pi)


class StopHoldback:
    """The stop-string hold-back of a growing text, updated from the new characters only.

    One KMP automaton per stop string tracks the longest prefix of the stop that the text
    ends with. Only the last ``len(stop)`` characters can matter, so an update costs
    O(min(new characters, stop length)) per stop string: never a rescan of the text or of
    the stop strings (that scan ran on the event loop for every streamed update).
    """

    def __init__(self, stops: list[str]) -> None:
        # a one-character stop has no proper prefix to hold back
        self._stops = [s for s in stops if len(s) > 1]
        self._fail = [_prefix_function(s) for s in self._stops]
        self._state = [0] * len(self._stops)
        self.held = 0

    def feed(self, new_text: str) -> int:
        """Append ``new_text``; return how many trailing characters to hold back."""
        if not new_text or not self._stops:
            return self.held
        held = 0
        for j, stop in enumerate(self._stops):
            fail, n, m = self._fail[j], len(stop), self._state[j]
            if len(new_text) >= n:  # the state depends on the last n characters only
                m, chars = 0, new_text[-n:]
            else:
                chars = new_text
            for c in chars:
                if m == n:
                    m = fail[m - 1]
                while m and stop[m] != c:
                    m = fail[m - 1]
                if stop[m] == c:
                    m += 1
            self._state[j] = m
            # a complete stop is the engine's to report; hold back its longest proper prefix
            held = max(held, fail[m - 1] if m == n else m)
        self.held = held
        return held


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
    _holdback: StopHoldback = field(init=False, repr=False)
    _fed: int = field(default=0, init=False, repr=False)  # characters fed to _holdback

    def __post_init__(self) -> None:
        self._holdback = StopHoldback([] if self.no_stop_trim else self.stops)

    def add(self, new_ids: list[int]) -> None:
        self.detok.add(new_ids)
        text = self.detok.text  # only grows until finish()
        hold = self._holdback.feed(text[self._fed:])
        self._fed = len(text)
        self.visible = text[: len(text) - hold] if hold else text

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
